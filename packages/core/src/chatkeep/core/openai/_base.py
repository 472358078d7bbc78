"""What the OpenAI model clients share: configuration, the ``AsyncOpenAI`` they own, and their error messages."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar
from urllib.parse import urlsplit

import openai
from openai import AsyncOpenAI, Timeout
from typing_extensions import Self

from chatkeep.core._agent import BaseChatClient
from chatkeep.core._errors import AgentConfigurationError, ModelError, redact_url
from chatkeep.core._messages import Content, FunctionCallContent, Message, TextContent, Usage, UsageContent

if TYPE_CHECKING:
    from chatkeep.core._chat import ChatOptions

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "CallSettings",
    "Connection",
    "OpenAIClientBase",
    "OwnedClient",
    "answered",
    "assistant_message",
    "check_timeouts",
    "connect",
    "model_error",
]

T = TypeVar("T")

#: Seconds a connection to the model server may take to open (TCP and TLS).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds the model server may stay silent: for the whole answer of a call (its retries included), and between
#: the chunks of a stream. A call that is not streamed gets nothing until the model is done: long answers of large
#: or reasoning models take a minute or more, so 120 s leaves them room while a server that accepts and never
#: answers fails in 2 minutes instead of the openai package's 10 minutes, three times over (its retries).
DEFAULT_TIMEOUT = 120.0

# The API key sent to a server on this machine when none is configured: local servers (Ollama, vLLM,
# llama.cpp) ignore it, and the openai package refuses to start without one.
_LOCAL_API_KEY = "not-needed"


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Connection(NamedTuple):
    """The ``AsyncOpenAI`` a client uses and the deadlines it was made with (``None``: a handed-in client's own)."""

    client: AsyncOpenAI
    timeout: float | None
    connect_timeout: float | None

    @property
    def described(self) -> str:
        """The deadlines, for messages: `` (connect_timeout=5 s, timeout=120 s)`` (empty for a handed-in client)."""
        if self.timeout is None or self.connect_timeout is None:
            return ""
        return f" (connect_timeout={self.connect_timeout:g} s, timeout={self.timeout:g} s)"


def check_timeouts(name: str, client: AsyncOpenAI | None, timeout: float | None, connect_timeout: float | None) -> None:
    """Refuse timeouts given with a handed-in client, and timeouts that are not a positive number of seconds.

    Raises:
        AgentConfigurationError: naming ``name``, the class refusing them.
    """
    if client is not None and (timeout is not None or connect_timeout is not None):
        raise AgentConfigurationError(
            f"{name}(client=...) uses the client's own timeouts; give them to your AsyncOpenAI "
            "(AsyncOpenAI(timeout=...)), or drop client= to let chatkeep make one"
        )
    for option, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
        if value is not None and not value > 0:
            raise AgentConfigurationError(f"{name}({option}={value!r}): it must be a number of seconds above 0")


def connect(
    name: str,
    base_url: str | None,
    api_key: str | None,
    client: AsyncOpenAI | None,
    timeout: float | None,
    connect_timeout: float | None,
) -> Connection:
    """The ``AsyncOpenAI`` to use: ``client`` as it is, or one made from the arguments and the environment.

    ``base_url`` defaults to ``OPENAI_BASE_URL``; ``api_key`` to ``OPENAI_API_KEY``, and to ``"not-needed"`` for a
    loopback server; the timeouts to :data:`DEFAULT_TIMEOUT` and :data:`DEFAULT_CONNECT_TIMEOUT`.

    Raises:
        AgentConfigurationError: no API key for a server that is not on this machine.
    """
    if client is not None:
        return Connection(client, None, None)
    url = base_url or _env("OPENAI_BASE_URL")
    key = api_key or _env("OPENAI_API_KEY")
    if not key:
        if url is None or not _is_loopback(url):
            raise AgentConfigurationError(
                f"{name} needs an API key: pass api_key='...' or set the OPENAI_API_KEY "
                "environment variable (a server on localhost needs none)"
            )
        key = _LOCAL_API_KEY
    seconds = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    connect_seconds = DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else float(connect_timeout)
    made = AsyncOpenAI(base_url=url, api_key=key, timeout=Timeout(seconds, connect=connect_seconds))
    return Connection(made, seconds, connect_seconds)


async def answered(call: Awaitable[T], timeout: float | None, failed: str, client_name: str) -> T:
    """``call``'s result; a server that does not answer within ``timeout`` seconds, retries included, raises.

    The openai package bounds each attempt and retries a timed-out one twice: without a bound of the whole,
    a server that accepts and never answers would hold the call three times as long.

    Args:
        call: the request.
        timeout: the bound (``None``: none, a handed-in client's own timeouts apply).
        failed: the message's start, naming the API and the server (``"Embeddings call failed: URL"``).
        client_name: the class whose ``timeout=`` raises the bound.

    Raises:
        ModelError: no answer within ``timeout`` (named with its value).
    """
    if timeout is None:
        return await call
    try:
        return await asyncio.wait_for(call, timeout)
    except asyncio.TimeoutError as exc:
        raise ModelError(
            f"{failed} did not answer within timeout={timeout:g} s; check that the server is up and not "
            f"overloaded, or for a slow model raise the bound: {client_name}(timeout=...)"
        ) from exc


class CallSettings(NamedTuple):
    """The settings of one call: the call's :class:`~chatkeep.core.ChatOptions` over the client's defaults.

    Attributes:
        instructions: the instructions to send, if any.
        temperature: the sampling temperature, if any.
        max_tokens: the most tokens the model may write, if set.
        extra_body: the other request fields: the client's default options, overridden by ``options.additional``.
    """

    instructions: str | None
    temperature: float | None
    max_tokens: int | None
    extra_body: dict[str, Any]


class OwnedClient:
    """The life cycle of an object using an ``AsyncOpenAI``: it closes the one it made, never one handed in.

    A subclass sets ``_client``, ``_owns_client`` and ``_closed = False`` in its constructor.
    """

    _client: AsyncOpenAI
    _owns_client: bool
    _closed: bool

    async def close(self) -> None:
        """Close the ``AsyncOpenAI`` this object created (one given with ``client=`` stays open); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class OpenAIClientBase(OwnedClient, BaseChatClient):
    """The base of the OpenAI model clients: configuration, the ``AsyncOpenAI`` they use, and its life cycle.

    A subclass names itself and its API in the class variables below, and passes its constructor's arguments
    to :meth:`__init__`; ``as_agent`` comes from :class:`~chatkeep.core.BaseChatClient`.

    Args:
        model: the model name; defaults to ``OPENAI_MODEL``, then the subclass's own variable (``_model_env``).
        base_url: the API's base URL; defaults to ``OPENAI_BASE_URL``, then OpenAI's.
        api_key: defaults to ``OPENAI_API_KEY``; with neither set and a loopback ``base_url``, ``"not-needed"``.
        client: an ``AsyncOpenAI`` to use as it is; ``base_url``, ``api_key`` and the timeouts are then its
            own, and :meth:`close` leaves it open.
        timeout: seconds the server may stay silent: for a call's whole answer, retries included (then
            :class:`~chatkeep.core.ModelError` names it), and between the chunks of a stream; default
            :data:`DEFAULT_TIMEOUT` (120).
        connect_timeout: seconds a connection may take to open; default :data:`DEFAULT_CONNECT_TIMEOUT` (5).
        default_options: the subclass's ``**default_options``; ``instructions``, ``temperature`` and
            ``max_tokens`` are taken out of it, the rest is sent with every call.

    Raises:
        AgentConfigurationError: no model or no API key is configured, a default option is one the client sets
            itself (``_reserved_options``), a timeout is given with ``client``, or :meth:`_check_config` refuses
            the configuration.
    """

    #: The agent run span's ``gen_ai.provider.name`` (OpenTelemetry GenAI semantic conventions).
    provider_name: ClassVar[str] = "openai"
    # The client's name in messages, e.g. "OpenAIChatClient".
    _client_name: ClassVar[str]
    # The API's name in messages, e.g. "Chat Completions".
    _api_name: ClassVar[str]
    # The environment variable read for the model after OPENAI_MODEL.
    _model_env: ClassVar[str]
    # Request fields the client sets itself, so they cannot be defaults, and where to set them instead.
    _reserved_options: ClassVar[frozenset[str]]
    _reserved_hint: ClassVar[str]

    def __init__(
        self,
        model: str | None,
        *,
        base_url: str | None,
        api_key: str | None,
        client: AsyncOpenAI | None,
        default_options: dict[str, Any],
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        name = self._client_name
        resolved_model = model or _env("OPENAI_MODEL", self._model_env)
        if not resolved_model:
            raise AgentConfigurationError(
                f"{name} needs a model: pass model='...' or set the OPENAI_MODEL environment variable "
                f"({self._model_env} is also read)"
            )
        reserved = sorted(self._reserved_options.intersection(default_options))
        if reserved:
            raise AgentConfigurationError(
                f"{name} sets {', '.join(reserved)} itself, so it cannot be a default option; {self._reserved_hint}"
            )
        check_timeouts(name, client, timeout, connect_timeout)
        self._check_config()
        self.model: str = resolved_model
        self._default_instructions: str | None = default_options.pop("instructions", None)
        self._default_temperature: float | None = default_options.pop("temperature", None)
        self._default_max_tokens: int | None = default_options.pop("max_tokens", None)
        self._default_body: dict[str, Any] = default_options
        self._owns_client = client is None
        connection = connect(name, base_url, api_key, client, timeout, connect_timeout)
        #: Seconds the server may stay silent (``None``: the handed-in client's own timeouts apply).
        self.timeout: float | None = connection.timeout
        #: Seconds a connection may take to open (``None``: the handed-in client's own).
        self.connect_timeout: float | None = connection.connect_timeout
        self._client = connection.client
        self._closed = False

    async def _answered(self, call: Awaitable[T]) -> T:
        """``call``'s result within :attr:`timeout`, retries included (see :func:`answered`)."""
        return await answered(call, self.timeout, f"{self._api_name} call failed: {self._where}", self._client_name)

    @property
    def _timeouts(self) -> str:
        """The client's timeouts, for messages (empty for a handed-in client's own)."""
        return Connection(self._client, self.timeout, self.connect_timeout).described

    def _check_config(self) -> None:
        """Refuse a contradictory configuration (after the model and reserved-option checks); none by default."""

    def __repr__(self) -> str:
        return f"{self._client_name}(model={self.model!r}, base_url={self._where!r})"

    @property
    def _where(self) -> str:
        """The client's base URL with any credentials in it hidden, for messages."""
        return redact_url(str(self._client.base_url))

    @property
    def client(self) -> AsyncOpenAI:
        """The underlying ``openai.AsyncOpenAI``."""
        return self._client

    def _settings(self, options: ChatOptions) -> CallSettings:
        """The call's instructions, sampling settings and extra request fields, falling back on the defaults."""
        return CallSettings(
            instructions=options.instructions if options.instructions is not None else self._default_instructions,
            temperature=options.temperature if options.temperature is not None else self._default_temperature,
            max_tokens=options.max_tokens if options.max_tokens is not None else self._default_max_tokens,
            extra_body={**self._default_body, **options.additional},
        )


