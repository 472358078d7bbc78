"""A damaged metadata blob or data block is reported, naming the session, and never makes a session vanish."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from chatkeep.blob import open_store
from chatkeep.core import (
    AgentSession,
    DamagedListingError,
    Message,
    MessageFormatError,
    SessionFormatError,
    SessionKey,
)
from chatkeep.core.cli import main

KEY = SessionKey("t-damaged", "s-damaged")


def _messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


async def _blob_names(service: Any, container: str, folder: str) -> list[str]:
    client = service.get_container_client(container)
    return [blob.name async for blob in client.list_blobs(name_starts_with=f"chatkeep/{folder}/")]


async def _overwrite(service: Any, container: str, name: str, data: bytes) -> None:
    """What a tool writing over the blob does: new content, and the blob's own metadata gone with the old one."""
    await service.get_container_client(container).get_blob_client(name).upload_blob(data, overwrite=True)


@pytest.fixture
async def meta(blob_url: str) -> str:
    """Two sessions of one tenant stored; the name of the metadata blob of KEY, the one the tests damage."""
    async with open_store(blob_url) as store:
        await store.append(SessionKey(KEY.tenant, "s-good"), _messages(2, "good"))
        await store.append(KEY, _messages(3))
        await store.save_session(KEY, AgentSession(session_id=KEY.session_id, tenant=KEY.tenant))
        return store.layout.meta(KEY.tenant, KEY.session_id)


#: Runs ``chatkeep ARGS...`` in a thread (its commands run event loops of their own): exit status, stdout, stderr.
Chatkeep = Callable[..., Awaitable[tuple[int, str, str]]]


@pytest.fixture
def chatkeep(capsys: pytest.CaptureFixture[str]) -> Chatkeep:
    async def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _says_which(error: BaseException) -> None:
    text = str(error)
    assert "session 's-damaged' in tenant 't-damaged'" in text, text
    assert "chatkeep sessions delete s-damaged --tenant t-damaged" in text, text


