"""OpenTelemetry: the spans and metrics of store operations and agent runs, read back through the SDK in memory."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from chatkeep.core import (
    Agent,
    AgentSession,
    HistoryStore,
    InvalidArgumentError,
    Message,
    SessionKey,
    StoreClosedError,
    open_store,
)
from chatkeep.core.backend import TelemetryTarget, record_retry
from chatkeep.core.openai import OpenAIChatClient
from chatkeep.testing.openai_server import FakeOpenAIServer
from chatkeep.testing.telemetry import Telemetry


@pytest.fixture
async def store() -> AsyncIterator[HistoryStore]:
    async with open_store(f"memory://telemetry-{uuid.uuid4().hex}") as opened:
        yield opened


SECRET = "the launch code is 0000"


async def test_every_public_operation_is_a_client_span_with_the_database_conventions(
    telemetry: Telemetry, store: HistoryStore
) -> None:
    key = SessionKey("acme", f"s-{uuid.uuid4().hex}")
    await store.append(key, [Message(role="user", text=SECRET), Message(role="assistant", text="ok")])
    await store.load(key)
    assert [m.text async for m in store.iter_messages(key, batch=1)] == [SECRET, "ok"]
    await store.count(key)
    await store.save_session(key, AgentSession(session_id=key.session_id, tenant="acme", state={"pin": SECRET}))
    await store.load_session(key)
    await store.list_sessions("acme")
    await store.session_info(key)
    await store.pop(key)
    await store.trim(key, 0)
    await store.delete(key)
    await store.prune(older_than=timedelta(days=1), tenant="acme")
    await store.list_tenants()
    await store.delete_tenant("acme")

    operations = [
        "append", "load", "iter_messages", "count", "save_session", "load_session",
        "list_sessions", "session_info", "pop", "trim", "delete", "prune", "list_tenants", "delete_tenant",
    ]  # fmt: skip
    spans = [span for span in telemetry.spans() if span.parent is None]
    assert [span.name for span in spans] == operations
    for span in spans:
        assert span.kind is trace.SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["db.system.name"] == "memory"
        assert span.attributes["db.operation.name"] == span.name
        assert "error.type" not in span.attributes
    append = _attributes(telemetry.span("append"))
    assert append["chatkeep.messages.sent"] == 2
    assert append["chatkeep.messages.new"] == 2
    assert append["chatkeep.messages.bytes"] > len(SECRET)
    assert telemetry.span("load").attributes == {**_base("load"), "db.response.returned_rows": 2}
    assert telemetry.span("iter_messages").attributes == {**_base("iter_messages"), "db.response.returned_rows": 2}
    assert telemetry.span("pop").attributes == {**_base("pop"), "db.response.returned_rows": 1}
    assert telemetry.span("trim").attributes == {**_base("trim"), "chatkeep.messages.deleted": 1}
    assert telemetry.span("list_sessions").attributes == {**_base("list_sessions"), "db.response.returned_rows": 1}
    assert telemetry.span("session_info").attributes == {**_base("session_info"), "db.response.returned_rows": 1}

    durations = telemetry.points("db.client.operation.duration")
    assert sorted(p.attributes["db.operation.name"] for p in durations) == sorted(operations)
    assert all(p.count == 1 and p.sum > 0 and "error.type" not in p.attributes for p in durations)
    # Message text and session state never leave the process; nor do ids, unless asked for.
    exported = telemetry.exported_text()
    assert SECRET not in exported
    assert key.session_id not in exported
    assert "acme" not in exported


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _base(operation: str) -> dict[str, Any]:
    return {"db.system.name": "memory", "db.operation.name": operation}


async def test_a_failed_operation_records_its_error_class_on_the_span_and_the_duration(
    telemetry: Telemetry, store: HistoryStore
) -> None:
    key = SessionKey("acme", "s1")
    with pytest.raises(InvalidArgumentError):
        await store.load(key, last=-1)
    await store.close()
    with pytest.raises(StoreClosedError):
        await store.append(key, [Message(role="user", text=SECRET)])

    load, append = telemetry.spans()
    assert _attributes(load)["error.type"] == "InvalidArgumentError"
    assert load.status.status_code is trace.StatusCode.ERROR
    assert _attributes(append)["error.type"] == "StoreClosedError"
    # Only the class: an error's message may quote ids or data.
    assert load.status.description == "InvalidArgumentError"
    assert not load.events
    errors = {p.attributes["db.operation.name"]: p.attributes["error.type"] for p in telemetry.points(_DURATION)}
    assert errors == {"load": "InvalidArgumentError", "append": "StoreClosedError"}
    assert SECRET not in telemetry.exported_text()


_DURATION = "db.client.operation.duration"


async def test_ids_are_recorded_only_when_the_application_opts_in(
    telemetry: Telemetry, store: HistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = SessionKey("acme", "s1")
    monkeypatch.setenv("CHATKEEP_OTEL_CAPTURE_IDS", "true")
    await store.count(key)
    await store.list_sessions("acme")

    assert telemetry.span("count").attributes == {
        **_base("count"),
        "chatkeep.tenant.id": "acme",
        "chatkeep.session.id": "s1",
    }
    assert telemetry.span("list_sessions").attributes == {
        **_base("list_sessions"),
        "chatkeep.tenant.id": "acme",
        "db.response.returned_rows": 0,
    }
    # Metrics never carry ids: each would be a time series of its own.
    assert all("chatkeep.tenant.id" not in p.attributes for p in telemetry.points(_DURATION))


def test_the_sync_view_traces_the_calls_it_makes(telemetry: Telemetry) -> None:
    with open_store(f"memory://telemetry-{uuid.uuid4().hex}").sync() as view:
        key = SessionKey("acme", "s1")
        view.append(key, [Message(role="user", text=SECRET)])
        assert [m.text for m in view.iter_messages(key)] == [SECRET]

    assert [span.name for span in telemetry.spans()] == ["append", "iter_messages"]
    assert SECRET not in telemetry.exported_text()


async def test_an_iteration_stopped_early_ends_its_span_without_an_error(
    telemetry: Telemetry, store: HistoryStore
) -> None:
    key = SessionKey("acme", "s1")
    await store.append(key, [Message(role="user", text=str(n)) for n in range(5)])
    messages = store.iter_messages(key, batch=2)
    async for _ in messages:
        break
    await messages.aclose()  # type: ignore[attr-defined]

    span = telemetry.span("iter_messages")
    assert _attributes(span)["db.response.returned_rows"] == 1
    assert "error.type" not in _attributes(span)
    assert span.status.status_code is trace.StatusCode.UNSET


class _RetryingStore(HistoryStore):
    """A store wrapping the memory backend whose appends report one retry, as a backend's reconnect would."""

    def __init__(self, inner: HistoryStore) -> None:
        super().__init__()
        self.inner = inner

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        record_retry("connection lost")
        return await self.inner.append(key, messages)

    def _telemetry_target(self) -> TelemetryTarget:
        return TelemetryTarget("retrying", "db.example", 6380)

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        raise NotImplementedError

    def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        raise NotImplementedError

    async def _count(self, key: SessionKey) -> int:
        raise NotImplementedError

    async def _delete(self, key: SessionKey) -> bool:
        raise NotImplementedError

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        raise NotImplementedError

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> Any:
        raise NotImplementedError

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | None, owner: str | None
    ) -> str:
        raise NotImplementedError

    async def _load_session(self, key: SessionKey) -> Any:
        raise NotImplementedError


