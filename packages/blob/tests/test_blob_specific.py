"""What only the blob backend does: its URL, blob names, segments, the index window, what it relies on in Azurite."""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceModifiedError

from chatkeep.blob import BlobHistoryStore, BlobURLError, open_store
from chatkeep.core import Message, MissingExtraError, SessionKey
from chatkeep.core import open_store as core_open_store
from chatkeep.testing.telemetry import Telemetry

SECRET_KEY = "c2VjcmV0LWtleS1uZXZlci1zaG93bg=="


def make_messages(n: int, label: str = "m") -> list[Message]:
    return [Message(role="user", text=f"{label}-{i}") for i in range(n)]


# -- the URL ---------------------------------------------------------------------------------------


async def test_spans_name_blob_and_the_account_endpoint(blob_url: str, telemetry: Telemetry) -> None:
    async with open_store(blob_url) as store:
        await store.count(SessionKey("telemetry", "s"))
        endpoint = urlsplit(store.config.credentials.endpoint or "")
    assert telemetry.span("count").attributes == {
        "db.system.name": "blob",
        "db.operation.name": "count",
        "server.address": endpoint.hostname,
        "server.port": endpoint.port or 443,
    }


@pytest.mark.parametrize(
    ("connection_string", "endpoint"),
    [
        ("AccountName=acct;AccountKey=a2V5", "https://acct.blob.core.windows.net"),
        (
            "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;EndpointSuffix=example.test",
            "http://acct.blob.example.test",
        ),
        ("AccountName=acct;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/acct", "http://127.0.0.1:10000/acct"),
    ],
)
def test_the_account_endpoint_of_a_connection_string(connection_string: str, endpoint: str) -> None:
    store = BlobHistoryStore("azblob://container", connection_string=connection_string)
    assert store.config.credentials.endpoint == endpoint


def test_url_forms_and_options() -> None:
    store = open_store("azblob://history/app/v1?segment_blocks=10&index_window=50&create_container=false")
    assert (store.config.container, store.config.settings.prefix) == ("history", "app/v1")
    assert (
        store.config.settings.segment_blocks,
        store.config.settings.index_window,
        store.config.settings.create_container,
    ) == (10, 50, False)
    assert store.config.credentials.connection_string  # from AZURE_STORAGE_CONNECTION_STRING (conftest)
    by_url = open_store(
        "azblob://history?account_url=https://acct.blob.core.windows.net", sas_token="sv=2024&sig=abc%2Fdef"
    )
    assert by_url.config.credentials.account_url == "https://acct.blob.core.windows.net"
    assert "abc" not in repr(by_url) + str(by_url.describe())
    assert core_open_store("azblob://history").__class__ is BlobHistoryStore  # found through the plugin


@pytest.mark.parametrize(
    ("url", "options", "says"),
    [
        ("azblob://History", {}, "lowercase"),
        ("azblob://ab", {}, "3 to 63"),
        ("azblob://a--b", {}, "single hyphens"),
        ("azblob://c?sig=" + SECRET_KEY, {}, "carries a secret"),
        ("azblob://cc1?account_url=https://a.blob.core.windows.net?sv=1%26sig=" + SECRET_KEY, {}, "SAS token"),
        ("azblob://user:" + SECRET_KEY + "@container", {}, "credentials"),
        ("azblob://container/../up", {}, "'..'"),
        ("azblob://container/p?prefix=q", {}, "twice"),
        ("azblob://container?segment_blocks=50001", {}, "50,000"),
        ("azblob://container?ttl=60", {}, "lifecycle"),
        ("azblob://container?max_messages=5", {}, "max_messages"),
        ("azblob://container?colour=blue", {}, "the options are"),
        ("redis://container", {}, "not an Azure Blob URL"),
        ("azblob://container", {"sas_token": "sv=1&sig=x"}, "account_url"),
    ],
)
def test_malformed_urls_say_what_to_fix_and_hide_secrets(url: str, options: dict[str, Any], says: str) -> None:
    with pytest.raises(BlobURLError, match=re.escape(says)) as caught:
        open_store(url, **options)
    assert SECRET_KEY not in str(caught.value)


def test_no_account_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    with pytest.raises(BlobURLError, match="AZURE_STORAGE_CONNECTION_STRING"):
        open_store("azblob://container")


async def test_account_url_without_sas_uses_default_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    store = open_store("azblob://container?account_url=https://acct.blob.core.windows.net")
    try:
        import azure.identity.aio  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtraError, match=r"chatkeep-blob\[identity\]"):
            store._container()
    else:
        store._container()  # this event loop's client
        assert store._clients.get()._credential is not None  # a DefaultAzureCredential the store closes with itself
    await store.close()


async def test_an_error_message_never_shows_the_account_key(service: Any) -> None:
    conn = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={SECRET_KEY};"
        "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    )
    async with open_store(f"azblob://ck-{uuid.uuid4().hex[:12]}", connection_string=conn, retries=0) as store:
        with pytest.raises(Exception) as caught:  # Azurite refuses the signature of a wrong key
            await store.append(SessionKey("t", "s"), make_messages(1))
    assert SECRET_KEY not in str(caught.value)
    assert "403" in str(caught.value) or "credentials" in str(caught.value)


