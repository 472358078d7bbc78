"""Conformance under load: concurrent writers (tasks, threads, processes), cancellation, windowed reads."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import random
import time
import traceback
from collections.abc import Sequence
from typing import Any

import pytest

from chatkeep.core import Message
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.testing.conformance._base import (
    WINDOW_SLACK,
    ConformanceBase,
    StoreKit,
    make_messages,
    message_ids,
    open_from,
    texts,
)

__all__ = ["ConcurrencyConformance"]

WRITERS, APPENDS, BATCH = 16, 20, 10
PROCESSES, PROCESS_APPENDS = 4, 10
LARGE_SESSION, LARGE_BATCH, WINDOW = 100_000, 1_000, 20
KILL_ROUNDS, KILL_AFTER_ACKS, KILLED_BATCH = 3, 3, 25


def _writer_batch(writer: str, append: int, size: int = BATCH) -> list[Message]:
    return [Message(role="user", text=f"{writer}/{append}/{i}") for i in range(size)]


def _check_interleaving(stored: Sequence[Message], writers: Sequence[str], appends: int, size: int = BATCH) -> None:
    """No loss, no duplicate, each append contiguous and in order, each writer's appends in the order it made them."""
    labels = texts(stored)
    assert len(labels) == len(writers) * appends * size, "messages were lost or duplicated"
    assert len(set(message_ids(stored))) == len(stored), "a message id is stored twice"
    assert sorted(labels) == sorted(f"{w}/{a}/{i}" for w in writers for a in range(appends) for i in range(size))
    position = {label: index for index, label in enumerate(labels)}
    for writer in writers:
        starts = []
        for append in range(appends):
            start = position[f"{writer}/{append}/0"]
            expected = [f"{writer}/{append}/{i}" for i in range(size)]
            assert labels[start : start + size] == expected, f"append {writer}/{append} is not contiguous"
            starts.append(start)
        assert starts == sorted(starts), f"the appends of {writer} are out of the order they were acknowledged in"


async def _write_all(store: HistoryStore, key: SessionKey, writer: str, appends: int) -> None:
    for append in range(appends):
        assert await store.append(key, _writer_batch(writer, append)) == BATCH
        await asyncio.sleep(0)  # let the other writers in between appends


def _process_writer(
    url: str, key: tuple[str, str], writer: str, barrier: Any, results: Any
) -> None:  # pragma: no cover - runs in a child process
    async def main() -> None:
        from chatkeep.core import open_store

        store = open_store(url)
        try:
            await store.count(SessionKey(*key))  # connect before the start line
            await asyncio.to_thread(barrier.wait, 60)
            await _write_all(store, SessionKey(*key), writer, PROCESS_APPENDS)
        finally:
            await store.close()

    try:
        asyncio.run(main())
        results.put((writer, None))
    except BaseException:
        results.put((writer, traceback.format_exc()))


def _killable_writer(url: str, key: tuple[str, str], writer: str, acks: Any) -> None:  # pragma: no cover - child
    """Append batches until killed, reporting each append the store acknowledged (by its index) as it returns."""

    async def main() -> None:
        from chatkeep.core import open_store

        store = open_store(url)
        for append in range(10_000):
            await store.append(SessionKey(*key), _writer_batch(writer, append, KILLED_BATCH))
            acks.put(append)

    asyncio.run(main())


