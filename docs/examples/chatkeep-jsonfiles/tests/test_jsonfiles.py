"""What the conformance kit cannot see: file names, torn and uncommitted writes, the URL and its options."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
from typing import Any
from urllib.parse import quote

import pytest

import chatkeep_jsonfiles._store
from chatkeep.core import (
    Message,
    SessionFormatError,
    SessionKey,
    StoreUnavailableError,
    installed_backends,
    open_store,
)
from chatkeep.core.backend import SupportsNativeTTL, SupportsReadProbe
from chatkeep_jsonfiles import JsonFilesHistoryProvider, JsonFilesHistoryStore, JsonFilesURLError

SESSION_FILE = re.compile(r"[0-9a-f]{64}\.(json|ids|lock|[0-9]+\.jsonl)")


def url(path: pathlib.Path, query: str = "") -> str:
    return "jsonfiles://" + quote(str(path)) + query


def messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


def ids(batch: list[Message]) -> list[str]:
    return [message.message_id for message in batch]


def files_under(path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(file for file in path.rglob("*") if file.is_file())


def metadata_under(path: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(file.read_text()) for file in files_under(path) if file.suffix == ".json"]


async def test_hostile_ids_stay_inside_the_root(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "root"
    hostile = ["..", "../..", "../../outside", "/etc/passwd", "a/b", "\x00", "C:\\x", "*", "~", "."]
    async with JsonFilesHistoryStore(url(root)) as store:
        for tenant in hostile:
            for session_id in hostile:
                await store.append(SessionKey(tenant, session_id), messages(1))
    files = [file.relative_to(root) for file in files_under(tmp_path)]  # raises for a file outside the root
    assert len(files) == len(hostile) ** 2 * 4  # metadata, records, ids and lock of each session
    assert all(len(file.parts) == 2 and SESSION_FILE.fullmatch(file.name) for file in files)
    # The names are hashes; the ids themselves are inside the metadata.
    kept = [(meta["tenant"], meta["session_id"]) for meta in metadata_under(root)]
    assert sorted(kept) == sorted((tenant, session_id) for tenant in hostile for session_id in hostile)


async def test_torn_last_line_is_ignored_and_cut_off(tmp_path: pathlib.Path) -> None:
    key, batch = SessionKey("t", "s"), messages(3)
    async with JsonFilesHistoryStore(url(tmp_path)) as store:
        await store.append(key, batch)
    [log] = [file for file in files_under(tmp_path) if file.suffix == ".jsonl"]
    with open(log, "ab") as file:  # noqa: ASYNC230 - a test's own small write
        file.write(b'{"v":1,"message_id":"torn-by-a-dying-wri')  # a writer killed in the middle of its write
    async with JsonFilesHistoryStore(url(tmp_path)) as store:
        assert ids(await store.load(key)) == ids(batch)
        assert ids(await store.load(key, last=2)) == ids(batch[1:])
        assert [m.message_id async for m in store.iter_messages(key, batch=2)] == ids(batch)
        assert await store.count(key) == 3
        more = messages(2, "after")
        assert await store.append(key, more) == 2
        assert ids(await store.load(key)) == ids(batch + more)
    with open(log, "rb") as file:  # noqa: ASYNC230
        assert b"torn" not in file.read()


async def test_append_that_dies_before_its_commit_leaves_no_trace(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, batch = SessionKey("t", "s"), messages(4)
    store = JsonFilesHistoryStore(url(tmp_path))
    await store.append(key, batch[:1])
    replace_file = chatkeep_jsonfiles._store.replace_file

    def die_at_the_commit(path: str, data: bytes, *, fsync: bool) -> None:
        if path.endswith(".json"):
            raise OSError("killed")  # the records and the index are written; the metadata is not
        replace_file(path, data, fsync=fsync)

    monkeypatch.setattr(chatkeep_jsonfiles._store, "replace_file", die_at_the_commit)
    with pytest.raises(StoreUnavailableError, match="killed"):
        await store.append(key, batch[1:])
    monkeypatch.undo()
    fresh = JsonFilesHistoryStore(url(tmp_path))
    assert ids(await fresh.load(key)) == ids(batch[:1])
    # The index announced records the metadata never committed: it is rebuilt from the one stored record.
    assert await fresh.append(key, batch[1:]) == 3
    assert fresh.messages_read == 1 + 1
    assert ids(await fresh.load(key)) == ids(batch)
    await store.close()
    await fresh.close()


async def test_pop_keeps_the_id_index_and_the_next_append_cuts_the_popped_bytes(tmp_path: pathlib.Path) -> None:
    key, batch = SessionKey("t", "s"), messages(100)
    async with JsonFilesHistoryStore(url(tmp_path)) as store:
        await store.append(key, batch)
        for expected in reversed(batch[-3:]):
            popped = await store.pop(key)
            assert popped is not None
            assert popped.message_id == expected.message_id
        [log] = [file for file in files_under(tmp_path) if file.suffix == ".jsonl"]
        [meta] = metadata_under(tmp_path)
        assert log.stat().st_size > meta["size"]  # the popped records are past the committed end
        before = store.messages_read
        # The index forgot exactly the popped ids (tombstones), so this append reads no records to rebuild it.
        new = messages(2, "new")
        assert await store.append(key, [*batch[-4:], *new]) == 5
        assert store.messages_read == before
        assert log.stat().st_size == metadata_under(tmp_path)[0]["size"]
        assert ids(await store.load(key, last=6)) == ids(batch[-4:]) + ids(new)
        assert await store.count(key) == 102


async def test_iteration_continues_after_a_trim(tmp_path: pathlib.Path) -> None:
    key, batch = SessionKey("t", "s"), messages(10)
    async with JsonFilesHistoryStore(url(tmp_path)) as store:
        await store.append(key, batch)
        pages = store.iter_messages(key, batch=2)
        seen = [await pages.__anext__(), await pages.__anext__()]
        assert await store.trim(key, 5) == 5
        seen += [message async for message in pages]
    assert ids(seen) == ids(batch[:2] + batch[5:])


async def test_a_fork_links_the_frozen_records_and_the_last_reader_removes_them(tmp_path: pathlib.Path) -> None:
    source, fork = SessionKey("t", "source"), SessionKey("t", "fork")
    batch = messages(6)
    async with JsonFilesHistoryStore(url(tmp_path)) as store:
        await store.append(source, batch)
        assert await store.fork(source, fork, through=batch[3].message_id) == 4
        logs = [file for file in files_under(tmp_path) if file.suffix == ".jsonl"]
        assert len({file.stat().st_ino for file in logs}) == 1, "a fork copied records"  # names of one file
        assert {file.stat().st_nlink for file in logs} == {2}
        await store.append(source, messages(1, "after"))  # goes on in a new file: the frozen one never changes
        assert await store.delete(source)
        assert ids(await store.load(fork)) == ids(batch[:4])
        [log] = [file for file in files_under(tmp_path) if file.suffix == ".jsonl"]
        assert log.stat().st_nlink == 1  # the fork's name is the last
        assert await store.delete(fork)
    assert [file for file in files_under(tmp_path) if file.suffix in (".jsonl", ".ids")] == []


@pytest.mark.parametrize(
    ("query", "options", "message"),
    [
        (
            "?colour=blue",
            {},
            r"query option 'colour' in jsonfiles://.*\?colour=blue; the options are max_message_bytes, fsync",
        ),
        ("", {"colour": "blue"}, "no keyword option 'colour'"),
        ("", {"ttl": 60}, "no ttl option: it has no native TTL; delete old sessions with store.prune"),
        ("?fsync=maybe", {}, "fsync='maybe'.* must be true or false"),
        ("?max_message_bytes=0", {}, "must be a whole number of 1 or more"),
    ],
)
def test_unknown_and_malformed_options_are_refused(
    tmp_path: pathlib.Path, query: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(JsonFilesURLError, match=message):
        JsonFilesHistoryStore(url(tmp_path, query), **options)


@pytest.mark.parametrize("bad", ["jsonfiles://", "jsonfiles:/x", "files:///x", "jsonfiles:///x#y"])
def test_malformed_urls_are_refused(bad: str) -> None:
    with pytest.raises(JsonFilesURLError, match="jsonfiles"):
        JsonFilesHistoryStore(bad)


def test_options_and_capabilities(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonFilesHistoryStore(url(tmp_path, "?fsync=false&max_message_bytes=1000"))
    assert (store.root, store.fsync, store.max_message_bytes) == (str(tmp_path), False, 1000)
    assert JsonFilesHistoryStore(url(tmp_path), fsync="off", max_message_bytes=5).fsync is False
    assert isinstance(store, SupportsReadProbe)
    assert not isinstance(store, SupportsNativeTTL)
    monkeypatch.chdir(tmp_path)
    assert JsonFilesHistoryStore("jsonfiles://history/chat").root == str(tmp_path / "history" / "chat")


async def test_installed_through_the_entry_point(tmp_path: pathlib.Path) -> None:
    assert ("jsonfiles", "chatkeep-jsonfiles") in [(b.name, b.distribution) for b in installed_backends()]
    store = open_store(url(tmp_path, "?fsync=false"))
    assert isinstance(store, JsonFilesHistoryStore)
    await store.close()
    provider = JsonFilesHistoryProvider(url(tmp_path), max_messages=5)
    assert isinstance(provider.store, JsonFilesHistoryStore)
    await provider.store.close()


def _cut(meta: pathlib.Path) -> None:
    meta.write_text(meta.read_text(encoding="utf-8")[:40], encoding="utf-8")  # cut short: no longer JSON


async def test_a_damaged_metadata_file_names_the_session_and_delete_still_works(tmp_path: pathlib.Path) -> None:
    store = JsonFilesHistoryStore("jsonfiles://" + quote(str(tmp_path / "store")))
    key, other = SessionKey("t-damaged", "s-damaged"), SessionKey("t-damaged", "s-good")
    async with store:
        await store.append(key, [Message(role="user", text="hi")])
        await store.append(other, [Message(role="user", text="fine")])
        await asyncio.to_thread(_cut, pathlib.Path(store._paths(key).meta))
        calls = (store.count(key), store.load(key), store.load_session(key), store.append(key, [Message(role="user")]))
        for call in calls:
            with pytest.raises(SessionFormatError) as caught:
                await call
            assert "the stored metadata of session 's-damaged' in tenant 't-damaged' is damaged" in str(caught.value)
        with pytest.raises(SessionFormatError, match=r"the session metadata file .*\.json is damaged"):
            await store.list_sessions("t-damaged")
        assert [m.text for m in await store.load(other)] == ["fine"]
        assert await store.delete(key)  # the way out the error names
        assert [info.session_id for info in (await store.list_sessions("t-damaged")).items] == ["s-good"]
