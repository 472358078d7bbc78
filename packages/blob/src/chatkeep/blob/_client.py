"""The azure-storage-blob client a store talks through: authentication, retries, timeouts, errors, event loops.

The SDK's exponential retry policy retries 5xx answers (Blob Storage throttles with ``503 ServerBusy``),
timeouts and lost connections; :class:`ThrottlingPolicy` makes it retry ``429 Too Many Requests`` too (which
a proxy or gateway in front of the account may send). Every request the store makes is conditional or safe
to repeat, so retries never duplicate a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any, NoReturn

from azure.core.exceptions import AzureError, HttpResponseError, ServiceResponseError
from azure.core.pipeline.transport import AioHttpTransport
from azure.storage.blob.aio import BlobServiceClient, ContainerClient
from azure.storage.blob.aio import ExponentialRetry as _ExponentialRetry

from chatkeep.blob._config import BlobConfig
from chatkeep.core import MissingExtraError, StoreUnavailableError
from chatkeep.core.backend import record_retry, redact_url

__all__ = ["BlobClient", "DeadlineError", "ThrottledError", "error_code", "unavailable"]


class ThrottledError(ServiceResponseError):
    """The service answered 429 Too Many Requests (raised inside the pipeline, so the retry policy retries it)."""


class DeadlineError(ServiceResponseError):
    """A request (its retries included) got no answer within ``connect_timeout`` or ``read_timeout``.

    Attributes:
        option: the option whose bound passed (``connect_timeout`` or ``read_timeout``).
        seconds: its value.
    """

    def __init__(self, option: str, seconds: float) -> None:
        super().__init__(f"no answer within {option}={seconds:g} s")
        self.option = option
        self.seconds = seconds


class ThrottlingTransport(AioHttpTransport):  # type: ignore[misc]
    """The SDK's aiohttp transport, raising a retryable error for a 429 answer.

    The storage retry policy retries only 408 and 5xx by status; an error raised here, under it, is retried
    like a lost connection (with the same backoff).
    """

    async def send(self, request: Any, **config: Any) -> Any:
        response = await super().send(request, **config)
        if response.status_code == 429:
            with contextlib.suppress(Exception):
                await response.read()
            await response.close()
            raise ThrottledError("the service answered 429 Too Many Requests (throttled)")
        return response


class Backoff(_ExponentialRetry):
    """Exponential retry from ``initial`` seconds, doubling, with ±25% jitter (the SDK's adds whole seconds).

    It also bounds each request, its retries included: until the service first answered, by ``connect_timeout``
    (a peer that accepts and never answers fails within it, instead of read timeouts times retries: 126 s with
    the SDK's defaults); after, by ``read_timeout``. The SDK's timeouts bound each attempt only.
    """

    def __init__(self, initial: float, retries: int, *, connect_timeout: float, read_timeout: float) -> None:
        super().__init__(initial_backoff=0, increment_base=2, retry_total=retries, random_jitter_range=0)
        self.initial = initial
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.answered = False  # the service has answered a request of this client

    async def send(self, request: Any) -> Any:  # type: ignore[override]  # the SDK types its async policy as sync
        """Send with the SDK's retries, within the bound that applies (see the class)."""
        option, seconds = (
            ("read_timeout", self.read_timeout) if self.answered else ("connect_timeout", self.connect_timeout)
        )
        try:
            response = await asyncio.wait_for(super().send(request), seconds)  # type: ignore[no-untyped-call]
        except asyncio.TimeoutError as exc:
            raise DeadlineError(option, seconds) from exc
        self.answered = True
        return response

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        backoff = self.initial * 2 ** max(settings["count"] - 1, 0)
        return float(backoff * random.uniform(0.75, 1.25))

    async def sleep(self, settings: dict[str, Any], transport: Any) -> None:
        """Wait before the next attempt (the SDK calls it before each retry), and report the retry."""
        record_retry(_retry_reason(settings))
        await super().sleep(settings, transport)  # type: ignore[no-untyped-call]


def _retry_reason(settings: dict[str, Any]) -> str:
    """Why the SDK retries: what the last attempt (in the retry settings' history) met."""
    history = settings.get("history") or [None]
    error = getattr(history[-1], "error", None)
    status = getattr(getattr(history[-1], "http_response", None), "status_code", None)
    if isinstance(error, ThrottledError) or status in (429, 503):
        return "throttled"
    if status is not None:
        return "server error"
    return "connection failed"


def error_code(exc: BaseException) -> str:
    """The storage error code of an SDK error (``"BlobNotFound"``...), or ``""``."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


class BlobClient:
    """One store's service and container clients, made on first use and dropped when the event loop changes."""

    def __init__(self, config: BlobConfig) -> None:
        self.config = config
        self._service: BlobServiceClient | None = None
        self._container: ContainerClient | None = None
        self._transport: AioHttpTransport | None = None
        self._credential: Any = None  # a DefaultAzureCredential we made (closed with the client)

    def container(self) -> ContainerClient:
        if self._container is None:
            self._service = self._new_service()
            self._container = self._service.get_container_client(self.config.container)
        return self._container

    def _new_service(self) -> BlobServiceClient:
        config = self.config
        self._transport = ThrottlingTransport(
            connection_timeout=config.settings.connect_timeout, read_timeout=config.settings.read_timeout
        )
        common: dict[str, Any] = {
            "transport": self._transport,
            "retry_policy": Backoff(
                config.settings.retry_backoff,
                config.settings.retries,
                connect_timeout=config.settings.connect_timeout,
                read_timeout=config.settings.read_timeout,
            ),
            "connection_timeout": config.settings.connect_timeout,
            "read_timeout": config.settings.read_timeout,
            # One request per append or read: never split a body into several requests.
            "max_single_put_size": 256 * 1024 * 1024,
            "max_single_get_size": 256 * 1024 * 1024,
        }
        credentials = config.credentials
        if credentials.connection_string is not None:
            return BlobServiceClient.from_connection_string(credentials.connection_string, **common)
        credential: Any = credentials.sas_token or credentials.credential
        if credential is None:
            credential = self._credential = _default_credential()
        return BlobServiceClient(credentials.account_url or "", credential=credential, **common)

    async def aclose(self) -> None:
        service, self._service, self._container = self._service, None, None
        credential, self._credential = self._credential, None
        self._transport = None
        if service is not None:
            with contextlib.suppress(Exception):
                await service.close()
        if credential is not None:
            with contextlib.suppress(Exception):
                await credential.close()

    def abandon(self) -> None:
        """Forget clients whose event loop is closed, releasing their sockets without that loop."""
        transport, self._transport = self._transport, None
        self._service = self._container = None
        self._credential = None
        session = getattr(transport, "session", None)
        connector = getattr(session, "connector", None)
        if connector is None:
            return
        for conns in list(getattr(connector, "_conns", {}).values()):
            for entry in conns:
                sock_transport = getattr(entry[0], "transport", None)
                if sock_transport is not None:
                    # close() would schedule the rest on the closed loop: release the socket directly.
                    with contextlib.suppress(Exception):
                        sock_transport._call_connection_lost(None)
        with contextlib.suppress(Exception):
            connector._conns.clear()
            connector._closed = True
        with contextlib.suppress(Exception):
            session._connector = None  # type: ignore[union-attr]


def _default_credential() -> Any:
    try:
        from azure.identity.aio import DefaultAzureCredential
    except ImportError:
        raise MissingExtraError(
            "an account_url without sas_token= or credential= uses DefaultAzureCredential, which needs "
            'azure-identity: pip install "chatkeep-blob[identity]" (or give sas_token= or credential=)'
        ) from None
    return DefaultAzureCredential()


def unavailable(config: BlobConfig, exc: BaseException) -> NoReturn:
    """Raise :class:`StoreUnavailableError` for a driver error, naming the container and what to check."""
    status = getattr(exc, "status_code", None)
    if isinstance(exc, ThrottledError) or status in (429, 503) or error_code(exc) == "ServerBusy":
        hint = (
            f"the service is throttling (HTTP {status or 429}) and still was after {config.settings.retries} "
            "retries with backoff; spread the load, raise retries=/retry_backoff=, or use more accounts"
        )
    elif isinstance(exc, DeadlineError):
        if exc.option == "connect_timeout":
            cause = "check that the endpoint (account URL or connection string) is the service's and not stuck"
        else:
            cause = "the service is stuck, overloaded or unreachable: check its status"
        example = max(15, round(exc.seconds * 3))
        hint = f"{cause}; if it is known to be slow, raise {exc.option} (e.g. ?{exc.option}={example})"
    elif status in (401, 403):
        hint = (
            "the account refused the credentials: check the connection string, the SAS token's permissions "
            "and expiry, or the identity's role"
        )
    elif isinstance(exc, HttpResponseError) and status is not None:
        hint = f"the service answered HTTP {status} {error_code(exc)}; check its status and this store's options"
    else:
        hint = "check that the service is running and reachable (the account URL or connection string's endpoint)"
    detail = redact_url(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    raise StoreUnavailableError(
        f"Azure Blob Storage failed for {config.where} ({config.shown_url}): {detail}; {hint}"
    ) from exc


@contextlib.contextmanager
def driver_errors(config: BlobConfig) -> Iterator[None]:
    """Turn the SDK's and the transport's errors into :class:`StoreUnavailableError`."""
    try:
        yield
    except (AzureError, OSError, TimeoutError) as exc:
        unavailable(config, exc)
