"""The OpenAI model clients bound a call: a server that accepts and never answers fails the run within ``timeout``.

The openai package's own default is 600 s per attempt, retried twice: a run waited 30 minutes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from openai import AsyncOpenAI

from chatkeep.core import AgentConfigurationError, ModelError
from chatkeep.core.openai import OpenAIChatClient, OpenAIResponsesClient
from chatkeep.testing.faults import SilentPeer

CLIENTS = [OpenAIChatClient, OpenAIResponsesClient]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
@pytest.mark.parametrize("client_class", CLIENTS)
async def test_a_server_that_never_answers_fails_the_run_within_timeout(client_class: Any, stream: bool) -> None:
    async with (
        SilentPeer() as peer,
        client_class(model="m", base_url=f"http://{peer.address}/v1", timeout=0.5) as client,
    ):
        agent = client.as_agent(name="silent")

        async def run() -> None:
            if stream:
                async for _update in agent.run_stream("hello?"):
                    pass
            else:
                await agent.run("hello?")

        started = time.monotonic()
        with pytest.raises(ModelError) as caught:
            await run()
        took = time.monotonic() - started
    assert took < 4, f"took {took:.1f} s with timeout=0.5"  # not three attempts of it: the bound covers retries
    message = str(caught.value)
    assert "timeout=0.5 s" in message
    assert peer.address in message
    assert f"{client_class.__name__}(timeout=" in message  # how to change it


@pytest.mark.parametrize("client_class", CLIENTS)
def test_defaults_connect_within_5_s_and_wait_120_s_for_an_answer(client_class: Any) -> None:
    client = client_class(model="m", base_url="http://127.0.0.1:9/v1")
    assert (client.connect_timeout, client.timeout) == (5.0, 120.0)
    timeout = client.client.timeout
    assert (timeout.connect, timeout.read) == (5.0, 120.0)
    faster = client_class(model="m", base_url="http://127.0.0.1:9/v1", timeout=30, connect_timeout=2)
    assert (faster.client.timeout.connect, faster.client.timeout.read) == (2.0, 30.0)


@pytest.mark.parametrize("client_class", CLIENTS)
def test_a_timeout_with_a_client_handed_in_or_not_a_positive_number_is_refused(client_class: Any) -> None:
    handed_in = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(AgentConfigurationError, match="client's own timeouts"):
        client_class(model="m", client=handed_in, timeout=10)
    with pytest.raises(AgentConfigurationError, match="above 0"):
        client_class(model="m", base_url="http://127.0.0.1:9/v1", timeout=0)