def model_error(
    exc: openai.OpenAIError,
    *,
    where: str,
    api_name: str,
    model: str,
    not_found_hint: str,
    bad_request_hint: str,
    extra_hint: str | None = None,
    timeouts: str = "",
) -> ModelError:
    """The :class:`~chatkeep.core.ModelError` for a failed call, with a hint chosen by the kind of failure.

    The hints after ``where`` (``not_found_hint``, ``bad_request_hint``, ``extra_hint``) are written without it:
    each is said as ``f"{where} {hint}"``.

    Args:
        exc: the ``openai`` error the call raised.
        where: the server's base URL, credentials hidden.
        api_name: the API called, e.g. ``"Chat Completions"``.
        model: the model the call asked for.
        not_found_hint: the hint when the server answers 404 (no such model or endpoint).
        bad_request_hint: the hint when the server answers 400.
        extra_hint: a hint the caller chose for this error (e.g. an unknown conversation id); when given, it
            wins over every hint but those for a timeout, a connection failure or a refused key.
        timeouts: the client's timeouts with their values (`` (connect_timeout=5 s, timeout=120 s)``), said
            after a timeout.

    Returns:
        The error to raise, from ``exc``.
    """
    if isinstance(exc, openai.APITimeoutError):
        hint = (
            f"the request to {where} timed out{timeouts}; check that the server is up and not overloaded, or "
            "for a slow model raise timeout="
        )
    elif isinstance(exc, openai.APIConnectionError):
        hint = (
            f"could not connect to {where}; check that the server is running and that base_url "
            "(or OPENAI_BASE_URL) is right"
        )
    elif isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)):
        hint = f"{where} refused the API key; check api_key (or OPENAI_API_KEY)"
    elif extra_hint is not None:
        hint = f"{where} {extra_hint}"
    elif isinstance(exc, openai.NotFoundError):
        hint = f"{where} {not_found_hint}"
    elif isinstance(exc, openai.RateLimitError):
        hint = f"{where} is rate limiting the requests; wait and retry, or raise the account's limits"
    elif isinstance(exc, openai.BadRequestError):
        hint = f"{where} {bad_request_hint}"
    elif isinstance(exc, openai.APIStatusError):
        hint = f"{where} failed with HTTP {exc.status_code}; check the server's logs, base_url and model"
    else:
        hint = f"the call to {where} failed; check base_url, api key and model {model!r}"
    return ModelError(f"{api_name} call failed: {hint} ({type(exc).__name__}: {exc})")


def assistant_message(
    text: str, calls: list[FunctionCallContent], usage: Usage | None, model: str | None = None
) -> Message:
    """The assistant message of a response: its text, then its tool calls, then its usage.

    Args:
        text: the response's text; no text content when empty.
        calls: the tool calls the model made.
        usage: the tokens the call used, if the service said.
        model: the model that answered, as the service named it (kept with the usage: per-model counts).

    Returns:
        The message.
    """
    contents: list[Content] = [TextContent(text=text)] if text else []
    contents.extend(calls)
    if usage is not None:
        # Kept on the message too, so a stored history still says what each model call cost.
        contents.append(UsageContent(usage=usage, model=model or None))
    return Message(role="assistant", contents=contents)
