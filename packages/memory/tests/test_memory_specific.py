"""What the conformance kit does not cover: memory:// URLs, namespaces, argument checks, the kit's override guard."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

import chatkeep.core
import chatkeep.core.backend
from chatkeep.core import AgentSession, ChatkeepError, HistoryStore, Message, SessionFormatError, SessionKey
from chatkeep.memory import MemoryHistoryStore, MemoryURLError, open_store
from chatkeep.memory._config import DEFAULT_NAMESPACE, parse_url
from chatkeep.testing import FakeClock, HistoryStoreConformance, StoreFactory


def _name() -> str:
    return f"specific-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("url", "namespace"),
    [
        ("memory://", DEFAULT_NAMESPACE),
        ("memory:///", DEFAULT_NAMESPACE),
        ("memory", DEFAULT_NAMESPACE),
        ("memory://team-a", "team-a"),
        ("memory://team-a/", "team-a"),
        ("MEMORY://Team-A", "Team-A"),
        ("memory://a%20b", "a b"),
        ("memory://a/b", "a/b"),
    ],
)
def test_url_names_the_namespace(url: str, namespace: str) -> None:
    assert parse_url(url).namespace == namespace


def test_url_options_and_keyword_overrides() -> None:
    config = parse_url("memory://x?ttl=2.5&max_message_bytes=1000")
    assert (config.ttl, config.max_message_bytes) == (2.5, 1000)
    config = parse_url("memory://x?ttl=2.5&max_message_bytes=1000", ttl=timedelta(seconds=9), max_message_bytes=50)
    assert (config.ttl, config.max_message_bytes) == (9.0, 50)  # a timedelta is normalized to seconds
    config = parse_url("memory://x?ttl=7", ttl=None, max_message_bytes=None)  # None means "not given"
    assert (config.ttl, config.max_message_bytes) == (7.0, chatkeep.core.backend.DEFAULT_MAX_MESSAGE_BYTES)
    store = open_store("memory://x?ttl=3", max_message_bytes=123)
    assert (store.namespace, store.ttl, store.max_message_bytes) == ("x", 3.0, 123)


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost",
        "memory:x",
        "memoryx://",
        "memory://x?tll=3",
        "memory://x?ttl=soon",
        "memory://x?max_message_bytes=1.5",
        "memory://x?max_message_bytes=0",
        "memory://x#frag",
        "memory://x?ttl",
    ],
)
def test_bad_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(MemoryURLError) as caught:
        open_store(url)
    assert isinstance(caught.value, ChatkeepError)
    assert isinstance(caught.value, ValueError)
    assert "memory" in str(caught.value)


def test_bad_options_are_refused() -> None:
    with pytest.raises(MemoryURLError, match="'tll'; the options are max_message_bytes, ttl, namespace"):
        open_store("memory://", tll=3)
    with pytest.raises(MemoryURLError, match="ttl=0 must be a positive"):
        open_store("memory://", ttl=0)
    with pytest.raises(MemoryURLError, match=r"'bogus' in memory://x\?bogus=1; the options are"):
        open_store("memory://x?bogus=1")
    with pytest.raises(MemoryURLError):
        MemoryHistoryStore(max_message_bytes=-1)


async def test_same_name_shares_data_and_names_are_isolated() -> None:
    name = _name()
    key = SessionKey("t", "s")
    first, second, other = (
        open_store(f"memory://{name}"),
        open_store(f"memory://{name}"),
        open_store(f"memory://{name}x"),
    )
    await first.append(key, [Message(role="user", text="hi")])
    assert [m.text for m in await second.load(key)] == ["hi"]
    assert await other.count(key) == 0
    assert open_store("memory://").namespace == open_store("memory://default").namespace
    for store in (first, second, other):
        await store.close()


async def test_open_store_finds_the_plugin() -> None:
    name = _name()
    store = chatkeep.core.open_store(f"memory://{name}?ttl=60")
    assert isinstance(store, MemoryHistoryStore)
    assert (store.namespace, store.ttl) == (name, 60.0)
    assert "memory" in [backend.name for backend in chatkeep.core.installed_backends()]
    await store.close()


async def test_read_probe_counts_decoded_records() -> None:
    store = MemoryHistoryStore(namespace=_name())
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text=str(n)) for n in range(30)])
    assert store.messages_read == 0
    await store.load(key, last=4)
    assert store.messages_read == 4
    assert len([m async for m in store.iter_messages(key, batch=8)]) == 30
    assert store.messages_read == 34
    await store.count(key)
    assert store.messages_read == 34


@pytest.mark.parametrize(
    "damage", ['{"type": "sess', "[1, 2]", '{"type": "session", "v": 99}', "[" * 100_000, "\udcff"]
)
async def test_a_damaged_session_document_names_the_session(damage: str) -> None:
    store = MemoryHistoryStore(namespace=_name())
    key = SessionKey("t-damaged", "s-damaged")
    await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant))
    stored = store._data.get(key, store._clock())  # write garbage where the document is kept
    assert stored is not None
    stored.document = damage
    with pytest.raises(SessionFormatError) as caught:
        await store.load_session(key)
    assert "session 's-damaged' in tenant 't-damaged' is damaged" in str(caught.value)
    assert "chatkeep sessions delete s-damaged --tenant t-damaged" in str(caught.value)
    await store.delete(key)  # the way out the message names works
    assert await store.load_session(key) is None


async def test_argument_checks() -> None:
    store = MemoryHistoryStore(namespace=_name())
    key = SessionKey("t", "s")
    with pytest.raises(ValueError, match="last"):
        await store.load(key, last=-1)
    with pytest.raises(ValueError, match="keep_last"):
        await store.trim(key, -1)
    with pytest.raises(ValueError, match="batch"):
        [m async for m in store.iter_messages(key, batch=0)]
    with pytest.raises(ValueError, match="limit"):
        await store.list_sessions("t", limit=0)
    with pytest.raises(ValueError, match="cursor"):
        await store.list_sessions("t", cursor="not-a-cursor")


async def test_iteration_survives_a_trim_between_pages() -> None:
    store = MemoryHistoryStore(namespace=_name())
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text=str(n)) for n in range(10)])
    pages = store.iter_messages(key, batch=4)
    seen = [(await pages.__anext__()).text for _ in range(4)]
    await store.trim(key, 3)  # drops 0..6: the iterator resumes at the oldest message still stored after 3
    seen += [m.text async for m in pages]
    assert seen == ["0", "1", "2", "3", "7", "8", "9"]


def test_describe_and_repr() -> None:
    store = MemoryHistoryStore("memory://docs", ttl=5)
    assert store.describe() == {"type": "MemoryHistoryStore", "namespace": "docs", "ttl": 5.0}
    assert repr(store) == "<MemoryHistoryStore namespace='docs'>"


class _Kit(HistoryStoreConformance):
    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return lambda **options: MemoryHistoryStore(namespace=_name(), **options)

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, MemoryHistoryStore)
        return store.messages_read


def _define(body: dict[str, Any]) -> type:
    return type("TestGuarded", (_Kit,), {"__module__": __name__, **body})


def test_kit_accepts_a_strict_xfail_with_reason() -> None:
    @pytest.mark.xfail(strict=True, reason="this backend cannot")
    async def test_count_is_exact(self: Any, kit: Any, store: Any) -> None:
        raise AssertionError

    assert _define({"test_count_is_exact": test_count_is_exact})


@pytest.mark.parametrize(
    "mark",
    [
        None,
        pytest.mark.skip(reason="too hard"),
        pytest.mark.skipif(True, reason="too hard"),
        pytest.mark.xfail(reason="not strict"),
        pytest.mark.xfail(strict=True),
    ],
)
def test_kit_refuses_other_overrides(mark: pytest.MarkDecorator | None) -> None:
    async def test_count_is_exact(self: Any, kit: Any, store: Any) -> None:
        return None

    test = test_count_is_exact if mark is None else mark(test_count_is_exact)
    with pytest.raises(TypeError, match="test_count_is_exact"):
        _define({"test_count_is_exact": test})


def test_kit_refuses_a_removed_test() -> None:
    with pytest.raises(TypeError, match="test_trim_keeps_newest_and_counts_removed"):
        _define({"test_trim_keeps_newest_and_counts_removed": None})


async def test_sessions_expire_by_the_clock_the_store_is_given_without_waiting() -> None:
    clock = FakeClock()
    namespace = f"clock-{uuid.uuid4().hex}"
    store = MemoryHistoryStore(namespace=namespace, ttl=60, clock=clock)
    reader = MemoryHistoryStore(namespace=namespace, clock=clock)  # no TTL of its own: it reads by the same time
    key = SessionKey("t", "s")
    await store.append(key, [Message(role="user", text="hi")])
    await clock.sleep(59.9)
    assert await reader.count(key) == 1
    await store.append(key, [Message(role="user", text="again")])  # a write restarts the 60 s
    await clock.sleep(59.9)
    assert [info.session_id for info in (await reader.list_sessions("t")).items] == ["s"]
    await clock.sleep(0.2)
    assert await reader.count(key) == 0
    assert (await reader.list_sessions("t")).items == []
