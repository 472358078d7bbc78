"""What the blob backend's forks, usage and tags leave in the container: references, not copies; an index per tag."""

from __future__ import annotations

from typing import Any

from chatkeep.blob import open_store
from chatkeep.core import HistoryStore, Message, SessionInfo, SessionKey, Usage, UsageContent
from chatkeep.core.backend import usage_of


def make_messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


async def session_info(store: HistoryStore, key: SessionKey) -> SessionInfo:
    """``key``'s entry in ``list_sessions`` (the tests' tenants hold a few sessions)."""
    return next(i for i in (await store.list_sessions(key.tenant)).items if i.session_id == key.session_id)


async def blobs(service: Any, container: str, folder: str) -> list[str]:
    """The names under ``chatkeep/FOLDER/`` (``d``: data, ``m``: metadata, ``t``: tag indexes)."""
    client = service.get_container_client(container)
    return [b.name async for b in client.list_blobs(name_starts_with=f"chatkeep/{folder}/")]


async def three_segments(store: HistoryStore, key: SessionKey) -> list[Message]:
    """12 messages in 6 appends of 2: 3 segments, on a store opened with ``segment_blocks=2``."""
    batch = make_messages(12)
    for n in range(0, 12, 2):
        await store.append(key, batch[n : n + 2])
    return batch


async def test_a_fork_writes_a_reference_and_its_metadata_and_copies_no_segment(
    blob_url: str, service: Any, container: str
) -> None:
    source, fork = SessionKey("t", "source"), SessionKey("t", "fork")
    async with open_store(f"{blob_url}?segment_blocks=2") as store:
        batch = await three_segments(store, source)
        segments = await blobs(service, container, "d")
        assert await store.fork(source, fork, through=batch[7].message_id) == 8
        data = await blobs(service, container, "d")
        references = [name for name in data if "/r/" in name]
        assert sorted(set(data) - set(segments)) == references, "a fork wrote something other than a reference"
        assert len(references) == 1
        assert references[0].split("/r/")[1].startswith("00000001.")  # it keeps segments 0..1
        assert len(await blobs(service, container, "m")) == 2


async def test_segments_outlive_their_session_while_a_fork_refers_to_them(
    blob_url: str, service: Any, container: str
) -> None:
    source, fork = SessionKey("t", "source"), SessionKey("t", "fork")
    async with open_store(f"{blob_url}?segment_blocks=2") as store:
        batch = await three_segments(store, source)
        await store.fork(source, fork, through=batch[3].message_id)  # all in segment 0
        await store.append(fork, make_messages(3, "own"))
        assert await store.trim(source, 2) == 10
        kept = [name for name in await blobs(service, container, "d") if "/r/" not in name]
        # The source keeps segment 2; segment 0 stays for the fork; segment 1 went; the fork has its own segment.
        assert len(kept) == 3
        assert await store.delete(source)
        assert len([name for name in await blobs(service, container, "d") if "/r/" not in name]) == 2
        fresh = open_store(blob_url)
        try:
            assert [m.text for m in await fresh.load(fork)] == [*(m.text for m in batch[:4]), "own-0", "own-1", "own-2"]
        finally:
            await fresh.close()
        assert await store.delete(fork)  # the last one referring to them: nothing is left behind
        assert await blobs(service, container, "d") == []
        assert await blobs(service, container, "m") == []


async def test_pruning_a_source_and_then_its_fork_leaves_nothing(blob_url: str, service: Any, container: str) -> None:
    source, fork = SessionKey("t", "source"), SessionKey("t", "fork")
    async with open_store(blob_url) as store:
        batch = make_messages(6)
        await store.append(source, batch)
        await store.fork(source, fork, through=batch[2].message_id)
        await store.update_info(fork, tags={"kept"})
        assert await store.prune(older_than=(await session_info(store, fork)).updated_at, tenant="t") == 1
        assert await store.count(source) == 0
        assert [m.message_id for m in await store.load(fork)] == [m.message_id for m in batch[:3]]
        assert await store.delete(fork)
        assert await blobs(service, container, "d") == []
        assert await blobs(service, container, "t") == []


async def test_a_tag_listing_reads_its_index(blob_url: str, service: Any, container: str) -> None:
    tenant = "tags"
    async with open_store(blob_url) as store:
        for n in range(6):
            await store.append(SessionKey(tenant, f"s{n}"), make_messages(1))
        await store.update_info(SessionKey(tenant, "s1"), tags={"a", "b"})
        await store.update_info(SessionKey(tenant, "s4"), tags={"a"})
        assert len(await blobs(service, container, "t")) == 3  # one entry per session and tag, nothing else
        assert [i.session_id for i in (await store.list_sessions(tenant, tag="a")).items] == ["s4", "s1"]
        await store.update_info(SessionKey(tenant, "s1"), tags={"b"})
        assert len(await blobs(service, container, "t")) == 2  # the dropped tag's entry went
        assert [i.session_id for i in (await store.list_sessions(tenant, tag="a")).items] == ["s4"]
        assert await store.delete(SessionKey(tenant, "s4"))
        assert len(await blobs(service, container, "t")) == 1


async def test_info_too_large_for_blob_metadata_is_listed_from_the_metadata_blob(blob_url: str) -> None:
    key = SessionKey("t", "large")
    large = {"notes": "x" * 60_000}
    async with open_store(blob_url) as store:
        used = [Usage(input_tokens=n, output_tokens=1, total_tokens=n + 1) for n in range(3)]
        costly = [Message(role="assistant", contents=[UsageContent(usage=u, model="m")]) for u in used]
        await store.append(key, costly)
        await store.update_info(key, title="t" * 1024, tags={f"tag-{n}" for n in range(64)}, metadata=large)
    fresh = open_store(blob_url)
    try:
        info = await session_info(fresh, key)
        assert (info.title, len(info.tags), info.metadata, info.usage) == ("t" * 1024, 64, large, usage_of(costly))
        assert [i.session_id for i in (await fresh.list_sessions("t", tag="tag-7")).items] == ["large"]
    finally:
        await fresh.close()
