"""Search on the memory store beyond the kit: a reindex that switches embedders, interrupted and resumed.

The kit's ``test_an_interrupted_reindex_resumes_where_it_stopped`` runs the resume on every backend with the
index's own embedder; a switch drops every tenant's entries, which only a backing of the test's own can afford.
"""

from __future__ import annotations

import uuid

import pytest

from chatkeep.core import EmbedderMismatchError, Message, SessionKey, TenantScope, embed_messages
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing.embedding import HashingEmbedder


class _Interrupted(Exception):
    pass


async def test_reindex_switches_the_embedder_and_resumes_after_an_interruption() -> None:
    store = MemoryHistoryStore(namespace=f"search-{uuid.uuid4().hex}")
    old, new = HashingEmbedder(), HashingEmbedder(32, salt="v2")
    key = SessionKey("acme", "chat")
    messages = [Message(role="user", text=f"note {n} about the garden shed") for n in range(10)]
    await store.append(key, messages, embeddings=await embed_messages(old, messages))
    await store.append(SessionKey("acme", "other"), [Message(role="user", text="the shed key is blue")])

    indexed_before: list[int] = []

    def stop_after_first_batch(done: int) -> None:
        indexed_before.append(done)
        raise _Interrupted

    with pytest.raises(_Interrupted):
        await store.reindex(new, batch=4, progress=stop_after_first_batch)
    info = await store.index_info()
    assert info is not None
    assert info.embedder == new.name  # switched: the old entries are gone, one batch indexed so far
    [old_vector] = await old.embed(["garden shed"])
    with pytest.raises(EmbedderMismatchError):
        await store.search(key, old_vector, None, 3)

    new.texts_embedded = 0
    [first] = indexed_before
    assert 0 < first <= 4
    assert await store.reindex(new, batch=4) == 11 - first  # resumed: only what the interrupted run left
    assert new.texts_embedded == 11 - first
    [vector] = await new.embed(["shed key"])
    hits = await store.search(TenantScope("acme"), vector, "shed key", 1, embedder=new.name)
    assert [hit.message.text for hit in hits] == ["the shed key is blue"]
    await store.close()