async def test_a_damaged_metadata_blob_is_listed_and_every_call_names_it(
    blob_url: str, service: Any, container: str, meta: str
) -> None:
    raw = await (await service.get_container_client(container).get_blob_client(meta).download_blob()).readall()
    await _overwrite(service, container, meta, raw[: len(raw) // 2])  # cut in the middle: no longer JSON
    async with open_store(blob_url) as store:
        page = await store.list_sessions(KEY.tenant)
        assert sorted(info.session_id for info in page.items) == ["s-damaged", "s-good"], "the session vanished"
        for call in (
            store.count(KEY),
            store.load(KEY),
            store.load(KEY, last=1),
            store.load_session(KEY),
            store.append(KEY, _messages(1, "more")),
            store.trim(KEY, 1),
            store.pop(KEY),
        ):
            with pytest.raises(SessionFormatError) as caught:
                await call
            _says_which(caught.value)
            assert "metadata" in str(caught.value)
        with pytest.raises(SessionFormatError):
            [m async for m in store.iter_messages(KEY)]
        assert [m.text for m in await store.load(SessionKey(KEY.tenant, "s-good"))] == ["good-0", "good-1"]
        assert await store.delete(KEY)  # the way out the message names works
        assert await store.count(KEY) == 0


async def test_a_metadata_blob_that_no_longer_names_its_session_is_an_error_naming_the_blob(
    blob_url: str, service: Any, container: str, meta: str
) -> None:
    await _overwrite(service, container, meta, b"\x00garbage")
    async with open_store(blob_url) as store:
        with pytest.raises(DamagedListingError) as caught:
            await store.list_sessions(KEY.tenant)
        assert isinstance(caught.value, SessionFormatError)
        assert meta in str(caught.value)
        assert "tenant 't-damaged'" in str(caught.value)
        assert "delete it and the folder" in str(caught.value)
        (entry,) = caught.value.entries
        assert meta in entry
        # The rest of the listing comes with the error: the damaged blob does not hide the tenant's other sessions.
        assert [info.session_id for info in caught.value.page.items] == ["s-good"]
        assert caught.value.page.next_cursor is None
        assert [info.session_id for info in (await store.list_sessions("another")).items] == []


async def test_a_listing_by_pages_names_the_nameless_entry_on_each_and_goes_on(
    blob_url: str, service: Any, container: str, meta: str
) -> None:
    async with open_store(blob_url) as store:
        for n in range(3):
            await store.append(SessionKey(KEY.tenant, f"s-more-{n}"), _messages(1))
    await _overwrite(service, container, meta, b"\x00garbage")
    listed: list[str] = []
    cursor = None
    async with open_store(blob_url) as store:
        while True:
            # Each page names it (and a later page's is not taken for a bad cursor).
            with pytest.raises(DamagedListingError) as caught:
                await store.list_sessions(KEY.tenant, limit=2, cursor=cursor)
            assert meta in caught.value.entries[0]
            page = caught.value.page
            listed += [info.session_id for info in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
    assert sorted(listed) == ["s-good", "s-more-0", "s-more-1", "s-more-2"]


async def test_the_commands_name_a_metadata_blob_that_names_no_session_and_go_on_when_told(
    blob_url: str, service: Any, container: str, meta: str, chatkeep: Chatkeep, tmp_path: Any
) -> None:
    await _overwrite(service, container, meta, b"\x00garbage")

    common = ("--store", blob_url, "--tenant", KEY.tenant)
    code, out, err = await chatkeep("sessions", "list", *common)
    assert code == 1  # the others listed, the blob named
    assert "s-good" in out
    assert f"holds a damaged entry that names no session: the metadata blob {meta}" in err
    code, out, err = await chatkeep("sessions", "list", *common, "--skip-damaged", "--json")
    assert code == 3
    listing = json.loads(out)
    assert [s["session_id"] for s in listing["sessions"]] == ["s-good"]
    (skipped,) = listing["skipped"]
    assert skipped["session_id"] is None
    assert meta in skipped["error"]
    assert "skipped a damaged entry of tenant 't-damaged' that names no session" in err

    exported = tmp_path / "out.jsonl"
    code, out, err = await chatkeep("export", *common, "-o", str(exported))
    assert code == 1
    assert "export stopped at an entry of tenant 't-damaged' that names no session, which is damaged" in err
    assert meta in err
    assert not exported.exists()
    code, out, err = await chatkeep("export", *common, "-o", str(exported), "--skip-damaged")
    assert code == 3
    assert meta in err
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    code, out, err = await chatkeep("import", "--store", target, "-i", str(exported))  # its trailer counts hold
    assert code == 0, err
    copy = ("copy", "--from", blob_url, "--to", f"sqlite:///{tmp_path / 'copy2.db'}", "--tenant", KEY.tenant)
    code, out, err = await chatkeep(*copy)
    assert code == 1
    assert "copy stopped at an entry of tenant 't-damaged' that names no session" in err
    code, out, err = await chatkeep(*copy, "--skip-damaged")
    assert code == 3
    assert re.search(r"copied 1 session \(2 messages, [02] new\)", out), out
    assert meta in err


async def test_a_metadata_blob_without_its_listing_fields_is_still_listed(
    blob_url: str, service: Any, container: str, meta: str
) -> None:
    blob = service.get_container_client(container).get_blob_client(meta)
    await blob.set_blob_metadata({})  # intact content, listing fields gone
    async with open_store(blob_url) as store:
        listed = {info.session_id: info.message_count for info in (await store.list_sessions(KEY.tenant)).items}
        assert listed == {"s-damaged": 3, "s-good": 2}
        assert [m.text for m in await store.load(KEY)] == ["m-0", "m-1", "m-2"]


async def test_a_damaged_data_block_names_the_session(blob_url: str, service: Any, container: str, meta: str) -> None:
    segments = await _blob_names(service, container, "d")
    async with open_store(blob_url) as store:
        folder = store.layout.data(KEY.tenant, KEY.session_id)
    (segment,) = [name for name in segments if name.startswith(folder)]
    data = service.get_container_client(container).get_blob_client(segment)
    # A block past what the metadata covers (as an append whose writer died before committing): every reader
    # and the next writer take it in, and find a record that is not JSON.
    await data.append_block(b"~0123456789abcdef\n{not json at all\n")
    async with open_store(blob_url) as store:
        for call in (store.count(KEY), store.load(KEY), store.append(KEY, _messages(1, "more"))):
            with pytest.raises(MessageFormatError) as caught:
                await call
            _says_which(caught.value)
            assert "not valid JSON" in str(caught.value)
        with pytest.raises(MessageFormatError) as caught:
            [m async for m in store.iter_messages(KEY)]
        _says_which(caught.value)
        assert await store.count(SessionKey(KEY.tenant, "s-good")) == 2


async def test_the_commands_name_a_session_with_damaged_metadata_instead_of_passing_over_it(
    blob_url: str, service: Any, container: str, meta: str, chatkeep: Chatkeep, tmp_path: Any
) -> None:
    raw = await (await service.get_container_client(container).get_blob_client(meta).download_blob()).readall()
    await _overwrite(service, container, meta, raw[: len(raw) // 2])

    common = ("--store", blob_url, "--tenant", KEY.tenant)
    code, out, err = await chatkeep("sessions", "list", *common)
    assert code == 1
    assert "s-damaged" in out
    assert "DAMAGED" in out
    assert "the stored metadata of session 's-damaged' in tenant 't-damaged' is damaged" in err
    code, out, err = await chatkeep("export", *common, "-o", str(tmp_path / "out.jsonl"))
    assert code == 1
    assert "export stopped at session 's-damaged' of tenant 't-damaged', which is damaged" in err
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    code, out, err = await chatkeep("copy", "--from", blob_url, "--to", target, "--tenant", KEY.tenant)
    assert code == 1, out  # it printed "verified" and exited 0, the damaged session left behind unnamed
    assert "verified" not in out
    assert "copy stopped at session 's-damaged' of tenant 't-damaged', which is damaged" in err
    code, out, err = await chatkeep(
        "copy", "--from", blob_url, "--to", target, "--tenant", KEY.tenant, "--skip-damaged"
    )
    assert code == 3
    # The good session is new here unless the listing gave it before the damaged one to the copy that stopped.
    assert re.search(r"copied 1 session \(2 messages, [02] new\)", out), out
    assert "skipped damaged session 's-damaged' of tenant 't-damaged'" in err
