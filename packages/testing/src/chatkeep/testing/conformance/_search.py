"""Conformance of the search capability: stores that can search say so truthfully, and keep their index right.

A store with the capability (:class:`~chatkeep.core.SupportsSearch`) runs every test here; a store without it
runs only :meth:`SearchConformance.test_the_search_capability_is_declared_truthfully`, which proves that asking
it to search raises a clear error, and skips the rest saying why. A backend with the capability implements one
hook, :meth:`SearchConformance.index_entries_in_raw_storage`, so that the kit checks its raw storage too. The
vectors come from :class:`~chatkeep.testing.embedding.HashingEmbedder`: deterministic, no model, no network.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chatkeep.core import (
    AgentSession,
    ChatkeepError,
    EmbedderMismatchError,
    Message,
    SearchUnsupportedError,
    SupportsSearch,
    TenantScope,
    embed_messages,
)
from chatkeep.core.backend import HistoryStore, SearchableStore, SessionKey, searchable
from chatkeep.testing.conformance._base import ConformanceBase, StoreKit
from chatkeep.testing.embedding import HashingEmbedder

__all__ = ["SearchConformance"]

FACT = "the spare key of the blue bicycle hangs behind the kitchen door"
QUESTION = "where is the spare key of the blue bicycle"
FILLER = [
    "we talked about the weather in spring",
    "the train was late again this morning",
    "please summarise the meeting notes",
    "the recipe needs two eggs and some flour",
    "my favourite colour used to be green",
]


class _Interrupted(Exception):
    """Stands for whatever stops a reindex midway (a crash, a cancelled job)."""


def _embedder() -> HashingEmbedder:
    return HashingEmbedder()


class SearchConformance(ConformanceBase):
    """Search: found by words and by vector, never across tenants or owners, gone with the messages."""

    def searchable_store(self, store: HistoryStore) -> SearchableStore:
        """``store`` as a searchable store; the calling test is skipped, saying why, when it cannot search."""
        if not isinstance(store, SupportsSearch):
            pytest.skip(f"{type(store).__name__} does not have the search capability")
        assert isinstance(store, SearchableStore), "a store with the search capability subclasses SearchableStore"
        return store

    async def index_entries_in_raw_storage(self, store: HistoryStore, tenant: str) -> int:
        """How many index entries the backing storage holds for ``tenant``, read beside the store's API.

        Count what the index keeps for the tenant's messages (rows, keys, vectors, keyword entries), plus any
        entry the backing holds whose message is gone (an orphan, whichever tenant it was of). The kit checks with
        it that removing messages removes their index entries in storage, not only from search results. A
        backend with the search capability must override it (the bundled backends' kit subclasses show how).
        """
        raise TypeError(
            f"{type(store).__name__} can search, so {type(self).__name__} must override "
            "index_entries_in_raw_storage(store, tenant) to count the index entries its storage holds for a tenant"
        )

    async def append_indexed(self, store: SearchableStore, key: SessionKey, texts: list[str]) -> list[Message]:
        """Append messages of ``texts`` with their vectors; returns the messages."""
        messages = [Message(role="user" if n % 2 == 0 else "assistant", text=t) for n, t in enumerate(texts)]
        assert await store.append(key, messages, embeddings=await embed_messages(_embedder(), messages)) == len(
            messages
        )
        return messages

    async def ask(self, store: SearchableStore, scope: SessionKey | TenantScope, k: int = 3) -> list[str]:
        """The texts ``search`` returns for :data:`QUESTION`, hybrid, best first."""
        [vector] = await _embedder().embed([QUESTION])
        return [hit.message.text for hit in await store.search(scope, vector, QUESTION, k)]

    async def test_the_search_capability_is_declared_truthfully(self, kit: StoreKit, store: HistoryStore) -> None:
        if isinstance(store, SupportsSearch):
            assert searchable(store) is store
            return
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            searchable(store)
        assert not hasattr(store, "search"), "a store without the capability must not look like it can search"
        key, messages = kit.key(), [Message(role="user", text=FACT)]
        with pytest.raises(SearchUnsupportedError, match="search capability"):
            await store.append(key, messages, embeddings=await embed_messages(_embedder(), messages))
        assert await store.count(key) == 0, "an append refused for its embeddings stored its messages"

    async def test_search_finds_a_message_by_words_and_by_vector(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        messages = await self.append_indexed(searching, key, [*FILLER, FACT])
        assert (await self.ask(searching, key))[0] == FACT
        assert (await self.ask(searching, TenantScope(key.tenant)))[0] == FACT
        by_words = await searching.search(key, None, "bicycle kitchen", 2)
        assert [hit.message.text for hit in by_words][:1] == [FACT]
        [vector] = await _embedder().embed([QUESTION])
        [best] = await searching.search(key, vector, None, 1, embedder=_embedder().name)
        assert best.message == messages[-1]  # the stored message, whole
        assert best.session_id == key.session_id
        assert best.score > 0

    async def test_search_never_returns_another_tenants_message(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        mine, theirs = kit.key(), kit.key()
        await self.append_indexed(searching, mine, FILLER)
        await self.append_indexed(searching, theirs, [FACT])  # the only good answer is another tenant's
        assert FACT not in await self.ask(searching, TenantScope(mine.tenant), k=10)
        assert FACT not in await self.ask(searching, mine, k=10)
        other_session = SessionKey(mine.tenant, "another-session")
        await self.append_indexed(searching, other_session, [FACT + " (mine)"])
        assert FACT + " (mine)" not in await self.ask(searching, mine, k=10)  # a session scope is that session
        assert FACT + " (mine)" in await self.ask(searching, TenantScope(mine.tenant), k=10)

    async def test_search_never_returns_another_owners_message(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        tenant = kit.tenant()
        alice, bob = SessionKey(tenant, "alice-chat"), SessionKey(tenant, "bob-chat")
        for key, owner in ((alice, "alice"), (bob, "bob")):
            await searching.save_session(key, AgentSession(session_id=key.session_id, tenant=tenant), owner=owner)
        await self.append_indexed(searching, alice, FILLER)
        await self.append_indexed(searching, bob, [FACT])
        assert FACT not in await self.ask(searching, TenantScope(tenant, owner="alice"), k=10)
        assert (await self.ask(searching, TenantScope(tenant, owner="bob")))[0] == FACT

    async def test_an_indexed_append_of_stored_messages_indexes_them_once(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        # A history provider stored the messages first; the recall provider appends them again with vectors.
        searching = self.searchable_store(store)
        await self.append_indexed(searching, kit.key(), FILLER)  # the index exists: its usual write path
        key = kit.key()
        messages = [Message(role="user", text=FACT), Message(role="assistant", text=FILLER[0])]
        assert await searching.append(key, messages) == 2
        embeddings = await embed_messages(_embedder(), messages)
        assert await searching.append(key, messages, embeddings=embeddings) == 0, "stored again"
        assert await searching.append(key, messages, embeddings=embeddings) == 0
        assert await searching.load(key) == messages
        [vector] = await _embedder().embed([QUESTION])
        hits = await searching.search(key, vector, QUESTION, 5)
        assert [hit.message.text for hit in hits] == [FACT, FILLER[0]], "indexed twice, or not at all"
        other = kit.key()  # and new messages, once the index exists
        await self.append_indexed(searching, other, [FACT, FILLER[1]])
        hits = await searching.search(other, vector, QUESTION, 5)
        assert [hit.message.text for hit in hits] == [FACT, FILLER[1]]

    async def test_a_scope_is_searched_whole_behind_many_closer_messages_outside_it(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        # 300 messages that answer the question better, in another tenant and of another owner of the tenant:
        # a search that took the index's nearest candidates first and then dropped those outside the scope
        # (an HNSW scan without iterative scanning, a KNN query over-fetching a fixed factor) would find too few.
        searching = self.searchable_store(store)
        tenant = kit.tenant()
        alice, bob = SessionKey(tenant, "alice-chat"), SessionKey(tenant, "bob-chat")
        for key, owner in ((alice, "alice"), (bob, "bob")):
            await searching.save_session(key, AgentSession(session_id=key.session_id, tenant=tenant), owner=owner)
        closer = [f"{FACT}, note {n}" for n in range(300)]
        await self.append_indexed(searching, kit.key(), closer)
        await self.append_indexed(searching, bob, closer)
        mine = await self.append_indexed(searching, alice, [*FILLER, "the bicycle's key is lost"])
        [vector] = await _embedder().embed([QUESTION])
        for scope in (alice, TenantScope(tenant, owner="alice")):
            hits = await searching.search(scope, vector, None, len(mine))
            assert sorted(hit.message.text for hit in hits) == sorted(m.text for m in mine), scope
            by_words = await searching.search(scope, None, QUESTION, len(mine))
            assert [hit.message.text for hit in by_words] == ["the bicycle's key is lost"], scope

    async def check_nothing_found_after(self, kit: StoreKit, store: HistoryStore, removal: str) -> None:
        """Index a session with the fact as its newest message, remove it by ``removal``, and search for it."""
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, [*FILLER, FACT])
        assert FACT in await self.ask(searching, key)
        indexed = await self.index_entries_in_raw_storage(searching, key.tenant)
        assert indexed == len(FILLER) + 1, (
            f"index_entries_in_raw_storage counted {indexed} entries, not {len(FILLER) + 1}"
        )
        if removal == "delete":
            await searching.delete(key)
        elif removal == "delete_tenant":
            await searching.delete_tenant(key.tenant)
        elif removal == "trim":
            await searching.trim(key, 0)
        elif removal == "pop":
            assert (await searching.pop(key)) is not None  # the fact was the newest
        elif removal == "unindex":
            assert await searching.unindex(key) == len(FILLER) + 1
            assert await searching.count(key) == len(FILLER) + 1, "unindex removed messages"
        elif removal == "unindex_tenant":
            assert await searching.unindex(TenantScope(key.tenant)) == len(FILLER) + 1
            assert await searching.count(key) == len(FILLER) + 1, "unindex removed messages"
        else:
            await searching.prune(older_than=datetime.now(timezone.utc) + timedelta(seconds=1), tenant=key.tenant)
        fresh = self.searchable_store(await kit.open())
        for scope in (key, TenantScope(key.tenant)):
            assert FACT not in await self.ask(fresh, scope, k=10), f"the index kept the message after {removal}"
            assert FACT not in [h.message.text for h in await fresh.search(scope, None, "bicycle kitchen", 10)]
        left = await self.index_entries_in_raw_storage(searching, key.tenant)
        assert left == (len(FILLER) if removal == "pop" else 0), f"{removal} left {left} index entries in storage"

    async def test_nothing_is_found_after_delete(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "delete")

    async def test_nothing_is_found_after_delete_tenant(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "delete_tenant")

    async def test_nothing_is_found_after_trim(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "trim")

    async def test_nothing_is_found_after_pop(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "pop")

    async def test_nothing_is_found_after_prune(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "prune")

    async def test_nothing_is_found_after_unindex_of_the_session(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "unindex")

    async def test_nothing_is_found_after_unindex_of_the_tenant(self, kit: StoreKit, store: HistoryStore) -> None:
        await self.check_nothing_found_after(kit, store, "unindex_tenant")

    async def test_crypto_shredding_a_tenant_deletes_its_index_entries(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        # allow_plaintext_index=True keeps index entries made from the plaintext: shredding the tenant's key
        # leaves its sealed messages unreadable, and must leave nothing readable in the index.
        pytest.importorskip("cryptography", reason="EncryptedStore needs the encryption extra (cryptography)")
        from chatkeep.core.encryption import EncryptedStore

        searching = self.searchable_store(store)
        if isinstance(store, EncryptedStore):
            encrypted = store  # the backend under test is the wrapper itself
        else:  # wrap a store on the backing under test; its data keys go to another instance beside it
            encrypted = EncryptedStore(
                await kit.open(),
                key_store=await kit.open(),
                master_keys={"k1": os.urandom(32)},
                allow_plaintext_index=True,
                owns_stores=False,
            )
        wrapped = self.searchable_store(encrypted)
        key, other = kit.key(), kit.key()
        for session in (key, other):
            await self.append_indexed(wrapped, session, [*FILLER, FACT])
        assert FACT in await self.ask(wrapped, TenantScope(key.tenant))
        assert await self.index_entries_in_raw_storage(searching, key.tenant) == len(FILLER) + 1
        await encrypted.shred_tenant(key.tenant)
        left = await self.index_entries_in_raw_storage(searching, key.tenant)
        assert left == 0, f"shred_tenant left {left} index entries in storage"
        [vector] = await _embedder().embed([QUESTION])
        fresh = self.searchable_store(await kit.open())
        assert await fresh.search(TenantScope(key.tenant), vector, QUESTION, 10) == []
        assert await self.index_entries_in_raw_storage(searching, other.tenant) == len(FILLER) + 1, (
            "shredding a tenant removed another tenant's index entries"
        )
        assert (await self.ask(wrapped, TenantScope(other.tenant)))[0] == FACT

    async def test_nothing_is_found_after_the_ttl_expires(self, kit: StoreKit, store: HistoryStore) -> None:
        self.skip_without_native_ttl()
        searching = self.searchable_store(await kit.open(ttl=timedelta(seconds=1)))
        key = kit.key()
        await self.append_indexed(searching, key, [*FILLER, FACT])
        assert FACT in await self.ask(searching, key)
        assert await self.index_entries_in_raw_storage(searching, key.tenant) == len(FILLER) + 1
        await kit.clock.sleep(1.5)  # the backend's time (the ttl_clock fixture): real, or a fake clock's
        for scope in (key, TenantScope(key.tenant)):
            assert FACT not in await self.ask(searching, scope, k=10), "the index outlived the session's TTL"
        # In storage too, once a search has looked (a store may drop what expired when it is next read).
        left = await self.index_entries_in_raw_storage(searching, key.tenant)
        assert left == 0, f"{left} index entries of the expired session are still in storage"

    async def test_a_trim_keeps_the_newest_messages_searchable(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, [FACT, *FILLER])
        await searching.trim(key, len(FILLER))
        assert FACT not in await self.ask(searching, key, k=10)
        found = [hit.message.text for hit in await searching.search(key, None, "eggs flour", 1)]
        assert found == [FILLER[3]]

    async def test_before_seq_and_roles_narrow_the_search(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, [*FILLER, FACT])  # FACT: sequence number 5, an assistant's
        [vector] = await _embedder().embed([QUESTION])
        before = await searching.search(key, vector, QUESTION, 10, before_seq=len(FILLER))
        assert FACT not in [hit.message.text for hit in before]
        assert len(before) == len(FILLER)
        users = await searching.search(key, vector, QUESTION, 10, roles=["user"])
        assert {hit.message.role for hit in users} == {"user"}
        assert FACT not in [hit.message.text for hit in users]

    async def test_a_recency_half_life_ranks_a_newer_match_above_an_older_better_one(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        now = datetime.now(timezone.utc)
        older = Message(role="user", text=FACT, created_at=now - timedelta(days=30))  # the better match
        newer = Message(role="user", text=FACT + " since this morning", created_at=now - timedelta(minutes=5))
        messages = [older, *(Message(role="assistant", text=t) for t in FILLER), newer]
        await searching.append(key, messages, embeddings=await embed_messages(_embedder(), messages))
        [vector] = await _embedder().embed([QUESTION])
        plain = [hit.message.message_id for hit in await searching.search(key, vector, QUESTION, 2)]
        assert plain == [older.message_id, newer.message_id], "without a recency weight, the better match leads"
        recent = await searching.search(key, vector, QUESTION, len(messages), recency_half_life=timedelta(days=1))
        ranked = [hit.message.message_id for hit in recent]
        assert ranked[0] == newer.message_id, "with a recency weight, the newer match leads"
        assert recent[0].score > next(hit.score for hit in recent if hit.message.message_id == older.message_id)
        # A half-life far longer than both ages changes nothing: the weight is by age, not by position.
        slow = await searching.search(key, vector, QUESTION, 2, recency_half_life=timedelta(days=3650))
        assert [hit.message.message_id for hit in slow] == plain

    async def test_an_index_built_with_another_embedder_is_refused(self, kit: StoreKit, store: HistoryStore) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, [FACT])
        other = HashingEmbedder(32, salt="another-model")
        messages = [Message(role="user", text="hello")]
        with pytest.raises(EmbedderMismatchError) as caught:
            await searching.append(key, messages, embeddings=await embed_messages(other, messages))
        message = str(caught.value)
        assert _embedder().name in message
        assert other.name in message
        assert "chatkeep reindex" in message
        assert await searching.count(key) == 1, "a refused append stored its messages"
        [vector] = await other.embed([QUESTION])
        with pytest.raises(EmbedderMismatchError, match="32 dimensions"):
            await searching.search(key, vector, QUESTION, 3)
        with pytest.raises(EmbedderMismatchError, match="another-model"):
            await searching.search(key, None, QUESTION, 3, embedder=other.name)

    async def test_reindex_indexes_what_was_stored_without_vectors_and_resumes(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, FILLER[:1])  # the index is built with the kit's embedder
        await searching.append(key, [Message(role="user", text=t) for t in [*FILLER[1:], FACT]])
        assert FACT not in await self.ask(searching, key, k=10)  # stored, not indexed
        embedder = _embedder()
        seen: list[int] = []
        assert await searching.reindex(embedder, key.tenant, batch=2, progress=seen.append) == len(FILLER)
        assert seen[-1] == len(FILLER)
        assert (await self.ask(searching, key))[0] == FACT
        assert await searching.reindex(embedder, key.tenant) == 0, "a second reindex indexed messages again"
        info = await searching.index_info()
        assert info is not None
        assert (info.embedder, info.dimensions) == (embedder.name, embedder.dimensions)

    async def test_an_interrupted_reindex_resumes_where_it_stopped(self, kit: StoreKit, store: HistoryStore) -> None:
        # The embedder stays the kit's: switching it would drop the index of every tenant on a shared backing (the
        # memory store's tests cover a switch interrupted midway).
        searching = self.searchable_store(store)
        await self.append_indexed(searching, kit.key(), FILLER[:1])  # the index is built with the kit's embedder
        key = kit.key()
        other = SessionKey(key.tenant, "another-session")
        await searching.append(key, [Message(role="user", text=f"note {n} about the garden shed") for n in range(10)])
        await searching.append(other, [Message(role="user", text="the shed key is blue")])
        seen: list[int] = []

        def stop_after_the_first_batch(done: int) -> None:
            seen.append(done)
            raise _Interrupted

        embedder = _embedder()
        with pytest.raises(_Interrupted):
            await searching.reindex(embedder, key.tenant, batch=4, progress=stop_after_the_first_batch)
        [first] = seen
        assert 0 < first <= 4
        [vector] = await embedder.embed(["garden shed"])
        assert len(await searching.search(TenantScope(key.tenant), vector, None, 20)) == first, (
            "what the interrupted run indexed is not searchable, or more was"
        )
        embedder.texts_embedded = 0
        assert await searching.reindex(embedder, key.tenant, batch=4) == 11 - first, "it did not resume"
        assert embedder.texts_embedded == 11 - first, "the resumed run embedded messages indexed already"
        [vector] = await embedder.embed(["shed key"])
        hits = await searching.search(TenantScope(key.tenant), vector, "shed key", 1, embedder=embedder.name)
        assert [hit.message.text for hit in hits] == ["the shed key is blue"]
        assert await self.index_entries_in_raw_storage(searching, key.tenant) == 11

    async def test_wrong_search_arguments_are_refused_with_a_chatkeep_error(
        self, kit: StoreKit, store: HistoryStore
    ) -> None:
        searching = self.searchable_store(store)
        key = kit.key()
        await self.append_indexed(searching, key, [FACT])
        [vector] = await _embedder().embed([QUESTION])
        wrong: list[dict[str, Any]] = [
            {"scope": key.tenant},  # a tenant's name instead of TenantScope(tenant)
            {"k": 0},
            {"k": "3"},
            {"k": True},
            {"query_vector": "a vector"},
            {"query_vector": []},
            {"query_vector": [float("nan")] * len(vector)},
            {"query_vector": ["x"] * len(vector)},
            {"roles": "user"},
            {"roles": [1]},
            {"before_seq": "5"},
            {"recency_half_life": timedelta(seconds=-1)},
            {"recency_half_life": 3600},
        ]
        for change in wrong:
            call = {"scope": key, "query_vector": vector, "query_text": QUESTION, "k": 3, **change}
            with pytest.raises(ChatkeepError):
                await searching.search(**call)
        messages = [Message(role="user", text="hello")]
        for embeddings in ("vectors", await embed_messages(_embedder(), [*messages, *messages])):
            with pytest.raises(ChatkeepError):
                await searching.append(key, messages, embeddings=embeddings)  # type: ignore[arg-type]
        with pytest.raises(ChatkeepError):
            await searching.reindex("an embedder", key.tenant)  # type: ignore[arg-type]
        assert await searching.count(key) == 1, "a refused call changed the session"
