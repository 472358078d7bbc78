"""OpenTelemetry spans and metrics of store operations and agent runs, through ``opentelemetry-api`` only.

Nothing here exports anything: without an SDK configured by the application, the API's tracer and meter are
no-ops. A store operation is one ``CLIENT`` span named after the operation (the database semantic conventions:
``db.system.name``, ``db.operation.name``, ``server.address``/``server.port``) and one sample of the
``db.client.operation.duration`` histogram, with ``error.type`` when it failed. Message text, session state and
exception messages are never recorded; tenant and session ids only when ``CHATKEEP_OTEL_CAPTURE_IDS`` is ``true``.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Concatenate, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue
from typing_extensions import ParamSpec

from chatkeep.core._messages import record_size
from chatkeep.core._version import __version__

__all__ = [
    "CAPTURE_IDS_ENV",
    "Attributes",
    "TelemetryTarget",
    "agent_run",
    "note_records",
    "operation",
    "operation_stream",
    "record_retry",
]

#: Set to ``true`` to record tenant and session ids on spans (they may identify people: off by default).
CAPTURE_IDS_ENV = "CHATKEEP_OTEL_CAPTURE_IDS"
# The semantic conventions' recommended buckets for db.client.operation.duration (seconds).
_DURATION_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]

_tracer = trace.get_tracer("chatkeep", __version__)
_meter = metrics.get_meter("chatkeep", __version__)
_duration = _meter.create_histogram(
    "db.client.operation.duration",
    unit="s",
    description="Duration of chatkeep store operations.",
    explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
)
_retries = _meter.create_counter(
    "chatkeep.client.operation.retries",
    unit="{retry}",
    description="Retries a store made within its operations (after a lost connection, a failover, a conflict).",
)

_T = TypeVar("_T")
_Y = TypeVar("_Y")
_S = TypeVar("_S")
_P = ParamSpec("_P")
Attributes = dict[str, AttributeValue]


@dataclass(frozen=True, slots=True)
class TelemetryTarget:
    """What a store's spans and metrics name as its database (``HistoryStore._telemetry_target`` returns it).

    Attributes:
        system: ``db.system.name``: a semantic-conventions value where one exists (``postgresql``, ``mysql``,
            ``mariadb``, ``sqlite``, ``redis``), else the backend's name (``memory``, ``blob``).
        address: ``server.address``: the host name or IP the store connects to (``None``: none, or unknown).
        port: ``server.port``, when ``address`` is known.
    """

    system: str
    address: str | None = None
    port: int | None = None

    def attributes(self, operation: str) -> Attributes:
        """The attributes every span and metric of ``operation`` on this target carries."""
        attributes: Attributes = {"db.system.name": self.system, "db.operation.name": operation}
        if self.address is not None:
            attributes["server.address"] = self.address
            if self.port is not None:
                attributes["server.port"] = self.port
        return attributes


# The store operation in progress in this context, for record_retry and note_records.
_current: ContextVar[_Operation | None] = ContextVar("chatkeep_operation", default=None)


def record_retry(reason: str) -> None:
    """Report that the store operation in progress is retrying (a backend calls it before each retry).

    It adds a ``retry`` event to the operation's span, counts the retry in ``chatkeep.retries`` on the span and
    in the ``chatkeep.client.operation.retries`` counter. Outside a store operation it does nothing.

    Args:
        reason: why, in a few words without ids or data (``"connection lost"``, ``"cluster moved"``).
    """
    current = _current.get()
    if current is None:
        return
    current.retries += 1
    _retries.add(1, current.attributes)
    if current.span.is_recording():
        current.span.add_event("retry", {"chatkeep.retry.reason": reason, "chatkeep.retry.attempt": current.retries})


def note_records(records: Sequence[str]) -> None:
    """Record how many message records the operation in progress writes, and their UTF-8 size."""
    current = _current.get()
    if current is not None and current.span.is_recording():
        current.span.set_attribute("chatkeep.messages.sent", len(records))
        current.span.set_attribute("chatkeep.messages.bytes", sum(map(record_size, records)))


def _capture_ids() -> bool:
    return os.environ.get(CAPTURE_IDS_ENV, "").strip().lower() in ("1", "true", "yes")


def _id_attributes(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Attributes:
    """The tenant and session id of a call's key (or its ``tenant`` argument), for opted-in id capture."""
    key = args[0] if args else kwargs.get("key")
    tenant = getattr(key, "tenant", key if isinstance(key, str) else kwargs.get("tenant"))
    attributes: Attributes = {}
    if isinstance(tenant, str):
        attributes["chatkeep.tenant.id"] = tenant
    session_id = getattr(key, "session_id", None)
    if isinstance(session_id, str):
        attributes["chatkeep.session.id"] = session_id
    return attributes


