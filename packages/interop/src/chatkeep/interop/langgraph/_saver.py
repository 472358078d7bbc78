"""LangGraph's checkpointer on any chatkeep store: :class:`ChatkeepSaver`, a ``BaseCheckpointSaver``.

Each thread is a chatkeep session (``SessionKey(tenant, thread_id)``) holding the thread's checkpoints and pending
writes as an append-only log (:mod:`._records`): ``put`` and ``put_writes`` are one append each, the latest
checkpoint is read from the log's newest end, and ``copy_thread`` is a chatkeep fork (no copy, whatever the
thread's length).

Sync and async methods share one store through its sync view: a sync call runs on the view's private event-loop
thread (so one made inside a running event loop never waits on that loop), an async one on the caller's loop when
the store serves any loop (:class:`~chatkeep.interop._binding.BoundAdapter`). LangGraph's sync graphs
(``invoke``) and async graphs (``ainvoke``) work on one saver.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from chatkeep.core import (
    DEFAULT_TENANT,
    ConcurrencyConflictError,
    HistoryStore,
    InvalidArgumentError,
    SessionKey,
    SyncHistoryStore,
    UnsupportedOperationError,
)
from chatkeep.interop._binding import BoundAdapter, SyncStoreBinding
from chatkeep.interop.langgraph._records import (
    Record,
    checkpoint_record,
    copies,
    decode,
    is_thread,
    newest_first,
    pending_writes,
    typed,
    untyped,
    writes_record,
)

__all__ = ["ChatkeepSaver"]

T = TypeVar("T")

_LATEST_WINDOW = 4  # a thread's newest records read first by get_tuple: two checkpoints and their writes
_LIST_WINDOW = 64  # ... for list without a limit (with one: about two records per checkpoint asked for)
_PAGE = 500  # sessions per list_sessions page in the calls that walk a tenant
_STRATEGIES = ("keep_latest", "delete")
_END = object()
# (``list`` inside the class body is the saver's method)
Records = list[Record]
ThreadIds = list[str]


class ChatkeepSaver(BoundAdapter, BaseCheckpointSaver[int]):
    """A LangGraph checkpointer that keeps every thread in a chatkeep store, under one tenant.

    Swap it in where a graph takes a checkpointer: ``graph = builder.compile(checkpointer=ChatkeepSaver(
    "postgresql://localhost/app", tenant="acme"))``; ``{"configurable": {"thread_id": "user-1"}}`` then names the
    chatkeep session ``user-1`` of tenant ``acme``.

    Every method has LangGraph's semantics (those of its ``InMemorySaver``): ``get_tuple`` without a
    ``checkpoint_id`` gives a namespace's latest checkpoint; ``list`` gives the newest first, filtered by
    namespace (when the config names one), ``filter`` (metadata equality), ``before`` and ``limit``; a write stored
    again for the same task and index keeps its first value, except errors and interrupts, which keep the newest.
    The checkpoint, its metadata and each write are kept as LangGraph's serializer wrote them, byte for byte.

    Costs: ``put`` and ``put_writes`` are one atomic append each, whatever the thread's length. ``get_tuple`` reads
    the thread's newest records back to the namespace's checkpoint before the one asked for (whose writes may
    have been stored before it): for the latest, one read of four records; ``list(limit=k)`` reads about the
    records its k + 1 checkpoints span. ``copy_thread`` is a chatkeep fork: the
    target refers to the source's records, in the same time at 10 checkpoints as at 100,000. ``prune`` and
    ``delete_for_runs`` rewrite the threads they change (append the kept records, then trim the old ones): run
    them while those threads are idle, since a checkpoint put in between would be trimmed. ``list(None)`` and
    ``delete_for_runs`` walk every thread of the tenant.

    Args:
        store: a store's sync view, ``open_store(url).sync()``, which stays yours (close it when done; share one
            between savers), or a store URL or backend name (``"sqlite:///graph.db"``, ``"memory"``), which the
            saver opens and :meth:`close` closes.
        tenant: the tenant every thread of this saver belongs to (from your authentication, never from a client).
        store_options: options for a store opened from a URL, as keywords (``{"ttl": 86400}``).
        serde: LangGraph's serializer for checkpoints and writes (LangGraph's default when ``None``).

    Raises:
        InvalidSessionKeyError: an empty or over-long ``tenant``.
        StoreConfigurationError: an async ``HistoryStore`` (pass ``store.sync()``) or ``store`` of another type.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
    """

    def __init__(
        self,
        store: SyncHistoryStore | str,
        *,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        SyncStoreBinding.key("-", tenant)  # checks the tenant before anything is opened
        super().__init__(serde=serde)
        self._binding = SyncStoreBinding(store, store_options=store_options)
        self.tenant = tenant

    def __repr__(self) -> str:
        return f"<ChatkeepSaver tenant={self.tenant!r} on {self._binding.view!r}>"

    @property
    def store(self) -> SyncHistoryStore:
        """The sync view every call runs on (``.store`` on it is the async store)."""
        return self._binding.view

    def _key(self, thread_id: object) -> SessionKey:
        return SyncStoreBinding.key(str(thread_id), self.tenant)

    # -- LangGraph's interface, sync and async: each pair runs one coroutine below ---------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or its namespace's latest; ``None`` if none."""
        return self._run(self._get_tuple(config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` for async code."""
        return await self._arun(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints matching the criteria, the newest first (every thread of the tenant when ``config`` is
        ``None``); read as they are consumed."""
        walk = self._list(config, filter=filter, before=before, limit=limit)
        view = self._binding.view
        try:
            while (found := view.run(_next(walk))) is not _END:
                yield found  # type: ignore[misc]
        finally:
            view.run(_close(walk))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list` for async code."""
        walk = self._list(config, filter=filter, before=before, limit=limit)
        try:
            while (found := await self._arun(_next(walk))) is not _END:
                yield found  # type: ignore[misc]
        finally:
            await self._arun(_close(walk))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (one atomic append); returns the config naming it."""
        return self._run(self._put(config, checkpoint, metadata))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` for async code."""
        return await self._arun(self._put(config, checkpoint, metadata))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Store a task's writes to the checkpoint ``config`` names (one atomic append)."""
        self._run(self._put_writes(config, writes, task_id, task_path))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """:meth:`put_writes` for async code."""
        await self._arun(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes, in every namespace."""
        self._run(self._delete_thread(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` for async code."""
        await self._arun(self._delete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Start thread ``target_thread_id`` with every checkpoint and write of ``source_thread_id`` (a fork).

        Nothing happens when the source has no checkpoints.

        Raises:
            ConcurrencyConflictError: the target thread already exists.
        """
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` for async code."""
        await self._arun(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (and its writes) of each thread, or delete the threads.

        Raises:
            InvalidArgumentError: ``strategy`` is not ``"keep_latest"`` or ``"delete"``.
        """
        self._run(self._prune(thread_ids, _strategy(strategy)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` for async code."""
        await self._arun(self._prune(thread_ids, _strategy(strategy)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata names one of ``run_ids``, in every thread."""
        self._run(self._delete_for_runs(run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` for async code."""
        await self._arun(self._delete_for_runs(run_ids))

    # -- the rules, once, as coroutines on the store (run on the view's loop) -----------------------------------------

    @property
    def _store(self) -> HistoryStore:
        return self._binding.view.store

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id, ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        walk = self._thread_tuples(str(thread_id), ns, get_checkpoint_id(config), None, None, _LATEST_WINDOW)
        try:
            return await anext(walk, None)
        finally:
            await walk.aclose()

    async def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> AsyncGenerator[CheckpointTuple, None]:
        if limit is not None and limit <= 0:
            return
        before_id = get_checkpoint_id(before) if before else None
        window = _LIST_WINDOW if limit is None else 2 * limit + 2
        if config is None:
            threads: ThreadIds = await self._threads()
            ns: str | None = None
            checkpoint_id: str | None = None
        else:
            configurable = config["configurable"]
            threads = [str(configurable["thread_id"])]
            ns, checkpoint_id = configurable.get("checkpoint_ns"), get_checkpoint_id(config)
        left = limit
        for thread_id in threads:
            walk = self._thread_tuples(thread_id, ns, checkpoint_id, before_id, filter, window)
            async with aclosing(walk) as found:
                async for checkpoint in found:
                    yield checkpoint
                    if left is not None:
                        left -= 1
                        if left == 0:
                            return

    async def _thread_tuples(
        self,
        thread_id: str,
        ns: str | None,
        checkpoint_id: str | None,
        before_id: str | None,
        filter: Mapping[str, Any] | None,
        window: int,
    ) -> AsyncGenerator[CheckpointTuple, None]:
        """A thread's checkpoints, newest first, each with its pending writes.

        LangGraph stores a checkpoint in the background while the next step's tasks run, so a task's writes may
        reach the store before the checkpoint they belong to: a checkpoint is given once the walk has passed the
        namespace's previous checkpoint (or the log's start), with the writes found on either side of it.
        """
        writes: defaultdict[tuple[str, str], list[Record]] = defaultdict(list)
        seen: set[tuple[str, str]] = set()
        waiting: dict[str, tuple[Record, CheckpointMetadata]] = {}  # namespace -> a checkpoint awaiting older writes
        async with aclosing(newest_first(self._store, self._key(thread_id), window)) as records:
            async for record in records:
                if ns is not None and record.ns != ns:
                    continue
                slot = (record.ns, record.checkpoint_id)
                if record.kind == "writes":
                    writes[slot].append(record)
                    continue
                if record.ns in waiting:
                    found, metadata = waiting.pop(record.ns)
                    yield self._tuple(thread_id, found, metadata, writes.pop((found.ns, found.checkpoint_id), []))
                if slot in seen:  # an older copy of a checkpoint stored again
                    continue
                seen.add(slot)
                if checkpoint_id is not None and record.checkpoint_id != checkpoint_id:
                    continue
                if before_id is not None and record.checkpoint_id >= before_id:
                    continue
                metadata = self.serde.loads_typed(untyped(record.item["metadata"]))
                if filter and any(metadata.get(name) != value for name, value in filter.items()):
                    continue
                waiting[record.ns] = (record, metadata)
        for found, metadata in waiting.values():
            yield self._tuple(thread_id, found, metadata, writes.pop((found.ns, found.checkpoint_id), []))

    def _tuple(self, thread_id: str, record: Record, metadata: CheckpointMetadata, writes: Records) -> CheckpointTuple:
        parent = record.item.get("parent")
        return CheckpointTuple(
            config=_config(thread_id, record.ns, record.checkpoint_id),
            checkpoint=self.serde.loads_typed(untyped(record.item["checkpoint"])),
            metadata=metadata,
            parent_config=_config(thread_id, record.ns, parent) if parent else None,
            pending_writes=[
                (task, channel, self.serde.loads_typed(value)) for task, channel, value in pending_writes(writes)
            ],
        )

    async def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id, ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        kept = get_checkpoint_metadata(config, metadata)
        summary = f"LangGraph checkpoint {checkpoint['id']} ({kept.get('source')}, step {kept.get('step')})"
        record = checkpoint_record(
            ns,
            checkpoint["id"],
            configurable.get("checkpoint_id"),
            typed(self.serde.dumps_typed(checkpoint)),
            typed(self.serde.dumps_typed(kept)),
            summary,
        )
        await self._store.append(self._key(thread_id), [record])
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    async def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> None:
        if not writes:
            return
        configurable = config["configurable"]
        entries = [
            [WRITES_IDX_MAP.get(channel, idx), channel, *typed(self.serde.dumps_typed(value))]
            for idx, (channel, value) in enumerate(writes)
        ]
        record = writes_record(
            configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"], str(task_id), task_path, entries
        )
        await self._store.append(self._key(configurable["thread_id"]), [record])

    async def _delete_thread(self, thread_id: str) -> None:
        await self._store.delete(self._key(thread_id))

    async def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = self._key(source_thread_id), self._key(target_thread_id)
        if not await self._store.count(source):
            return
        try:
            await self._store.fork(source, target)
        except ConcurrencyConflictError as exc:
            raise ConcurrencyConflictError(
                f"thread {target_thread_id!r} already exists (tenant {self.tenant!r}): copy_thread starts a new "
                "thread; delete_thread it first, or copy to a new thread id"
            ) from exc
        except UnsupportedOperationError:  # a backend without forks (Blob): the records themselves, in one append
            await self._store.append(target, await self._store.load(source))

    async def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        for thread_id in thread_ids:
            key = self._key(thread_id)
            if strategy == "delete":
                await self._store.delete(key)
                continue
            records = [decode(message, key) for message in await self._store.load(key)]
            latest: dict[str, str] = {}
            for record in reversed(records):
                if record.kind == "checkpoint":
                    latest.setdefault(record.ns, record.message_id)
            kept_ids = set(latest.values())
            kept_slots = {(r.ns, r.checkpoint_id) for r in records if r.message_id in kept_ids}
            kept = [
                r
                for r in records
                if r.message_id in kept_ids or (r.kind == "writes" and (r.ns, r.checkpoint_id) in kept_slots)
            ]
            await self._rewrite(key, kept, len(records))

    async def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        doomed_runs = {str(run_id) for run_id in run_ids}
        if not doomed_runs:
            return
        for thread_id in await self._threads():
            key = self._key(thread_id)
            records = [decode(message, key) for message in await self._store.load(key)]
            doomed = {
                (r.ns, r.checkpoint_id)
                for r in records
                if r.kind == "checkpoint"
                and self.serde.loads_typed(untyped(r.item["metadata"])).get("run_id") in doomed_runs
            }
            if doomed:
                await self._rewrite(key, [r for r in records if (r.ns, r.checkpoint_id) not in doomed], len(records))

    async def _rewrite(self, key: SessionKey, kept: Records, total: int) -> None:
        """Leave only ``kept`` of a thread's ``total`` records: append copies of them, then trim the rest.

        Never a moment without the kept records: a reader in between sees them twice (newest copies win).
        """
        if len(kept) == total:
            return
        if not kept:
            await self._store.delete(key)
            return
        await self._store.append(key, copies(kept))
        await self._store.trim(key, len(kept))

    async def _threads(self) -> ThreadIds:
        """The tenant's sessions that are LangGraph threads (sessions written by others are passed over)."""
        found: ThreadIds = []
        cursor: str | None = None
        while True:
            page = await self._store.list_sessions(self.tenant, limit=_PAGE, cursor=cursor)
            for info in page.items:
                if info.message_count:
                    newest = await self._store.load(self._key(info.session_id), last=1)
                    if newest and is_thread(newest[0]):
                        found.append(info.session_id)
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _strategy(strategy: object) -> str:
    if strategy not in _STRATEGIES:
        raise InvalidArgumentError(
            f"prune strategy {strategy!r} is not one LangGraph defines; Pass strategy='keep_latest' (each "
            "namespace's latest checkpoint stays) or strategy='delete' (the threads go)"
        )
    return str(strategy)


async def _close(walk: AsyncGenerator[Any, None]) -> None:
    await walk.aclose()


async def _next(walk: AsyncIterator[T]) -> T | object:
    """The walk's next item, or :data:`_END` (``StopAsyncIteration`` must not cross the view's loop thread)."""
    return await anext(walk, _END)
