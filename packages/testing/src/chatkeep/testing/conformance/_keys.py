"""Conformance of keys: ids are compared exactly, none reaches another key, and tenants never see each other."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chatkeep.core import AgentSession, InvalidSessionKeyError, Message, SessionOwnershipError
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.testing.conformance._base import ConformanceBase, StoreKit, make_messages, message_ids, texts

__all__ = ["KeyConformance", "TenantIsolationConformance"]

# Ids that break naive key building: path tricks, glob and format characters, quotes, escapes, separators.
HOSTILE_IDS = [
    "../",
    "../../etc/passwd",
    "..",
    ".",
    "/",
    "*",
    "?",
    "[a]",
    "{}",
    "{0}",
    "%s",
    "'",
    '"',
    "`",
    "%",
    "%00",
    ";",
    "; DROP TABLE sessions; --",
    "\\",
    "a\\b",
    ":",
    "a:b",
    "a::b",
    "#",
    "$",
    "\x00",
    "a\x00b",
    "\n",
    "\t",
    "-",
    "_",
    "NULL",
    "😀",
    "x" * 1024,
    "é" * 1024,
]

# Groups of ids that collapse into one under case folding, trimming, unicode normalization or URL decoding.
LOOKALIKE_IDS = [
    "Alice",
    "alice",
    "ALICE",
    "a",
    "a ",
    " a",
    "A",
    "caf\u00e9",  # NFC
    "cafe\u0301",  # NFD
    "a/b",
    "a%2Fb",
    "a%2fb",
    "a b",
    "a+b",
    "a%20b",
    "ﬁ",  # the ligature, "fi" under NFKC
    "fi",
    "ß",
    "ss",
]


async def _write_one_each(store: HistoryStore, keys: list[SessionKey]) -> None:
    for n, key in enumerate(keys):
        await store.append(key, [Message(role="user", text=f"for key #{n}")])
        await store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant, state={"n": n}))


async def _assert_kept_apart(store: HistoryStore, keys: list[SessionKey]) -> None:
    for n, key in enumerate(keys):
        assert texts(await store.load(key)) == [f"for key #{n}"], f"key {key!r} was mixed with another"
        assert await store.count(key) == 1, f"key {key!r} was mixed with another"
        stored = await store.load_session(key)
        assert stored is not None, f"the document of {key!r} is missing"
        assert stored.session.state == {"n": n}, f"key {key!r} reads another key's document"
        assert (stored.session.session_id, stored.session.tenant) == (key.session_id, key.tenant)


class KeyConformance(ConformanceBase):
    """Any non-empty unicode id up to 1,024 characters is its own key, compared exactly."""

    async def test_hostile_session_ids_are_kept_apart(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("hostile")
        keys = [SessionKey(tenant, session_id) for session_id in HOSTILE_IDS]
        await _write_one_each(store, keys)
        await _assert_kept_apart(await kit.open(), keys)
        listed = await _list_all(await kit.open(), tenant)
        assert sorted(listed) == sorted(HOSTILE_IDS)

    async def test_lookalike_session_ids_are_different_sessions(self, kit: StoreKit, store: HistoryStore) -> None:
        tenant = kit.tenant("lookalike")
        keys = [SessionKey(tenant, session_id) for session_id in LOOKALIKE_IDS]
        await _write_one_each(store, keys)
        await _assert_kept_apart(await kit.open(), keys)
        assert sorted(await _list_all(store, tenant)) == sorted(LOOKALIKE_IDS)

    async def test_hostile_tenants_are_kept_apart(self, kit: StoreKit, store: HistoryStore) -> None:
        base = kit.tenant("base")
        # A tenant/session boundary must not be guessable: ("T:a", "b") is not ("T", "a:b").
        tenants = [base + suffix for suffix in ("", ":a", "/a", "\\a", "\x00a", "*", "%", " ", "/../x", "A")]
        for tenant in tenants:
            kit.remember_tenant(tenant)
        keys = [SessionKey(t, s) for t in tenants for s in ("a:b", "b", "a/b", "\x00a", "*")]
        await _write_one_each(store, keys)
        await _assert_kept_apart(await kit.open(), keys)
        assert sorted(await _list_all(store, base)) == ["\x00a", "*", "a/b", "a:b", "b"]

    async def test_invalid_ids_are_refused(self) -> None:
        for tenant, session_id in [("t", ""), ("", "s"), ("t", "x" * 1025), ("x" * 1025, "s"), ("t", "\ud800")]:
            with pytest.raises(InvalidSessionKeyError):
                SessionKey(tenant, session_id)
        SessionKey("x" * 1024, "y" * 1024)  # the longest ids are valid

    async def test_empty_tenant_is_refused_by_tenant_wide_calls(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        await store.append(key, make_messages(2))
        with pytest.raises(InvalidSessionKeyError):
            await store.delete_tenant("")
        with pytest.raises(InvalidSessionKeyError):
            await store.list_sessions("")
        with pytest.raises(InvalidSessionKeyError):
            await store.prune(older_than=timedelta(0), tenant="")
        with pytest.raises(InvalidSessionKeyError):
            await store.delete_tenant("x" * 1025)
        assert await (await kit.open()).count(key) == 2


async def _list_all(store: HistoryStore, tenant: str) -> list[str]:
    ids: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await store.list_sessions(tenant, limit=50, cursor=cursor)
        ids += [info.session_id for info in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return ids
    raise AssertionError("list_sessions kept returning a cursor")


class TenantIsolationConformance(ConformanceBase):
    """The same session id under two tenants is two sessions, in every call."""

    async def test_tenants_do_not_cross(self, kit: StoreKit, store: HistoryStore) -> None:
        ours, theirs = SessionKey(kit.tenant("ours"), "shared"), SessionKey(kit.tenant("theirs"), "shared")
        our_batch, their_batch = make_messages(6, "ours"), make_messages(4, "theirs")
        await store.append(ours, our_batch)
        await store.append(theirs, their_batch)
        await store.save_session(
            ours, AgentSession(session_id="shared", tenant=ours.tenant, state={"who": "ours"}), owner="bob"
        )
        await store.save_session(
            theirs, AgentSession(session_id="shared", tenant=theirs.tenant, state={"who": "theirs"}), owner="alice"
        )
        fresh = await kit.open()
        assert message_ids(await fresh.load(ours)) == message_ids(our_batch)
        assert message_ids(await fresh.load(theirs, last=2)) == message_ids(their_batch[-2:])
        assert [await fresh.count(ours), await fresh.count(theirs)] == [6, 4]
        stored = await fresh.load_session(ours, owner="bob")  # owners are bound per tenant
        assert stored is not None
        assert stored.session.state == {"who": "ours"}
        with pytest.raises(SessionOwnershipError):
            await fresh.load_session(theirs, owner="bob")

        assert await store.trim(ours, 2) == 4
        assert await fresh.count(theirs) == 4
        assert [[i.session_id for i in (await fresh.list_sessions(t)).items] for t in (ours.tenant, theirs.tenant)] == [
            ["shared"],
            ["shared"],
        ]
        assert (await fresh.list_sessions(theirs.tenant)).items[0].message_count == 4

        assert await store.delete(ours) is True
        assert await fresh.count(theirs) == 4
        stored = await fresh.load_session(theirs)
        assert stored is not None
        assert stored.session.state == {"who": "theirs"}
        assert await fresh.load_session(ours) is None

        other = SessionKey(ours.tenant, "other")
        await store.append(other, make_messages(1))
        assert await store.prune(older_than=datetime.now(timezone.utc) + timedelta(seconds=1), tenant=ours.tenant) == 1
        assert await fresh.count(theirs) == 4
        await store.append(other, make_messages(1))
        assert await store.delete_tenant(ours.tenant) == 1
        assert await fresh.count(theirs) == 4
        assert [i.session_id for i in (await fresh.list_sessions(theirs.tenant)).items] == ["shared"]

    async def test_document_under_another_tenant_is_not_found(self, kit: StoreKit, store: HistoryStore) -> None:
        ours, theirs = SessionKey(kit.tenant("ours"), "doc"), SessionKey(kit.tenant("theirs"), "doc")
        await store.save_session(ours, AgentSession(session_id="doc", tenant=ours.tenant), owner="alice")
        assert await store.load_session(theirs) is None
        assert await store.load_session(theirs, owner="alice") is None
        assert await store.delete(theirs) is False
        assert await store.load_session(ours, owner="alice") is not None

    async def test_document_for_another_tenant_is_refused(self, kit: StoreKit, store: HistoryStore) -> None:
        key = kit.key()
        stranger = AgentSession(session_id=key.session_id, tenant=kit.tenant("stranger"))
        with pytest.raises(SessionOwnershipError):
            await store.save_session(key, stranger)
        assert await (await kit.open()).load_session(key) is None
