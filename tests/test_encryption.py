"""EncryptedStore: the conformance kit through the wrapper, and what encryption at rest must guarantee."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import (
    AgentSession,
    EncryptedSessionError,
    FunctionCallContent,
    HistoryStore,
    Message,
    SearchUnsupportedError,
    SemanticRecallProvider,
    SessionKey,
    TenantScope,
    embed_messages,
    open_store,
)
from chatkeep.core.backend import searchable
from chatkeep.core.cli import main
from chatkeep.core.encryption import (
    KEYS_TENANT,
    DecryptionError,
    EncryptedStore,
    PlaintextIndexError,
    SearchableEncryptedStore,
)
from chatkeep.core.offline import OfflineChatClient
from chatkeep.memory import MemoryHistoryStore
from chatkeep.memory import _store as memory_internals
from chatkeep.testing import (
    DocumentDamager,
    FakeClock,
    ForkConformance,
    HistoryStoreConformance,
    InfoConformance,
    SearchConformance,
    StoreFactory,
    UsageConformance,
    not_implemented_yet,
)
from chatkeep.testing.embedding import HashingEmbedder
from chatkeep.testing.encryption import ENCRYPTED_STORE_LACKS, BackingFactory, EncryptionConformance

CANARY = "canary-7f3a-plaintext-must-never-be-stored"
K1, K2 = os.urandom(32), os.urandom(32)


def raw_memory_dump(namespace: str) -> str:
    """Everything a memory namespace holds, as the backend keeps it (records and documents)."""
    ns = memory_internals._namespace(namespace)
    parts: list[str] = []
    for tenant, sessions in ns.tenants.items():
        parts.append(tenant)
        for session_id, session in sessions.items():
            parts.append(session_id)
            parts.extend(session.records)
            parts.append(session.document or "")
    return "\n".join(parts)


class Backing:
    """A data namespace and a key namespace, and stores opened on them."""

    def __init__(self) -> None:
        self.data = f"enc-data-{uuid.uuid4().hex}"
        self.keys = f"enc-keys-{uuid.uuid4().hex}"

    def open(
        self,
        master: dict[str, bytes] | None = None,
        current: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        allow_plaintext_index: bool = False,
        **options: Any,
    ) -> EncryptedStore:
        return EncryptedStore(
            MemoryHistoryStore(namespace=self.data, clock=clock, **options),
            key_store=MemoryHistoryStore(namespace=self.keys),
            master_keys=master or {"k1": K1},
            current_key_id=current,
            allow_plaintext_index=allow_plaintext_index,
        )


@not_implemented_yet(
    ForkConformance,
    UsageConformance,
    InfoConformance,
    reason=ENCRYPTED_STORE_LACKS,
)
class TestEncryptedMemoryConformance(HistoryStoreConformance):
    native_ttl = True
    multi_process = False

    @pytest.fixture
    def ttl_clock(self) -> FakeClock:
        return FakeClock()  # the kit's TTL tests move it instead of sleeping

    @pytest.fixture
    def make_store(self, ttl_clock: FakeClock) -> StoreFactory:
        backing = Backing()

        def make(**options: Any) -> HistoryStore:
            return backing.open(clock=ttl_clock, **options)

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, EncryptedStore)
        assert isinstance(store.inner, MemoryHistoryStore)
        return store.inner.messages_read

    @pytest.fixture
    def damage_session_document(self) -> DocumentDamager:
        async def damage(store: HistoryStore, key: SessionKey) -> None:
            assert isinstance(store, EncryptedStore)
            assert isinstance(store.inner, MemoryHistoryStore)
            sealed = store.inner._data.get(key, store.inner._clock())
            assert sealed is not None
            sealed.document = "[1, 2"  # the sealed document as the inner store keeps it

        return damage


class TestEncryptedMemorySearchConformance(SearchConformance):
    """The search kit through ``EncryptedStore(..., allow_plaintext_index=True)`` over the memory store."""

    native_ttl = True
    multi_process = False

    @pytest.fixture
    def ttl_clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def make_store(self, ttl_clock: FakeClock) -> StoreFactory:
        backing = Backing()

        def make(**options: Any) -> HistoryStore:
            return backing.open(clock=ttl_clock, allow_plaintext_index=True, **options)

        return make

    async def messages_read(self, store: HistoryStore) -> int:
        assert isinstance(store, EncryptedStore)
        assert isinstance(store.inner, MemoryHistoryStore)
        return store.inner.messages_read

    async def index_entries_in_raw_storage(self, store: HistoryStore, tenant: str) -> int:
        assert isinstance(store, EncryptedStore)
        assert isinstance(store.inner, MemoryHistoryStore)
        data = store.inner._data  # the inner store's index, as it keeps it
        with data.lock:
            return sum(len(session.entries) for session in data.tenants.get(tenant, {}).values())


class TestEncryptionOverMemory(EncryptionConformance):
    @pytest.fixture
    def open_backing(self) -> BackingFactory:
        run = uuid.uuid4().hex

        def open_backing(name: str) -> HistoryStore:
            return MemoryHistoryStore(namespace=f"enc-{name}-{run}")

        return open_backing


@pytest.fixture
def backing() -> Backing:
    return Backing()


async def test_plaintext_canary_never_reaches_the_backend(backing: Backing) -> None:
    key = SessionKey("acme", "s1")
    async with backing.open() as store:
        await store.append(
            key,
            [
                Message(role="user", text=f"my secret is {CANARY}", author_name=f"user-{CANARY}"),
                Message(
                    role="assistant",
                    contents=[FunctionCallContent(call_id="c1", name="f", arguments=f'{{"x": "{CANARY}"}}')],
                ),
            ],
        )
        session = AgentSession(session_id="s1", tenant="acme", state={"notes": CANARY})
        await store.save_session(key, session)
        loaded = await store.load(key)
        assert CANARY in loaded[0].text
        assert loaded[0].author_name == f"user-{CANARY}"
        stored = await store.load_session(key)
        assert stored is not None
        assert stored.session.state == {"notes": CANARY}
    raw = raw_memory_dump(backing.data) + raw_memory_dump(backing.keys)
    assert raw  # the backend holds data
    assert CANARY not in raw
    assert "my secret" not in raw


async def test_ids_and_order_stay_in_clear_so_windows_and_retries_work(backing: Backing) -> None:
    key = SessionKey("acme", "s1")
    messages = [Message(role="user", text=f"m{i}") for i in range(10)]
    async with backing.open() as store:
        assert await store.append(key, messages) == 10
        assert await store.append(key, messages[5:]) == 0  # idempotent through the wrapper
        window = await store.load(key, last=3)
        assert [m.text for m in window] == ["m7", "m8", "m9"]
        assert isinstance(store.inner, MemoryHistoryStore)
        raw = await store.inner.load(key, last=3)
        assert [m.message_id for m in raw] == [m.message_id for m in messages[7:]]


async def test_a_ciphertext_moved_to_another_session_or_tenant_fails_to_decrypt(backing: Backing) -> None:
    source, other_session, other_tenant = SessionKey("acme", "a"), SessionKey("acme", "b"), SessionKey("globex", "a")
    async with backing.open() as store:
        await store.append(source, [Message(role="user", text="hello")])
        await store.append(other_tenant, [Message(role="user", text="their own")])
        sealed = await store.inner.load(source)
        for target in (other_session, other_tenant):
            await store.inner.append(target, sealed)
            with pytest.raises(DecryptionError, match="changed, or moved"):
                await store.load(target)


async def test_tampered_clear_metadata_fails_to_decrypt(backing: Backing) -> None:
    key = SessionKey("acme", "a")
    async with backing.open() as store:
        await store.append(key, [Message(role="user", text="hi")])
        sealed = (await store.inner.load(key))[0]
        forged = sealed.model_copy(update={"role": "system", "message_id": "forged"})
        await store.inner.append(SessionKey("acme", "b"), [forged])
        with pytest.raises(DecryptionError):
            await store.load(SessionKey("acme", "b"))


async def test_rotating_the_master_key_rewraps_data_keys_without_rewriting_history(backing: Backing) -> None:
    keys = [SessionKey(f"tenant-{i}", "s") for i in range(3)]
    async with backing.open({"k1": K1}) as old:
        for key in keys:
            await old.append(key, [Message(role="user", text=f"hello {key.tenant}")])
        before = [m.model_dump() for key in keys for m in await old.inner.load(key)]

    async with backing.open({"k2": K2, "k1": K1}, current="k2") as rotating:
        assert await rotating.rotate_master_key() == 3
        assert await rotating.rotate_master_key() == 0  # already done
        after = [m.model_dump() for key in keys for m in await rotating.inner.load(key)]
        assert after == before  # messages untouched

    async with backing.open({"k2": K2}) as new_only:  # k1 retired
        for key in keys:
            assert [m.text for m in await new_only.load(key)] == [f"hello {key.tenant}"]


async def test_a_store_without_the_wrapping_master_key_says_which_key_is_missing(backing: Backing) -> None:
    key = SessionKey("acme", "s")
    async with backing.open({"k1": K1}) as store:
        await store.append(key, [Message(role="user", text="x")])
    async with backing.open({"k2": K2}) as stranger:
        with pytest.raises(DecryptionError, match="'k1'"):
            await stranger.load(key)


async def test_shredding_a_tenant_key_makes_only_its_history_unreadable(backing: Backing) -> None:
    shredded, kept = SessionKey("acme", "s"), SessionKey("globex", "s")
    async with backing.open() as store:
        await store.append(shredded, [Message(role="user", text="acme data")])
        await store.append(kept, [Message(role="user", text="globex data")])
        assert await store.shred_tenant("acme")
        with pytest.raises(DecryptionError, match="shredded"):
            await store.load(shredded)
        assert [m.text for m in await store.load(kept)] == ["globex data"]
    async with backing.open() as fresh:  # another instance, with no cached key
        with pytest.raises(DecryptionError, match="shredded"):
            await fresh.load(shredded)


@pytest.mark.reliability
async def test_concurrent_first_writers_of_a_tenant_agree_on_one_data_key(backing: Backing) -> None:
    key = SessionKey("new-tenant", "s")
    stores = [backing.open() for _ in range(8)]
    await asyncio.gather(*(s.append(key, [Message(role="user", text=f"w{i}")]) for i, s in enumerate(stores)))
    async with backing.open() as reader:
        assert sorted(m.text for m in await reader.load(key)) == [f"w{i}" for i in range(8)]
        assert await reader.key_store.count(SessionKey(KEYS_TENANT, "new-tenant")) == 1
    for store in stores:
        await store.close()


async def test_an_agent_configured_without_the_wrapper_fails_before_storing_anything(backing: Backing) -> None:
    key = SessionKey("acme", "s1")
    async with backing.open() as store:
        await store.append(key, [Message(role="user", text="sealed history")])
    plain = MemoryHistoryStore(namespace=backing.data)
    agent = OfflineChatClient().as_agent(name="misconfigured", history=plain)
    session = agent.create_session(session_id="s1", tenant="acme")
    with pytest.raises(EncryptedSessionError, match="open it through"):
        await agent.run("hello", session=session)
    async with backing.open() as store:
        assert [m.text for m in await store.load(key)] == ["sealed history"]
    await plain.close()


async def test_a_store_without_keys_refuses_to_fork_an_encrypted_session(backing: Backing) -> None:
    # Seals name the session they were made for: a fork made by a plain store could never be opened.
    key, fork = SessionKey("acme", "s1"), SessionKey("acme", "s1-fork")
    async with backing.open() as store:
        await store.append(key, [Message(role="user", text="sealed history")])
    plain = MemoryHistoryStore(namespace=backing.data)
    with pytest.raises(EncryptedSessionError, match="nothing was forked"):
        await plain.fork(key, fork)
    assert await plain.count(fork) == 0
    await plain.append(SessionKey("acme", "open"), [Message(role="user", text="plain")])
    assert await plain.fork(SessionKey("acme", "open"), SessionKey("acme", "open-fork")) == 1  # plain ones fork
    await plain.close()


class KeyStoreWithPassword(MemoryHistoryStore):
    def describe(self) -> dict[str, Any]:
        return {"type": "RedisHistoryStore", "url": "redis://:hunter2@keys.internal:6379/0", "prefix": "keyz"}


async def test_a_missing_data_key_names_the_key_store_with_its_password_hidden(backing: Backing) -> None:
    key = SessionKey("acme", "s")
    async with backing.open() as store:
        await store.append(key, [Message(role="user", text="x")])
    wrong = EncryptedStore(
        MemoryHistoryStore(namespace=backing.data),
        key_store=KeyStoreWithPassword(namespace=f"typo-{uuid.uuid4().hex}"),
        master_keys={"k1": K1},
    )
    async with wrong:
        with pytest.raises(DecryptionError) as refused:
            await wrong.append(key, [Message(role="user", text="y")])
    message = str(refused.value)
    assert "RedisHistoryStore(url=redis://:***@keys.internal:6379/0, prefix=keyz)" in message
    assert "hunter2" not in message
    assert f"MemoryHistoryStore(namespace={backing.data}" in message


def test_bad_configuration_is_refused() -> None:
    inner = MemoryHistoryStore(namespace=f"x-{uuid.uuid4().hex}")
    with pytest.raises(ValueError, match="32 bytes"):
        EncryptedStore(inner, key_store=MemoryHistoryStore(namespace="k"), master_keys={"k": b"short"})
    with pytest.raises(ValueError, match="another store"):
        EncryptedStore(inner, key_store=inner, master_keys={"k": K1})
    with pytest.raises(ValueError, match="current_key_id"):
        EncryptedStore(inner, key_store=MemoryHistoryStore(namespace="k"), master_keys={"k": K1}, current_key_id="nope")


class TestCommandLine:
    """The ``chatkeep`` commands hold no keys: they say a session is encrypted, and move it sealed."""

    @pytest.fixture
    def urls(self, tmp_path: Path) -> dict[str, str]:
        return {name: f"sqlite:///{tmp_path / f'{name}.db'}" for name in ("data", "keys", "copy", "restored")}

    @staticmethod
    def encrypted(urls: dict[str, str], data: str = "data") -> EncryptedStore:
        return EncryptedStore(open_store(urls[data]), key_store=open_store(urls["keys"]), master_keys={"k1": K1})

    @pytest.fixture
    def seeded(self, urls: dict[str, str]) -> dict[str, str]:
        async def seed() -> None:
            async with self.encrypted(urls) as store:
                await store.append(SessionKey("acme", "secret"), [Message(role="user", text=CANARY)])
            async with open_store(urls["data"]) as plain:
                await plain.append(SessionKey("acme", "open"), [Message(role="user", text="hello")])

        asyncio.run(seed())
        return urls

    @staticmethod
    def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    def test_doctor_says_which_sessions_are_encrypted(
        self, seeded: dict[str, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = self.run(capsys, "doctor", "--store", seeded["data"], "--tenant", "acme", "--json")
        assert code == 0
        report = json.loads(out)
        assert report["sessions"] == {"tenant": "acme", "sampled": 2, "encrypted": ["secret"], "key_store": False}
        assert [c["name"] for c in report["checks"]][-1] == "sessions"
        code, out, _ = self.run(capsys, "doctor", "--store", seeded["data"], "--tenant", "acme")
        assert code == 0
        assert "1 of the 2 newest sessions of tenant 'acme' are encrypted ('secret')" in out
        assert "read them through EncryptedStore" in out
        code, out, _ = self.run(capsys, "doctor", "--store", seeded["keys"], "--json")
        assert json.loads(out)["sessions"]["key_store"] is True

    def test_sessions_show_refuses_an_encrypted_session(
        self, seeded: dict[str, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = self.run(capsys, "sessions", "show", "secret", "--store", seeded["data"], "--tenant", "acme")
        assert code == 1
        assert "is encrypted" in err
        assert "EncryptedStore" in err
        assert "[data" not in out  # no sealed record shown as an empty message

    def test_export_import_and_copy_move_encrypted_sessions_sealed(
        self, seeded: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        exported = tmp_path / "acme.jsonl"
        data = ("--tenant", "acme")
        assert self.run(capsys, "export", "--store", seeded["data"], *data, "-o", str(exported))[0] == 0
        assert CANARY not in exported.read_text()
        assert self.run(capsys, "import", "--store", seeded["restored"], "-i", str(exported))[0] == 0
        code, out, err = self.run(capsys, "copy", "--from", seeded["data"], "--to", seeded["copy"], *data)
        assert code == 0, err
        assert "verified" in out

        async def read(name: str) -> list[str]:
            async with self.encrypted(seeded, name) as store:
                return [m.text for m in await store.load(SessionKey("acme", "secret"))]

        assert asyncio.run(read("restored")) == [CANARY]
        assert asyncio.run(read("copy")) == [CANARY]


async def test_an_encrypted_store_refuses_to_index_without_allow_plaintext_index(backing: Backing) -> None:
    store = backing.open()
    key = SessionKey("acme", "chat")
    messages = [Message(role="user", text=CANARY)]
    assert not hasattr(store, "search")
    for refuse in (
        lambda: searchable(store),
        lambda: SemanticRecallProvider(store=store, embedder=HashingEmbedder()),
    ):
        with pytest.raises(PlaintextIndexError, match="allow_plaintext_index=True") as caught:
            refuse()
        assert "leak" in str(caught.value)
    with pytest.raises(PlaintextIndexError, match="allow_plaintext_index=True"):
        await store.append(key, messages, embeddings=await embed_messages(HashingEmbedder(), messages))
    assert await store.count(key) == 0, "a refused indexed append stored its messages"
    await store.close()


async def test_allow_plaintext_index_searches_with_messages_sealed_at_rest(backing: Backing) -> None:
    store = backing.open(allow_plaintext_index=True)
    assert isinstance(store, SearchableEncryptedStore)
    embedder = HashingEmbedder()
    key = SessionKey("acme", "chat")
    fact = Message(role="user", text=f"the spare key hangs behind the kitchen door {CANARY}")
    indexed = [Message(role="assistant", text="we spoke about the weather"), fact]
    await store.append(key, indexed, embeddings=await embed_messages(embedder, indexed))
    assert CANARY not in raw_memory_dump(backing.data), "a message's text reached the data store in clear"
    [vector] = await embedder.embed(["where is the spare key?"])
    [best] = await store.search(TenantScope("acme"), vector, "spare key", 1, embedder=embedder.name)
    assert best.message == fact  # opened: the whole message, as appended
    # Stored without vectors, then indexed by reindex: it reads the messages through the wrapper (opened).
    later = Message(role="user", text="the bicycle is in the shed")
    await store.append(key, [later])
    assert await store.reindex(embedder, "acme") == 1
    [bike] = await store.search(key, None, "bicycle shed", 1)
    assert bike.message == later
    await store.delete_tenant("acme")
    assert await store.search(TenantScope("acme"), vector, "spare key", 5) == []
    await store.close()


async def test_allow_plaintext_index_needs_an_inner_store_that_can_search(tmp_path: Path) -> None:
    pytest.importorskip("chatkeep.sql")
    plain = open_store(f"sqlite:///{tmp_path}/chat.db")
    with pytest.raises(SearchUnsupportedError, match="search capability"):
        EncryptedStore(
            plain,
            key_store=MemoryHistoryStore(namespace=f"keys-{uuid.uuid4().hex}"),
            master_keys={"k1": K1},
            allow_plaintext_index=True,
        )
    await plain.close()
