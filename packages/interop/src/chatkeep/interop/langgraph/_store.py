"""LangGraph's long-term memory store on any chatkeep store: :class:`ChatkeepStore`, a ``BaseStore``.

Each item is a chatkeep session of the store's tenant, whose id is the JSON list of its namespace and key
(``["users","42","prefs"]``), holding one record: the item's value (JSON), its creation time and its expiry. The
session carries a tag per prefix of its namespace, so a search or a namespace listing reads the sessions of that
prefix (``list_sessions(tag=...)``), not the whole tenant. Where the chatkeep store has the search capability
(:class:`~chatkeep.core.SupportsSearch`: memory, SQLite with sqlite-vec, PostgreSQL with pgvector) and an embedder
is given, each item's text is indexed as it is stored, and a search with a ``query`` is chatkeep's semantic
recall: hybrid, by meaning and by words, ranked by fused score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import get_text_at_path

from chatkeep.core import (
    DEFAULT_TENANT,
    Embedder,
    HistoryStore,
    InvalidArgumentError,
    Message,
    SearchUnsupportedError,
    SessionKey,
    SupportsSearch,
    SyncHistoryStore,
    TenantScope,
    embed_messages,
)
from chatkeep.interop._binding import BoundAdapter, SyncStoreBinding
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["ITEM_FORMAT", "ChatkeepStore"]

#: The envelope format of an item's record.
ITEM_FORMAT = "langgraph.store-item"

_TAG = "langgraph.ns:"  # the tag of every item under a namespace prefix: this, then the prefix as JSON
_TAG_LIMIT = 256  # chatkeep's longest tag; a longer prefix is tagged by its hash
_PAGE = 500
_CANDIDATES = 4  # search hits asked of the index per result wanted (some fall outside the prefix or the filter)


def _session_id(namespace: tuple[str, ...], key: str) -> str:
    return json.dumps([*namespace, key], ensure_ascii=False, separators=(",", ":"))


def _split(session_id: str) -> tuple[tuple[str, ...], str] | None:
    """The namespace and key of an item's session id; ``None`` for a session that is not an item."""
    try:
        parts = json.loads(session_id)
    except ValueError:
        return None
    if not isinstance(parts, list) or len(parts) < 2 or not all(isinstance(p, str) for p in parts):
        return None
    return tuple(parts[:-1]), parts[-1]


def _tag(prefix: tuple[str, ...]) -> str:
    tag = _TAG + json.dumps(list(prefix), ensure_ascii=False, separators=(",", ":"))
    if len(tag) <= _TAG_LIMIT:
        return tag
    return _TAG + "sha256:" + hashlib.sha256(tag.encode("utf-8")).hexdigest()