class ConcurrencyConformance(ConformanceBase):
    """Many writers on one key lose nothing and keep each append whole; cancelled appends are all or nothing."""

    async def test_concurrent_writers_keep_appends_whole(self, kit: StoreKit) -> None:
        key = kit.key()
        writers = [f"w{n}" for n in range(WRITERS)]
        stores = [await kit.open() for _ in writers]
        await asyncio.gather(*(_write_all(s, key, w, APPENDS) for s, w in zip(stores, writers, strict=True)))
        first_reader, second_reader = await kit.open(), await kit.open()
        by_load = await first_reader.load(key)
        by_iter = [m async for m in second_reader.iter_messages(key, batch=333)]
        _check_interleaving(by_load, writers, APPENDS)
        assert message_ids(by_iter) == message_ids(by_load), "two readers see different orders"
        assert await second_reader.count(key) == WRITERS * APPENDS * BATCH

    async def test_writers_on_several_event_loops(self, kit: StoreKit) -> None:
        key = kit.key()
        writers = [f"thread{n}" for n in range(4)]

        def run_writer(writer: str) -> None:
            async def main() -> None:
                store = await open_from(kit.factory)
                try:
                    await _write_all(store, key, writer, 5)
                finally:
                    await store.close()

            asyncio.run(main())

        await asyncio.gather(*(asyncio.to_thread(run_writer, w) for w in writers))
        _check_interleaving(await (await kit.open()).load(key), writers, 5)

    async def test_writers_in_several_processes(self, kit: StoreKit, request: pytest.FixtureRequest) -> None:
        if not self.multi_process:
            pytest.skip(
                f"{type(self).__name__}.multi_process is False: its stores cannot be opened from another process"
            )
        url = self._store_url(request)
        key = kit.key()
        writers = [f"proc{n}" for n in range(PROCESSES)]
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(PROCESSES), context.Queue()
        processes = [
            context.Process(target=_process_writer, args=(url, (key.tenant, key.session_id), w, barrier, results))
            for w in writers
        ]
        for process in processes:
            process.start()
        outcomes: dict[str, str | None] = {}
        try:
            deadline = time.monotonic() + 180
            while len(outcomes) < len(processes):
                assert time.monotonic() < deadline, "the child processes did not finish their appends within 180 s"
                try:
                    writer, error = await asyncio.to_thread(results.get, True, 0.5)
                    outcomes[writer] = error
                except queue.Empty:
                    # A child flushes its report before it exits: dead and silent for a while means it crashed.
                    dead = {w: p.exitcode for w, p in zip(writers, processes, strict=True) if p.exitcode is not None}
                    if any(w not in outcomes for w in dead) and results.empty():
                        await asyncio.sleep(2)
                        while not results.empty():
                            writer, error = results.get()
                            outcomes[writer] = error
                        crashed = {w: code for w, code in dead.items() if w not in outcomes}
                        assert not crashed, f"child processes died without reporting (exit codes): {crashed}"
        finally:
            for process in processes:
                await asyncio.to_thread(process.join, 30)
                if process.is_alive():
                    process.kill()
        failures = [f"{writer}:\n{error}" for writer, error in outcomes.items() if error]
        assert not failures, "child processes failed:\n" + "\n".join(failures)
        _check_interleaving(await (await kit.open()).load(key), writers, PROCESS_APPENDS)

    async def test_a_writer_killed_mid_append_loses_no_acknowledged_append(
        self, kit: StoreKit, request: pytest.FixtureRequest
    ) -> None:
        """SIGKILL a writer process at random points: every append it saw acknowledged is stored once and whole."""
        if not self.multi_process:
            pytest.skip(
                f"{type(self).__name__}.multi_process is False: its stores cannot be opened from another process"
            )
        url = self._store_url(request)
        key = kit.key()
        context = multiprocessing.get_context("spawn")
        acknowledged: dict[str, list[int]] = {}
        rng = random.Random()
        for round_ in range(KILL_ROUNDS):
            writer, acks = f"killed{round_}", context.Queue()
            process = context.Process(target=_killable_writer, args=(url, (key.tenant, key.session_id), writer, acks))
            process.start()
            seen: list[int] = []
            try:
                deadline = time.monotonic() + 120
                while len(seen) < KILL_AFTER_ACKS:
                    assert process.is_alive() or not acks.empty(), f"writer {writer} died (exit {process.exitcode})"
                    assert time.monotonic() < deadline, f"writer {writer} acknowledged nothing within 120 s"
                    with contextlib.suppress(queue.Empty):
                        seen.append(await asyncio.to_thread(acks.get, True, 0.2))
                await asyncio.sleep(rng.uniform(0, 0.02))  # land somewhere inside the appends that follow
            finally:
                process.kill()
                await asyncio.to_thread(process.join, 30)
            with contextlib.suppress(queue.Empty):
                while True:  # acknowledgements that reached the pipe before the kill
                    seen.append(acks.get_nowait())
            acknowledged[writer] = seen
        stored = texts(await (await kit.open()).load(key))
        assert len(set(message_ids(await (await kit.open()).load(key)))) == len(stored), "a message is stored twice"
        position = {label: index for index, label in enumerate(stored)}
        assert len(position) == len(stored), "an append was stored twice"
        for writer, seen in acknowledged.items():
            kept = sorted({int(label.split("/")[1]) for label in stored if label.startswith(f"{writer}/")})
            missing = sorted(set(seen) - set(kept))
            assert not missing, f"{writer}'s acknowledged appends {missing} are gone after the kill"
            assert kept == list(range(len(kept))), f"{writer}'s stored appends {kept} have a gap"
            for append in kept:
                start = position[f"{writer}/{append}/0"]
                expected = [f"{writer}/{append}/{i}" for i in range(KILLED_BATCH)]
                assert stored[start : start + KILLED_BATCH] == expected, f"append {writer}/{append} is partial"
        # The store still takes writes on that key after the kills.
        assert await (await kit.open()).append(key, make_messages(2, "after")) == 2

    def _store_url(self, request: pytest.FixtureRequest) -> str:
        url = getattr(type(self), "store_url", None)
        if not (url is None or isinstance(url, str)):  # a fixture overrides the class attribute
            url = request.getfixturevalue("store_url")
        if not url:
            pytest.fail(f"{type(self).__name__}.multi_process is True, so set store_url (an attribute or a fixture)")
        return url

    async def test_cancelled_append_is_all_or_nothing(self, kit: StoreKit) -> None:
        store = await kit.open()
        tenant = kit.tenant("cancel")
        # Cancel after 0, 1, several event-loop iterations, and after short waits on the clock.
        for steps, wait in [(n, 0.0) for n in (0, 1, 2, 3, 5, 8, 13, 40)] + [(1, 0.001), (1, 0.005), (1, 0.02)]:
            key = kit.key(tenant=tenant)
            batch = make_messages(50, f"cancel-{steps}-{wait}")
            task = asyncio.create_task(store.append(key, batch))
            for _ in range(steps):
                await asyncio.sleep(0)
            if wait:
                await asyncio.sleep(wait)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            stored = await (await kit.open()).load(key)
            assert message_ids(stored) in ([], message_ids(batch)), f"a cancelled append left {len(stored)} of 50"
            # The same store keeps working, and the retry completes the batch exactly once.
            assert await store.append(key, batch) == 50 - len(stored)
            assert message_ids(await (await kit.open()).load(key)) == message_ids(batch)

    async def test_large_session_reads_only_the_window(self, kit: StoreKit) -> None:
        key = kit.key()
        writer = await kit.open()
        last_batch: list[Message] = []
        for start in range(0, LARGE_SESSION, LARGE_BATCH):
            last_batch = [Message(role="user", text=f"#{n}") for n in range(start, start + LARGE_BATCH)]
            assert await writer.append(key, last_batch) == LARGE_BATCH
        reader = await kit.open()

        before = await self.messages_read(reader)
        window = await reader.load(key, last=WINDOW)
        assert await self.messages_read(reader) - before <= WINDOW + WINDOW_SLACK, "load(last=20) read too much"
        assert texts(window) == [f"#{n}" for n in range(LARGE_SESSION - WINDOW, LARGE_SESSION)]
        assert message_ids(window) == message_ids(last_batch[-WINDOW:])

        before = await self.messages_read(reader)
        assert await reader.count(key) == LARGE_SESSION
        assert await self.messages_read(reader) - before <= WINDOW_SLACK, "count() read the messages"

        # Idempotency must not read the history: the cost of an append does not grow with it.
        extra = make_messages(5, "extra")
        before = await self.messages_read(reader)
        assert await reader.append(key, extra) == 5
        assert await self.messages_read(reader) - before <= len(extra) + WINDOW_SLACK, "append() read the history"
        assert message_ids(await reader.load(key, last=6)) == [last_batch[-1].message_id, *message_ids(extra)]