# -- blob names and segments ----------------------------------------------------------------------


async def test_blob_names_are_hashes_within_the_limit(blob_url: str, service: Any, container: str) -> None:
    hostile = ["../../x", "a/b", "a%2Fb", "é" * 1024, "\x00", "😀" * 1024]
    async with open_store(blob_url) as store:
        for session_id in hostile:
            await store.append(SessionKey("😀/../" * 100, session_id), make_messages(2))
            await store.save_session(
                SessionKey("😀/../" * 100, session_id),
                __import__("chatkeep.core", fromlist=["AgentSession"]).AgentSession(
                    session_id=session_id, tenant="😀/../" * 100
                ),
            )
    names = [blob.name async for blob in service.get_container_client(container).list_blobs()]
    pattern = re.compile(r"^chatkeep/(m/[0-9a-f]{64}/[0-9a-f]{64}|d/[0-9a-f]{64}/[0-9a-f]{64}/[0-9a-f]{16}/\d{8})$")
    assert len(names) == 2 * len(hostile)
    assert all(pattern.match(name) and len(name) < 1024 for name in names), names


async def test_segments_roll_over_and_reads_cross_them(blob_url: str, service: Any, container: str) -> None:
    key = SessionKey("t", "rolling")
    async with open_store(f"{blob_url}?segment_blocks=2&index_window=5") as store:
        batches = [make_messages(3, f"b{n}") for n in range(7)]
        for batch in batches:
            assert await store.append(key, batch) == 3
        everything = [m.text for batch in batches for m in batch]
        segments = [
            b.name async for b in service.get_container_client(container).list_blobs(name_starts_with="chatkeep/d/")
        ]
        assert len(segments) == 4  # 7 appends, 2 per segment
        fresh = open_store(f"{blob_url}")
        try:
            assert [m.text for m in await fresh.load(key)] == everything
            for last in (1, 4, 5, 8, 21, 40):  # inside the window, beyond it, across segments, beyond the history
                before = fresh.messages_read
                assert [m.text for m in await fresh.load(key, last=last)] == everything[-last:]
                if last <= 5:
                    assert fresh.messages_read - before == last, "a load within the window read more than asked"
            assert [m.text async for m in fresh.iter_messages(key, batch=4)] == everything
            assert await fresh.trim(key, 7) == 14  # drops whole segments before the kept ones
            assert [m.text for m in await fresh.load(key)] == everything[-7:]
        finally:
            await fresh.close()
        left = [
            b.name async for b in service.get_container_client(container).list_blobs(name_starts_with="chatkeep/d/")
        ]
        assert len(left) == 2


async def test_ids_older_than_the_window_are_still_found(blob_url: str) -> None:
    key = SessionKey("t", "window")
    async with open_store(f"{blob_url}?index_window=4") as store:
        first = make_messages(10, "first")
        custom = [Message(message_id=f"mine-{n}", role="user", text=f"custom-{n}") for n in range(6)]
        assert await store.append(key, first) == 10
        assert await store.append(key, custom) == 6
        assert await store.append(key, make_messages(4, "pad")) == 4  # every id above has left the window
        fresh = open_store(blob_url)
        try:
            before = fresh.messages_read
            assert await fresh.append(key, first[:3] + custom[:2]) == 0  # UUIDv7 and custom ids alike
            assert fresh.messages_read - before > 0  # this rare path reads the older history
            before = fresh.messages_read
            assert await fresh.append(key, make_messages(2, "new")) == 2  # fresh ids: no history read
            assert fresh.messages_read == before
            assert await fresh.count(key) == 22
        finally:
            await fresh.close()


async def test_an_append_reads_no_history(blob_url: str) -> None:
    key = SessionKey("t", "cheap")
    async with open_store(blob_url) as store:
        for n in range(20):
            await store.append(key, make_messages(50, f"b{n}"))
        reader = open_store(blob_url)
        try:
            await reader.load(key, last=20)
            before = reader.bytes_read
            assert await reader.append(key, make_messages(2, "turn")) == 2
            assert reader.bytes_read == before, "an append downloaded segment bytes"
            records = len(make_messages(1, "x")[0].to_record()) + 20
            before = reader.bytes_read
            await reader.load(key, last=20)
            assert reader.bytes_read - before < 20 * records + 200  # about 20 messages' worth
        finally:
            await reader.close()


async def test_pops_and_appends_agree_with_a_list_across_segments(blob_url: str) -> None:
    # Tiny segments and window: pops cut segments, empty them, empty the window (then find offsets by reading),
    # and appends after a cut start new segments. Every read of a fresh store must match a plain list.
    key, rng = SessionKey("t", "popped"), random.Random(7)
    model: list[Message] = []
    popped: list[Message] = []
    async with open_store(f"{blob_url}?segment_blocks=2&index_window=3") as store:
        for step in range(40):
            if model and rng.random() < 0.45:
                message = await store.pop(key)
                assert message == model.pop(), f"step {step}: pop returned another message"
                popped.append(message)
            else:
                batch = make_messages(rng.randint(1, 3), f"s{step}")
                if popped and rng.random() < 0.5:
                    batch.insert(0, popped.pop())  # a popped message is new again
                assert await store.append(key, batch) == len(batch)
                model += batch
            reader = open_store(blob_url)
            try:
                ids = [m.message_id for m in model]
                assert [m.message_id for m in await reader.load(key)] == ids, f"step {step}: load"
                assert [m.message_id for m in await reader.load(key, last=2)] == ids[-2:], f"step {step}: last"
                assert [m.message_id async for m in reader.iter_messages(key, batch=2)] == ids, f"step {step}: iter"
                assert await reader.count(key) == len(model), f"step {step}: count"
            finally:
                await reader.close()