def _error_type(exc: BaseException) -> str:
    return type(exc).__qualname__


def _target_attributes(store: Any, operation: str) -> Attributes:
    """The store's attributes for ``operation``, asked of the store once and kept on it."""
    cache: dict[str, Attributes] | None = store.__dict__.get("_telemetry_attributes")
    if cache is None:
        cache = store.__dict__["_telemetry_attributes"] = {}
    attributes = cache.get(operation)
    if attributes is None:
        attributes = cache[operation] = store._telemetry_target().attributes(operation)
    return attributes


_CLIENT = trace.SpanKind.CLIENT
# What _Operation.enter hands _Operation.leave: the OpenTelemetry context token (None: nothing attached), ours.
_Tokens = tuple["Token[otel_context.Context] | None", "Token[_Operation | None]"]


class _Operation:
    """One store operation's span and duration sample, begun when made; :meth:`enter` makes it current."""

    __slots__ = ("attributes", "retries", "span", "start")

    def __init__(self, store: Any, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        self.attributes = _target_attributes(store, name)
        self.span = _tracer.start_span(name, kind=_CLIENT, attributes=self.attributes)
        if self.span.is_recording() and _capture_ids():
            self.span.set_attributes(_id_attributes(args, kwargs))
        self.retries = 0
        self.start = time.perf_counter()

    def enter(self) -> _Tokens:
        """Make this operation (and its span) current while its own code runs; pass the result to :meth:`leave`."""
        return _attach(self.span), _current.set(self)

    @staticmethod
    def leave(tokens: _Tokens) -> None:
        otel_token, token = tokens
        _current.reset(token)
        if otel_token is not None:
            otel_context.detach(otel_token)

    def end(self, error: BaseException | None = None, result: Attributes | None = None) -> None:
        attributes = self.attributes
        if error is not None:
            error_type = _error_type(error)
            attributes = {**attributes, "error.type": error_type}
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(trace.StatusCode.ERROR, error_type)
        _duration.record(time.perf_counter() - self.start, attributes)
        if self.span.is_recording():
            if result:
                self.span.set_attributes(result)
            if self.retries:
                self.span.set_attribute("chatkeep.retries", self.retries)
        self.span.end()


def _attach(span: trace.Span) -> Token[otel_context.Context] | None:
    """Make ``span`` current; a no-op span (no SDK configured) is skipped, which halves the cost when off."""
    if not span.get_span_context().is_valid:
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def operation(
    name: str, result: Callable[[Any], Attributes] | None = None
) -> Callable[
    [Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]], Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]
]:
    """Trace a store's public coroutine method as operation ``name``; ``result`` gives attributes of its value."""

    def decorate(
        method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
    ) -> Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]:
        async def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            current = _Operation(self, name, args, kwargs)
            if not current.span.get_span_context().is_valid:
                # No tracer provider (the common case, on every call): nothing to attach or annotate; the
                # duration metric and the retry counter still count, as a meter provider may be set alone.
                token = _current.set(current)
                try:
                    value = await method(self, *args, **kwargs)
                except BaseException as exc:
                    _current.reset(token)
                    current.end(error=exc)
                    raise
                _current.reset(token)
                _duration.record(time.perf_counter() - current.start, current.attributes)
                return value
            tokens = current.enter()
            try:
                value = await method(self, *args, **kwargs)
            except BaseException as exc:
                current.leave(tokens)
                current.end(error=exc)
                raise
            current.leave(tokens)
            current.end(result=result(value) if result is not None and current.span.is_recording() else None)
            return value

        _copy_identity(call, method)
        return call

    return decorate


