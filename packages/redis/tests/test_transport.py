"""The retry every transport shares: which failures are sent again, how often, and how long it waits."""

from __future__ import annotations

import pytest
from redis import exceptions as redis_errors

from chatkeep.redis._transport import RETRIES, backoff, retrying


def test_backoff_grows_is_capped_and_jittered() -> None:
    for failures, ceiling in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (10, 0.5)):
        delays = {backoff(failures) for _ in range(200)}
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert len(delays) > 100  # spread: clients cut off together do not come back together


@pytest.mark.parametrize("error", [redis_errors.ConnectionError])
async def test_a_failed_connection_is_retried_then_raised(error: type[Exception]) -> None:
    attempts = 0

    async def send() -> str:
        nonlocal attempts
        attempts += 1
        raise error("lost")

    with pytest.raises(error):
        await retrying(send)
    assert attempts == RETRIES + 1

    async def recovers() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 2:
            raise error("lost")
        return "reply"

    attempts = 0
    assert await retrying(recovers) == "reply"
    assert attempts == 2


@pytest.mark.parametrize(
    "error",
    [
        redis_errors.AuthenticationError,
        redis_errors.ResponseError,
        redis_errors.NoScriptError,
        redis_errors.TimeoutError,  # it took the whole deadline already: a retry would multiply it
    ],
)
async def test_a_refused_password_a_server_error_or_a_timeout_is_not_retried(error: type[Exception]) -> None:
    attempts = 0

    async def send() -> str:
        nonlocal attempts
        attempts += 1
        raise error("no")

    with pytest.raises(error):
        await retrying(send)
    assert attempts == 1