async def test_an_append_landing_past_a_pop_is_appended_again(blob_url: str) -> None:
    key = SessionKey("t", "stale")
    writer, popper = open_store(blob_url), open_store(blob_url)
    try:
        first = make_messages(3, "first")
        await writer.append(key, first)  # the writer now holds the metadata in its cache
        assert await popper.pop(key) == first[-1]
        # From the stale cache, the block lands just past the pop's cut, where it is dead: the commit sees
        # the cut and appends the batch again, in a new segment.
        later = make_messages(2, "later")
        assert await writer.append(key, later) == 2
        fresh = open_store(blob_url)
        try:
            ids = [m.message_id for m in first[:2] + later]
            assert [m.message_id for m in await fresh.load(key)] == ids
            assert [m.message_id async for m in fresh.iter_messages(key, batch=1)] == ids
            assert await fresh.count(key) == 4
        finally:
            await fresh.close()
    finally:
        await writer.close()
        await popper.close()


async def test_a_pop_takes_in_an_append_whose_writer_died_before_its_commit(
    blob_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = SessionKey("t", "died")
    base, block = make_messages(2, "base"), make_messages(3, "block")
    async with open_store(blob_url) as dying, open_store(blob_url) as popper:
        await dying.append(key, base)

        async def die(*args: Any) -> bool:
            raise RuntimeError("the writer died after its block landed")

        monkeypatch.setattr(dying, "_commit", die)
        with pytest.raises(RuntimeError):
            await dying.append(key, block)
        # Readers see a landed block, as the next writer will: the pop takes it in and removes its last record.
        assert await popper.pop(key) == block[-1]
        assert [m.message_id for m in await popper.load(key)] == [m.message_id for m in base + block[:2]]
        assert await popper.count(key) == 4


async def test_a_missing_container_is_created_unless_told_not_to(container: str, service: Any) -> None:
    key = SessionKey("t", "s")
    async with open_store(f"azblob://{container}?create_container=false") as strict:
        assert await strict.load(key) == []  # reading a missing container finds nothing
        with pytest.raises(BlobURLError, match="create_container=true"):
            await strict.append(key, make_messages(1))
    async with open_store(f"azblob://{container}") as store:
        assert await store.append(key, make_messages(1)) == 1
    assert await service.get_container_client(container).exists()


# -- what the design relies on in Azurite (and Azure) ---------------------------------------------


async def test_the_service_enforces_the_conditions_the_store_relies_on(service: Any, container: str) -> None:
    client = service.get_container_client(container)
    await client.create_container()
    segment = client.get_blob_client("segment")
    await segment.create_append_blob()
    with pytest.raises((ResourceExistsError, ResourceModifiedError)):
        await segment.create_append_blob(match_condition=MatchConditions.IfMissing)
    await segment.append_block(b"first\n", appendpos_condition=0)
    # Of many appends at the same position, exactly one lands; the others fail the append-position condition.
    outcomes = await asyncio.gather(
        *(segment.append_block(b"racer\n", appendpos_condition=6) for _ in range(12)), return_exceptions=True
    )
    assert sum(not isinstance(o, Exception) for o in outcomes) == 1
    assert all(isinstance(o, HttpResponseError) and o.status_code == 412 for o in outcomes if isinstance(o, Exception))
    # A read from the end is empty (Azurite) or a 416 (Azure); the store takes both as "nothing more".
    try:
        tail: bytes | int = await (await segment.download_blob(offset=12)).readall()
    except HttpResponseError as exc:
        tail = exc.status_code or 0
    assert tail in (b"", 416)
    # Of many writes If-Match the same ETag, exactly one lands.
    meta = client.get_blob_client("meta")
    etag = (await meta.upload_blob(b"{}"))["etag"]
    outcomes = await asyncio.gather(
        *(
            meta.upload_blob(b"{%d}" % n, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified)
            for n in range(12)
        ),
        return_exceptions=True,
    )
    assert sum(not isinstance(o, Exception) for o in outcomes) == 1
    assert all(isinstance(o, ResourceModifiedError) for o in outcomes if isinstance(o, Exception))
    # Listing returns the metadata list_sessions and prune read.
    await client.get_blob_client("listed").upload_blob(b"{}", metadata={"sid": "YQ", "updated": "5"})
    listed = [b async for b in client.list_blobs(name_starts_with="listed", include=["metadata"])]
    assert listed[0].metadata == {"sid": "YQ", "updated": "5"}