def operation_stream(
    name: str,
) -> Callable[[Callable[Concatenate[_S, _P], AsyncIterator[_Y]]], Callable[Concatenate[_S, _P], AsyncIterator[_Y]]]:
    """Trace a store's public async-generator method as operation ``name``, from its first step to its last.

    The span is current only while the method runs, never while its caller handles an item; it records how many
    items the caller received in ``db.response.returned_rows``.
    """

    def decorate(
        method: Callable[Concatenate[_S, _P], AsyncIterator[_Y]],
    ) -> Callable[Concatenate[_S, _P], AsyncIterator[_Y]]:
        async def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[_Y]:
            current = _Operation(self, name, args, kwargs)
            returned = 0
            iterator = method(self, *args, **kwargs)
            try:
                while True:
                    tokens = current.enter()
                    try:
                        item = await iterator.__anext__()
                    except StopAsyncIteration:
                        break
                    finally:
                        current.leave(tokens)
                    returned += 1
                    yield item
            except GeneratorExit:  # the caller stopped early: not an error
                await _close(iterator, current)
                current.end(result={"db.response.returned_rows": returned})
                raise
            except BaseException as exc:
                await _close(iterator, current)
                current.end(error=exc, result={"db.response.returned_rows": returned})
                raise
            current.end(result={"db.response.returned_rows": returned})

        _copy_identity(call, method)
        return call

    return decorate


async def _close(iterator: AsyncIterator[Any], current: _Operation) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        tokens = current.enter()
        try:
            await aclose()
        finally:
            current.leave(tokens)


def _copy_identity(wrapper: Any, method: Any) -> None:
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = method.__name__, method.__qualname__, method.__doc__
    wrapper.__module__, wrapper.__wrapped__ = method.__module__, method


def agent_run(
    updates: AsyncIterator[_Y],
    *,
    agent_name: str | None,
    attributes: Attributes,
    ids: Attributes,
    outcome: Callable[[_Y], Attributes | None],
) -> AsyncIterator[_Y]:
    """Trace an agent run (the updates of ``Agent._run``) as a GenAI ``invoke_agent`` span.

    Args:
        updates: the run's updates; the span is current only while the run's own code makes the next one.
        agent_name: ``gen_ai.agent.name`` (it also names the span).
        attributes: the run's request attributes (``gen_ai.*``), known before it starts.
        ids: the session's ids, recorded only when ids are captured (:data:`CAPTURE_IDS_ENV`).
        outcome: the attributes an update adds to the span (the last one's usage and response id), or ``None``.
    """
    return _agent_run(updates, agent_name, attributes, ids, outcome)


async def _agent_run(
    updates: AsyncIterator[_Y],
    agent_name: str | None,
    attributes: Attributes,
    ids: Attributes,
    outcome: Callable[[_Y], Attributes | None],
) -> AsyncIterator[_Y]:
    name = f"invoke_agent {agent_name}" if agent_name else "invoke_agent"
    span = _tracer.start_span(name, kind=trace.SpanKind.INTERNAL, attributes=attributes)
    if span.is_recording() and _capture_ids():
        span.set_attributes(ids)
    try:
        while True:
            token = _attach(span)
            try:
                update = await updates.__anext__()
            except StopAsyncIteration:
                break
            finally:
                if token is not None:
                    otel_context.detach(token)
            if span.is_recording():
                found = outcome(update)
                if found:
                    span.set_attributes(found)
            yield update
    except GeneratorExit:  # the caller stopped early: end the run too, not an error
        aclose = getattr(updates, "aclose", None)
        if aclose is not None:
            await aclose()
        raise
    except BaseException as exc:
        error_type = _error_type(exc)
        span.set_attribute("error.type", error_type)
        span.set_status(trace.StatusCode.ERROR, error_type)
        raise
    finally:
        span.end()