def _tags(namespace: tuple[str, ...]) -> set[str]:
    return {_tag(namespace[:n]) for n in range(len(namespace) + 1)}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter rule (its stores' JSON comparison): equality, nested dicts, and ``$eq`` ... ``$lte``."""
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_matches(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if value is None:
        return False
    compare = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}.get(op)
    if compare is None:
        raise InvalidArgumentError(
            f"filter operator {op!r} is not one LangGraph defines; Pass $eq, $ne, $gt, $gte, $lt or $lte"
        )
    return bool(compare(float(value), float(operand)))


class ChatkeepStore(BoundAdapter, BaseStore):
    """A LangGraph ``BaseStore`` (long-term memory) whose items live in a chatkeep store, under one tenant.

    Swap it in where LangGraph takes a store: ``builder.compile(checkpointer=..., store=ChatkeepStore(
    "postgresql://localhost/app", tenant="acme"))``, or ``create_react_agent(..., store=...)``.

    ``put`` writes the item (its time of creation kept across updates), ``get`` reads its one record, ``delete``
    removes its session; ``search`` with ``query`` ranks by chatkeep's semantic recall (by meaning and by words)
    where the store has the search capability and an ``embedder`` is given, and otherwise, as LangGraph's stores
    without an index do, lists the prefix's items (most recently updated first) filtered by ``filter``. An item's
    ``ttl`` (minutes; ``ttl={"default_ttl": ...}`` for all) hides it once it has expired (it is deleted when next
    read) and, with ``refresh_on_read`` (the default), a read restarts it.

    It needs a store with session tags (memory, SQL, Redis): on one without (Blob), ``put`` raises
    ``UnsupportedOperationError``.

    Args:
        store: a store's sync view, ``open_store(url).sync()`` (yours to close), or a store URL or backend name,
            which this store opens and :meth:`close` closes.
        tenant: the tenant every item belongs to (use one apart from your chat sessions' tenants: every session of
            it whose id is a JSON list is taken for an item).
        store_options: options for a store opened from a URL, as keywords.
        embedder: the embedder that indexes items and queries (``chatkeep.core.default_embedder()``, or any
            :class:`~chatkeep.core.Embedder`); ``None`` indexes nothing. Ignored on a store without the search
            capability.
        ttl: LangGraph's TTL settings: ``default_ttl`` (minutes) and ``refresh_on_read`` (default ``True``).

    Raises:
        InvalidSessionKeyError: an empty or over-long ``tenant``.
        StoreConfigurationError: an async ``HistoryStore`` (pass ``store.sync()``) or ``store`` of another type.
    """

    supports_ttl = True

    def __init__(
        self,
        store: SyncHistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
        embedder: Embedder | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        SyncStoreBinding.key("-", tenant)
        self._binding = SyncStoreBinding(store, store_options=store_options)
        self.tenant = tenant
        self.embedder = embedder
        self.ttl_config = ttl
        self._indexing = embedder is not None  # until the store says it cannot search (a PostgreSQL without pgvector)

    def __repr__(self) -> str:
        return f"<ChatkeepStore tenant={self.tenant!r} on {self._binding.view!r}>"

    @property
    def store(self) -> SyncHistoryStore:
        """The sync view every call runs on."""
        return self._binding.view

    @property
    def _store(self) -> HistoryStore:
        return self._binding.view.store

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run LangGraph's operations in order, on the view's loop."""
        return self._run(self._batch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` for async code."""
        return await self._arun(self._batch(list(ops)))

    async def _batch(self, ops: Sequence[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(op.namespace, op.key, op.refresh_ttl))
            elif isinstance(op, PutOp):
                await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list_namespaces(op))
            else:
                raise InvalidArgumentError(
                    f"{type(op).__name__} is not an operation of LangGraph's BaseStore; Pass GetOp, PutOp, SearchOp "
                    "or ListNamespacesOp"
                )
        return results

    # -- items ------------------------------------------------------------------------------------------------------

    def _key(self, namespace: tuple[str, ...], key: str) -> SessionKey:
        return SyncStoreBinding.key(_session_id(tuple(namespace), str(key)), self.tenant)

    async def _record(self, session: SessionKey) -> dict[str, Any] | None:
        """The item's record, or ``None`` when there is none or it expired (then it is deleted)."""
        newest = await self._store.load(session, last=1)
        item = unwrap(newest[0], format=ITEM_FORMAT) if newest else None
        if item is None:
            return None
        expires = item.get("expires_at")
        if expires is not None and datetime.fromisoformat(expires) <= _now():
            await self._store.delete(session)
            return None
        return item

    async def _get(self, namespace: tuple[str, ...], key: str, refresh_ttl: bool) -> Item | None:
        session = self._key(namespace, key)
        record = await self._record(session)
        if record is None:
            return None
        if refresh_ttl and record.get("ttl") is not None:
            record = await self._write(session, namespace, record["value"], record["ttl"], record, record["index"])
        return _item(namespace, key, record)

    async def _put(self, op: PutOp) -> None:
        session = self._key(op.namespace, op.key)
        if op.value is None:
            await self._store.delete(session)
            return
        ttl = op.ttl if op.ttl is not None else (self.ttl_config or {}).get("default_ttl")
        index: bool | list[str] = op.index if op.index is not None else True
        await self._write(session, tuple(op.namespace), dict(op.value), ttl, await self._record(session), index)

    async def _write(
        self,
        session: SessionKey,
        namespace: tuple[str, ...],
        value: dict[str, Any],
        ttl: float | None,
        old: dict[str, Any] | None,
        index: bool | list[str],
    ) -> dict[str, Any]:
        """Store the item's new record (then drop the old one); its creation time carries over from ``old``."""
        now = _now()
        record = {
            "value": value,
            "created_at": old["created_at"] if old else now.isoformat(),
            "updated_at": now.isoformat(),
            "ttl": ttl,
            "expires_at": (now + timedelta(minutes=ttl)).isoformat() if ttl is not None else None,
            "index": index,
        }
        message = wrap(record, format=ITEM_FORMAT, role="user", text=_text(value, index))
        await self._append(session, message)
        if old is None:
            await self._store.update_info(session, tags=_tags(namespace))
        else:
            await self._store.trim(session, 1)
        return record

    async def _append(self, session: SessionKey, message: Message) -> None:
        """Append an item's record, indexed where the store can search and an embedder is given."""
        store = self._store
        if self._indexing and self.embedder is not None and message.text and isinstance(store, SupportsSearch):
            try:
                await store.append(session, [message], embeddings=await embed_messages(self.embedder, [message]))
                return
            except SearchUnsupportedError:  # the store's class can search, its server cannot: list instead
                self._indexing = False
        await store.append(session, [message])

    # -- search and listing -----------------------------------------------------------------------------------------

    async def _prefix_sessions(self, prefix: tuple[str, ...]) -> list[str]:
        """The ids of the item sessions under a namespace prefix, the most recently updated first."""
        found: list[str] = []
        cursor: str | None = None
        while True:
            page = await self._store.list_sessions(self.tenant, tag=_tag(prefix), limit=_PAGE, cursor=cursor)
            found.extend(info.session_id for info in page.items)
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = op.offset + op.limit
        store = self._store
        if op.query and self._indexing and self.embedder is not None and isinstance(store, SupportsSearch):
            vector = (await self.embedder.embed([op.query]))[0]
            hits = await store.search(TenantScope(self.tenant), vector, op.query, max(wanted * _CANDIDATES, 50))
            ranked: list[tuple[str, float | None]] = [(hit.session_id, hit.score) for hit in hits]
        else:
            ranked = [(session_id, None) for session_id in await self._prefix_sessions(prefix)]
        found: list[SearchItem] = []
        seen: set[str] = set()
        for session_id, score in ranked:
            place = _split(session_id)
            if place is None or session_id in seen or place[0][: len(prefix)] != prefix:
                continue
            seen.add(session_id)
            session = SyncStoreBinding.key(session_id, self.tenant)
            record = await self._record(session)
            if record is None or not all(_matches(record["value"].get(k), v) for k, v in (op.filter or {}).items()):
                continue
            if op.refresh_ttl and record.get("ttl") is not None:
                record = await self._write(session, place[0], record["value"], record["ttl"], record, record["index"])
            found.append(_found(place[0], place[1], record, score))
            if len(found) == wanted:
                break
        return found[op.offset :]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces: set[tuple[str, ...]] = set()
        for session_id in await self._prefix_sessions(()):
            place = _split(session_id)
            if place is None:
                continue
            namespace = place[0]
            if all(_condition(condition, namespace) for condition in op.match_conditions or ()):
                namespaces.add(namespace[: op.max_depth] if op.max_depth is not None else namespace)
        return sorted(namespaces)[op.offset : op.offset + op.limit]


def _item(namespace: tuple[str, ...], key: str, record: dict[str, Any]) -> Item:
    return Item(
        value=record["value"],
        key=key,
        namespace=namespace,
        created_at=datetime.fromisoformat(record["created_at"]),
        updated_at=datetime.fromisoformat(record["updated_at"]),
    )


def _found(namespace: tuple[str, ...], key: str, record: dict[str, Any], score: float | None) -> SearchItem:
    return SearchItem(
        namespace=namespace,
        key=key,
        value=record["value"],
        created_at=datetime.fromisoformat(record["created_at"]),
        updated_at=datetime.fromisoformat(record["updated_at"]),
        score=score,
    )


def _text(value: dict[str, Any], index: bool | list[str]) -> str:
    """What is indexed of an item: the text at the ``index`` paths (LangGraph's path syntax), or all of it."""
    if index is False:
        return ""
    paths = ["$"] if index is True else index
    return "\n".join(text for path in paths for text in get_text_at_path(value, path) if text)


def _condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path) :]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))