async def test_a_backend_reports_retries_on_the_span_and_in_the_retries_counter(
    telemetry: Telemetry, store: HistoryStore
) -> None:
    retrying = _RetryingStore(store)
    await retrying.append(SessionKey("acme", "s1"), [Message(role="user", text=SECRET)])
    record_retry("outside any operation")  # does nothing

    outer = next(span for span in telemetry.spans() if span.parent is None)
    assert _attributes(outer)["chatkeep.retries"] == 1
    assert _attributes(outer)["server.address"] == "db.example"
    assert _attributes(outer)["server.port"] == 6380
    [event] = outer.events
    assert event.name == "retry"
    assert event.attributes == {"chatkeep.retry.reason": "connection lost", "chatkeep.retry.attempt": 1}
    # The inner store's span is the retrying store's child: spans nest as calls do.
    assert telemetry.children(outer) == ["append"]
    [retries] = telemetry.points("chatkeep.client.operation.retries")
    assert retries.value == 1
    assert dict(retries.attributes) == {
        "db.system.name": "retrying",
        "db.operation.name": "append",
        "server.address": "db.example",
        "server.port": 6380,
    }


async def test_an_agent_run_is_an_invoke_agent_span_over_its_store_calls(
    telemetry: Telemetry, store: HistoryStore, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text(f"noted: {SECRET}", usage=(12, 3))
    async with OpenAIChatClient("fake-model", base_url=fake_openai.base_url, api_key="k") as client:
        agent = Agent(client, name="Helper", history=store)
        session = agent.create_session(tenant="acme")
        response = await agent.run(SECRET, session=session)
    assert SECRET in response.text

    run = telemetry.span("invoke_agent Helper")
    assert run.kind is trace.SpanKind.INTERNAL
    assert run.attributes == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "Helper",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "fake-model",
        "gen_ai.response.id": response.response_id,
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
        "chatkeep.messages.produced": 1,
    }
    assert telemetry.children(run) == ["load", "append"]
    exported = telemetry.exported_text()
    assert SECRET not in exported
    assert session.session_id not in exported


async def test_a_failed_agent_run_records_its_error_class(telemetry: Telemetry, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.fail(401, message=f"bad key for {SECRET}", times=None)
    async with OpenAIChatClient("fake-model", base_url=fake_openai.base_url, api_key="k") as client:
        with pytest.raises(Exception) as raised:
            await Agent(client).run(SECRET)

    run = telemetry.span("invoke_agent")
    assert _attributes(run)["error.type"] == type(raised.value).__qualname__
    assert run.status.status_code is trace.StatusCode.ERROR
    assert SECRET not in telemetry.exported_text()


async def test_a_streamed_run_keeps_its_span_current_only_while_the_agent_works(
    telemetry: Telemetry, store: HistoryStore, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reply_text("one two three")
    seen_by_caller = []
    async with OpenAIChatClient("fake-model", base_url=fake_openai.base_url, api_key="k") as client:
        agent = Agent(client, name="Helper", history=store)
        async for _ in agent.run_stream("hi", session=agent.create_session()):
            seen_by_caller.append(trace.get_current_span().get_span_context().is_valid)

    assert seen_by_caller
    assert not any(seen_by_caller)
    run = telemetry.span("invoke_agent Helper")
    assert telemetry.children(run) == ["load", "append"]


def test_exported_json_is_what_the_no_text_assertions_read(telemetry: Telemetry) -> None:
    # The assertions above search the exporters' JSON; make sure it holds attribute values at all.
    with trace.get_tracer("check").start_as_current_span("probe", attributes={"probe.value": "findable"}):
        pass
    assert "findable" in telemetry.exported_text()
    assert json.loads(telemetry.span("probe").to_json())["attributes"] == {"probe.value": "findable"}
