"""The blocking API: ``SyncHistoryStore`` and ``Agent.run_sync``, from plain threads and from inside a running loop."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence

import pytest

from chatkeep.core import (
    Agent,
    AgentSession,
    ConcurrencyConflictError,
    HistoryStore,
    InvalidArgumentError,
    Message,
    SessionKey,
    StoreClosedError,
    StoreHistoryProvider,
    StoreLoopError,
    SyncCallError,
    SyncHistoryStore,
    open_store,
)
from chatkeep.core.offline import OfflineChatClient
from chatkeep.memory import MemoryHistoryStore
from chatkeep.testing.scripted import ScriptedChatClient

KEY = SessionKey("acme", "chat-1")


def namespace() -> str:
    return f"sync-{uuid.uuid4().hex}"


def loop_threads() -> list[str]:
    """The names of the private loop threads alive now (views and agents)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("chatkeep-")]


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


@pytest.fixture
def view() -> Iterator[SyncHistoryStore]:
    store = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    yield store
    store.close()


def run_in_threads(count: int, target: object) -> list[BaseException]:
    """Run ``target(n)`` on ``count`` plain threads at once; the errors they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def body(n: int) -> None:
        barrier.wait()
        try:
            target(n)  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 60 s"
    return errors


# -- the store contract, blocking --------------------------------------------------------------------


def test_every_public_store_method_has_a_blocking_twin_with_the_same_signature() -> None:
    async_methods = {
        name: member
        for name, member in inspect.getmembers(HistoryStore, inspect.isfunction)
        if not name.startswith("_") and (inspect.iscoroutinefunction(member) or name == "iter_messages")
    }
    assert {"append", "load", "iter_messages", "close", "save_session"} <= set(async_methods)
    for name, member in async_methods.items():
        twin = getattr(SyncHistoryStore, name, None)
        assert twin is not None, (
            f"SyncHistoryStore has no {name}(); add {name} = _blocking(HistoryStore.{name}) (HistoryStore has one)"
        )
        assert not inspect.iscoroutinefunction(twin), f"SyncHistoryStore.{name} must block, not be async"
        assert not inspect.iscoroutinefunction(inspect.unwrap(twin)), f"SyncHistoryStore.{name} unwraps to async"
        assert inspect.signature(twin).parameters == inspect.signature(member).parameters, (
            f"SyncHistoryStore.{name} takes other arguments than HistoryStore.{name}"
        )
        summary = (inspect.getdoc(member) or "").splitlines()[0]
        assert (inspect.getdoc(twin) or "").splitlines()[0] == summary, f"SyncHistoryStore.{name}'s summary differs"


def test_eight_threads_append_through_one_view_and_every_append_stays_whole() -> None:
    ran_on: set[int] = set()

    class Recording(MemoryHistoryStore):
        async def append(self, key: SessionKey, messages: Sequence[Message]) -> int:
            ran_on.add(id(asyncio.get_running_loop()))
            return await super().append(key, messages)

    view = SyncHistoryStore(Recording(namespace=namespace()))

    def writer(n: int) -> None:
        for i in range(50):
            pair = [Message(role="user", text=f"w{n}-{i}-q"), Message(role="assistant", text=f"w{n}-{i}-a")]
            assert view.append(KEY, pair) == 2

    try:
        assert run_in_threads(8, writer) == []
        stored = view.load(KEY)
    finally:
        view.close()
    assert len(stored) == 800
    assert len({m.message_id for m in stored}) == 800, "a message was stored twice"
    position = {m.text: i for i, m in enumerate(stored)}
    for n in range(8):
        starts = [position[f"w{n}-{i}-q"] for i in range(50)]
        assert starts == sorted(starts), f"writer {n}'s appends are out of order"
        assert all(position[f"w{n}-{i}-a"] == position[f"w{n}-{i}-q"] + 1 for i in range(50)), "an append was split"
    assert len(ran_on) == 1, "the appends ran on more than one event loop"
    assert threading.get_ident() not in ran_on


def test_the_view_works_inside_a_running_event_loop_like_a_notebook_cell(view: SyncHistoryStore) -> None:
    view.append(KEY, [Message(role="user", text="hello")])

    async def cell() -> list[Message]:
        assert asyncio.get_running_loop().is_running()
        view.append(KEY, [Message(role="user", text="again")])
        return view.load(KEY)

    assert texts(asyncio.run(cell())) == ["hello", "again"]
    assert texts(asyncio.run(cell())) == ["hello", "again", "again"]  # a second cell, on another loop


def test_one_view_serves_two_event_loops_running_at_once(view: SyncHistoryStore) -> None:
    # The async store refuses a second running loop (StoreLoopError); through the view both loops just work.
    both_running = threading.Barrier(2)

    def notebook(n: int) -> None:
        async def cell() -> None:
            both_running.wait(timeout=10)
            view.append(KEY, [Message(role="user", text=f"from loop {n}")])

        asyncio.run(cell())

    assert run_in_threads(2, notebook) == []
    assert sorted(texts(view.load(KEY))) == ["from loop 0", "from loop 1"]


def test_arun_lets_async_callers_on_any_loop_share_the_views_loop_with_blocking_callers(view: SyncHistoryStore) -> None:
    async def caller(n: int) -> int:
        # Two loops one after another, and blocking calls between: the store stays on the view's loop throughout.
        await view.arun(view.store.append(KEY, [Message(role="user", text=f"async {n}")]))
        view.append(KEY, [Message(role="user", text=f"sync {n}")])
        return await view.arun(view.store.count(KEY))

    assert asyncio.run(caller(1)) == 2
    assert asyncio.run(caller(2)) == 4
    assert texts(view.load(KEY)) == ["async 1", "sync 1", "async 2", "sync 2"]


def test_arun_keeps_the_callers_loop_free_while_the_store_works() -> None:
    callers_loop_ran = threading.Event()

    class WaitsForTheCaller(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            # Returns only once the caller's loop has run another task: a blocked caller's loop never would.
            assert await asyncio.to_thread(callers_loop_ran.wait, 10), "the caller's event loop was blocked"
            return 7

    view = SyncHistoryStore(WaitsForTheCaller(namespace=namespace()))

    async def main() -> int:
        counting = asyncio.ensure_future(view.arun(view.store.count(KEY)))
        await asyncio.sleep(0)
        callers_loop_ran.set()
        return await counting

    try:
        assert asyncio.run(main()) == 7
    finally:
        view.close()


def test_cancelling_an_arun_caller_cancels_the_call_on_the_loop_thread() -> None:
    started, cancelled = threading.Event(), threading.Event()

    class Slow(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return 0

    view = SyncHistoryStore(Slow(namespace=namespace()))

    async def main() -> None:
        counting = asyncio.ensure_future(view.arun(view.store.count(KEY)))
        await asyncio.to_thread(started.wait, 10)
        counting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await counting

    try:
        asyncio.run(main())
        assert cancelled.wait(10), "the store's call went on running after its caller was cancelled"
    finally:
        view.close()


async def test_arun_on_a_closed_view_raises_store_closed_error() -> None:
    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    await asyncio.to_thread(view.close)
    with pytest.raises(StoreClosedError, match="SyncHistoryStore"):
        await view.arun(view.store.count(KEY))


async def _move_newest(store: HistoryStore, source: SessionKey, target: SessionKey) -> str | None:
    """A rule of several store calls (pop, then append), as adapters write them."""
    popped = await store.pop(source)
    if popped is not None:
        await store.append(target, [popped])
    return None if popped is None else popped.text


def test_run_runs_a_rule_of_several_store_calls_whole_on_the_views_loop(view: SyncHistoryStore) -> None:
    target = SessionKey(KEY.tenant, "archive")
    view.append(KEY, [Message(role="user", text="a"), Message(role="user", text="b")])
    assert view.run(_move_newest(view.store, KEY, target)) == "b"
    assert (texts(view.load(KEY)), texts(view.load(target))) == (["a"], ["b"])

    async def cell() -> str | None:  # inside a running loop too: the rule runs on the view's loop, not this one
        return view.run(_move_newest(view.store, KEY, target))

    assert asyncio.run(cell()) == "a"
    assert (view.count(KEY), texts(view.load(target))) == (0, ["b", "a"])


def test_run_raises_the_stores_own_errors_and_refuses_calls_it_cannot_make() -> None:
    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))

    async def bad(store: HistoryStore) -> None:
        await store.load(KEY, last=-1)

    async def reentrant(store: HistoryStore) -> int:
        return view.run(store.count(KEY))  # a blocking call from the loop that would have to run it

    with pytest.raises(InvalidArgumentError):
        view.run(bad(view.store))
    with pytest.raises(SyncCallError, match=r"await store\.load"):
        view.run(reentrant(view.store))
    view.close()
    with pytest.raises(StoreClosedError, match="SyncHistoryStore"):
        view.run(view.store.count(KEY))


def test_iter_messages_streams_5000_messages_in_order_one_batch_at_a_time() -> None:
    pulled = 0
    finished = False

    class Counting(MemoryHistoryStore):
        async def iter_messages(self, key: SessionKey, *, batch: int = 1000) -> AsyncIterator[Message]:
            nonlocal pulled, finished
            try:
                async for message in super().iter_messages(key, batch=batch):
                    pulled += 1
                    yield message
            finally:
                finished = True

    view = SyncHistoryStore(Counting(namespace=namespace()))
    try:
        written = [Message(role="user", text=f"m{i}") for i in range(5000)]
        for start in range(0, 5000, 500):
            view.append(KEY, written[start : start + 500])

        messages = view.iter_messages(KEY, batch=100)
        first = next(messages)
        assert first.message_id == written[0].message_id
        assert pulled <= 100, f"the first message brought {pulled} messages over, more than one batch"
        rest = list(messages)
        assert [m.message_id for m in [first, *rest]] == [m.message_id for m in written]

        pulled, finished = 0, False
        early = view.iter_messages(KEY, batch=100)
        head = [next(early) for _ in range(150)]
        early.close()  # what a `break` out of the for loop does
        assert texts(head) == [f"m{i}" for i in range(150)]
        assert pulled <= 200
        assert finished, "stopping early did not close the store's iterator"
        assert view.count(KEY) == 5000  # the view still works
    finally:
        view.close()


def test_iter_messages_refuses_a_bad_batch_with_the_stores_own_error(view: SyncHistoryStore) -> None:
    view.append(KEY, [Message(role="user", text="x")])
    with pytest.raises(InvalidArgumentError, match="batch must be a whole number of 1 or more, got 0"):
        list(view.iter_messages(KEY, batch=0))


# -- errors ------------------------------------------------------------------------------------------


def test_a_stale_version_raises_the_stores_concurrency_conflict(view: SyncHistoryStore) -> None:
    session = AgentSession(session_id=KEY.session_id, tenant=KEY.tenant, state={"n": 1})
    first = view.save_session(KEY, session)
    second = view.save_session(KEY, session, expected_version=first)
    with pytest.raises(ConcurrencyConflictError):
        view.save_session(KEY, session, expected_version=first)
    stored = view.load_session(KEY)
    assert stored is not None
    assert stored.version == second


def test_a_store_closed_underneath_raises_its_own_store_closed_error() -> None:
    store = MemoryHistoryStore(namespace=namespace())
    asyncio.run(store.close())
    view = SyncHistoryStore(store)
    try:
        with pytest.raises(StoreClosedError, match="MemoryHistoryStore is closed"):
            view.load(KEY)
        assert view.closed
    finally:
        view.close()


def test_a_closed_view_refuses_every_call_with_store_closed_error() -> None:
    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    view.append(KEY, [Message(role="user", text="kept")])
    view.close()
    assert view.closed
    assert view.store.closed, "closing the view did not close its store"
    for call in (lambda: view.load(KEY), lambda: view.count(KEY), lambda: list(view.iter_messages(KEY))):
        with pytest.raises(StoreClosedError, match="SyncHistoryStore"):
            call()
    with pytest.raises(StoreClosedError), view:
        pass


def test_a_call_from_the_views_own_loop_thread_raises_instead_of_hanging() -> None:
    view: SyncHistoryStore

    class Reentrant(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            return len(view.load(key))  # blocking call on the loop that would have to run it

    view = SyncHistoryStore(Reentrant(namespace=namespace()))
    try:
        with pytest.raises(SyncCallError, match=r"await store\.load"):
            view.count(KEY)
        assert view.load(KEY) == []  # the view still works
    finally:
        view.close()


# -- lifecycle -----------------------------------------------------------------------------------------


def test_a_call_from_a_plain_thread_runs_the_loop_right_there_without_a_helper_thread() -> None:
    ran_in: list[int] = []

    class Recording(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            ran_in.append(threading.get_ident())
            return await super().count(key)

    before = loop_threads()
    view = SyncHistoryStore(Recording(namespace=namespace()))
    try:
        assert view.count(KEY) == 0
        assert ran_in == [threading.get_ident()], "the call was handed to another thread"
        assert loop_threads() == before, "a helper thread started for a call that did not need one"
    finally:
        view.close()


def test_only_a_views_call_run_in_the_callers_own_thread_may_block() -> None:
    """``in_blocking_call`` is what lets a backend block in place (SQLite): only where the caller waits anyway."""
    from chatkeep.core._loop_thread import LoopThread
    from chatkeep.core.backend import in_blocking_call

    async def probe() -> bool:
        return in_blocking_call()

    async def probe_children() -> list[bool]:
        return list(await asyncio.gather(probe(), probe()))

    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    try:
        assert view.run(probe()) is True  # a plain thread's call: it runs the loop and waits
        assert view.run(probe_children()) == [True, True]  # what that call starts is its own

        async def in_a_running_loop() -> tuple[bool, bool]:  # a notebook cell: the call is handed over
            return view.run(probe()), await view.arun(probe())

        assert asyncio.run(in_a_running_loop()) == (False, False)
        assert asyncio.run(probe()) is False  # the application's own loop
    finally:
        view.close()
    agents_loop = LoopThread("chatkeep-test-agent")  # an agent's run_sync: its streamed answer must keep moving
    try:
        assert agents_loop.run(probe()) is False
    finally:
        agents_loop.stop()


def test_run_in_place_runs_in_the_callers_thread_with_no_loop_running() -> None:
    """What a blocking call runs in place runs while its loop is stopped: a blocking-call guard sees no loop."""
    from chatkeep.core.backend import run_in_place

    def blocking(n: int) -> tuple[int, bool, str]:
        try:
            asyncio.get_running_loop()
            running = True
        except RuntimeError:
            running = False
        return threading.get_ident(), running, f"{n}:{marker.get()}"

    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="-")

    async def task(n: int) -> tuple[int, bool, str]:
        marker.set(f"task{n}")  # the function runs in its task's context
        await asyncio.sleep(0)
        return await run_in_place(lambda: blocking(n))

    async def failing() -> None:
        await run_in_place(lambda: 1 / 0)

    async def many() -> list[tuple[int, bool, str]]:
        return list(await asyncio.gather(*(task(n) for n in range(3))))

    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    try:
        here = threading.get_ident()
        assert view.run(many()) == [(here, False, f"{n}:task{n}") for n in range(3)]
        with pytest.raises(ZeroDivisionError):
            view.run(failing())
        assert view.run(task(7)) == (here, False, "7:task7")  # the loop goes on after a failure

        async def handed() -> None:  # a call handed to the loop's helper thread may not block in place
            await run_in_place(lambda: None)

        async def in_a_running_loop() -> None:
            await view.arun(handed())

        with pytest.raises(RuntimeError, match="in_blocking_call"):
            asyncio.run(in_a_running_loop())
    finally:
        view.close()


def test_a_call_whose_coroutine_stops_the_views_loop_still_runs_to_its_end(view: SyncHistoryStore) -> None:
    async def stop_then_count() -> int:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0)
        return await view.store.count(KEY)

    assert view.run(stop_then_count()) == 0
    assert view.load(KEY) == []  # the view still works


def test_a_call_handed_over_while_another_runs_the_loop_runs_beside_it_and_finishes() -> None:
    started, release = threading.Event(), threading.Event()

    class Slow(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            started.set()
            while not release.is_set():  # noqa: ASYNC110 - a threading.Event set by the test's thread
                await asyncio.sleep(0.005)
            return await super().count(key)

    view = SyncHistoryStore(Slow(namespace=namespace()))
    try:
        slow: list[int] = []
        driver = threading.Thread(target=lambda: slow.append(view.count(KEY)))
        driver.start()
        assert started.wait(timeout=10)
        # This thread finds the loop running the slow call: its append is handed to it and done meanwhile.
        assert view.append(KEY, [Message(role="user", text="beside")]) == 1
        assert not slow, "the slow call finished before the handed one was let go"
        release.set()
        driver.join(timeout=10)
        assert slow == [1]
        assert texts(view.load(KEY)) == ["beside"]
    finally:
        view.close()


def test_close_is_idempotent_and_leaves_no_thread_behind() -> None:
    before = loop_threads()
    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    view.append(KEY, [Message(role="user", text="x")])

    async def cell() -> int:
        return view.count(KEY)  # the caller's loop runs here: a helper thread runs the view's loop

    assert asyncio.run(cell()) == 1
    assert len(loop_threads()) == len(before) + 1
    view.close()
    view.close()
    assert loop_threads() == before

    with SyncHistoryStore(MemoryHistoryStore(namespace=namespace())) as scoped:
        scoped.count(KEY)
    assert scoped.closed
    assert loop_threads() == before

    SyncHistoryStore(MemoryHistoryStore(namespace=namespace())).close()  # never used
    assert loop_threads() == before


def test_a_view_or_agent_dropped_without_close_does_not_leak_its_thread() -> None:
    before = loop_threads()
    view = SyncHistoryStore(MemoryHistoryStore(namespace=namespace()))
    agent = OfflineChatClient().as_agent(name="dropped")

    async def cell(view: SyncHistoryStore, agent: Agent) -> None:  # inside a running loop: both start a helper
        view.count(KEY)
        agent.run_sync("hi")

    asyncio.run(cell(view, agent))
    assert len(loop_threads()) == len(before) + 2
    del view, agent
    gc.collect()
    deadline = time.monotonic() + 10
    while loop_threads() != before and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()  # a cycle made meanwhile (by another thread's work) may hold the last reference
    assert loop_threads() == before


def test_close_lets_a_call_in_flight_on_another_thread_finish() -> None:
    in_flight = threading.Event()

    class Slow(MemoryHistoryStore):
        async def count(self, key: SessionKey) -> int:
            in_flight.set()
            await asyncio.sleep(0.3)
            return await super().count(key)

    view = SyncHistoryStore(Slow(namespace=namespace()))
    view.append(KEY, [Message(role="user", text="x")])
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.append(view.count(KEY)))
    reader.start()
    assert in_flight.wait(timeout=10)
    view.close()
    reader.join(timeout=10)
    assert results == [1], "closing the view broke a call that was running"
    assert view.store.closed


# -- one store and event loops (what the view exists for) --------------------------------------------


def test_two_asyncio_runs_in_a_row_share_one_async_store() -> None:
    store = MemoryHistoryStore(namespace=namespace())
    asyncio.run(store.append(KEY, [Message(role="user", text="first run")]))
    assert texts(asyncio.run(store.load(KEY))) == ["first run"]
    asyncio.run(store.close())


class _OneLoopStore(MemoryHistoryStore):
    """A backend written for one event loop (as a third party's may be): it does not set serves_any_loop."""

    serves_any_loop = False


def _from_two_running_loops(store: MemoryHistoryStore) -> BaseException | int:
    """What ``count`` on a second running loop gives while the first loop, which appended, still runs."""
    bound, tried = threading.Event(), threading.Event()
    outcome: list[BaseException | int] = []

    def first_loop() -> None:
        async def main() -> None:
            await store.append(KEY, [Message(role="user", text="x")])
            bound.set()
            await asyncio.to_thread(tried.wait, 10)  # keep this loop running while the other one tries
            assert await store.count(KEY) == 1

        asyncio.run(main())

    def second_loop() -> None:
        assert bound.wait(timeout=10)
        try:
            outcome.append(asyncio.run(store.count(KEY)))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            tried.set()

    threads = [threading.Thread(target=first_loop), threading.Thread(target=second_loop)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(outcome) == 1
    return outcome[0]


def test_a_store_serving_one_loop_refuses_a_second_running_loop_and_says_why() -> None:
    outcome = _from_two_running_loops(_OneLoopStore(namespace=namespace()))
    assert isinstance(outcome, StoreLoopError), f"expected StoreLoopError, got {outcome!r}"
    assert "serves one event loop at a time" in str(outcome)
    assert "one store per event loop" in str(outcome)


def test_a_store_that_serves_any_loop_serves_a_second_running_loop() -> None:
    store = MemoryHistoryStore(namespace=namespace())
    assert _from_two_running_loops(store) == 1
    asyncio.run(store.close())


# -- Agent.run_sync --------------------------------------------------------------------------------


def test_run_sync_from_plain_threads_stores_and_resumes_history() -> None:
    url = f"memory://{namespace()}"
    agent = OfflineChatClient().as_agent(name="demo", history=url)
    session = agent.create_session(tenant="acme")
    first: list[str] = []
    worker = threading.Thread(target=lambda: first.append(agent.run_sync("I like Italian food.", session=session).text))
    worker.start()
    worker.join(timeout=30)
    assert len(first) == 1
    assert "start of our conversation" in first[0]

    second = agent.run_sync("What do I like?", session=session)  # another thread, the same loop thread
    assert "\u201cI like Italian food.\u201d" in second.text
    assert "2 earlier messages" in second.text

    provider = agent.history_provider
    assert isinstance(provider, StoreHistoryProvider)
    agent.close_sync()
    agent.close_sync()
    assert not [name for name in loop_threads() if name == "chatkeep-agent-demo"]
    with pytest.raises(StoreClosedError):
        asyncio.run(provider.store.count(KEY))

    async def stored() -> list[Message]:
        async with open_store(url) as store:
            return await store.load(SessionKey("acme", session.session_id))

    assert len(asyncio.run(stored())) == 4


def test_run_sync_inside_running_event_loops_keeps_one_loop_for_the_agents_store() -> None:
    agent = OfflineChatClient().as_agent(name="cells", history=f"memory://{namespace()}")
    session = agent.create_session()

    async def cell(text: str) -> str:
        return agent.run_sync(text, session=session).text

    asyncio.run(cell("My name is Ada."))
    # A second cell runs on a new loop; the agent's store stays on the agent's own loop thread.
    assert "\u201cMy name is Ada.\u201d" in asyncio.run(cell("Who am I?"))
    agent.close_sync()
    assert not [name for name in loop_threads() if name == "chatkeep-agent-cells"]


async def test_await_close_after_run_sync_closes_the_store_on_its_loop_and_stops_the_thread() -> None:
    agent = OfflineChatClient().as_agent(name="mixed", history=f"memory://{namespace()}")
    session = agent.create_session()
    response = agent.run_sync("hello", session=session)  # this test's loop is running: a notebook cell
    assert "start of our conversation" in response.text
    provider = agent.history_provider
    assert isinstance(provider, StoreHistoryProvider)
    await agent.close()
    assert provider.store.closed
    assert not [name for name in loop_threads() if name == "chatkeep-agent-mixed"]


def test_run_sync_from_several_threads_at_once_keeps_each_conversation_apart() -> None:
    agent = OfflineChatClient().as_agent(name="web", history=f"memory://{namespace()}")
    sessions = [agent.create_session() for _ in range(4)]

    def request_handler(n: int) -> None:
        for turn in range(3):
            answer = agent.run_sync(f"user {n} turn {turn}", session=sessions[n]).text
            assert f"{2 * turn} earlier messages" in answer or turn == 0
            assert all(f"user {other} " not in answer for other in range(4) if other != n)

    try:
        assert run_in_threads(4, request_handler) == []
    finally:
        agent.close_sync()


def test_run_sync_from_a_tool_of_a_run_sync_run_raises_sync_call_error() -> None:
    client = ScriptedChatClient()

    def ask_again() -> str:
        return agent.run_sync("nested").text  # a sync tool runs on the agent's loop thread

    agent = Agent(client, name="nested", tools=[ask_again])
    client.reply_tool_calls(("c1", "ask_again", "{}"))
    try:
        with pytest.raises(SyncCallError, match=r"await agent\.run"):
            agent.run_sync("go")
        assert agent.run_sync("still works").text == "echo: still works"
    finally:
        agent.close_sync()


# -- search through the view ----------------------------------------------------------------------------


def test_the_view_of_a_store_that_can_search_searches_reindexes_and_reports_its_index() -> None:
    from chatkeep.core import SyncSearchableStore, TenantScope, embed_messages
    from chatkeep.testing.embedding import HashingEmbedder

    embedder = HashingEmbedder()
    with MemoryHistoryStore(namespace=namespace()).sync() as view:
        assert isinstance(view, SyncSearchableStore)
        indexed = [Message(role="user", text="the spare key hangs behind the kitchen door")]
        assert view.append(KEY, indexed, embeddings=view.run(embed_messages(embedder, indexed))) == 1
        later = Message(role="assistant", text="the bicycle is in the shed")
        view.append(KEY, [later])
        [vector] = view.run(embedder.embed(["where is the spare key?"]))
        [hit] = view.search(TenantScope("acme"), vector, "spare key", 1, embedder=embedder.name)
        assert hit == (indexed[0], KEY.session_id, hit.score)
        assert view.search(KEY, None, "bicycle shed", 5) == []  # stored, not indexed yet
        seen: list[int] = []
        assert view.reindex(embedder, "acme", progress=seen.append) == 1
        assert seen == [1]
        assert [h.message for h in view.search(KEY, None, "bicycle shed", 5)] == [later]
        info = view.index_info()
        assert info is not None
        assert (info.embedder, info.dimensions) == (embedder.name, embedder.dimensions)


def test_the_search_twins_have_the_async_methods_signatures_and_a_store_without_search_has_none() -> None:
    from chatkeep.core import SyncSearchableStore
    from chatkeep.core.backend import SearchableStore
    from chatkeep.core.encryption import EncryptedStore

    for name in ("search", "reindex", "index_info"):
        twin, member = getattr(SyncSearchableStore, name), getattr(SearchableStore, name)
        assert not inspect.iscoroutinefunction(twin)
        assert inspect.signature(twin).parameters == inspect.signature(member).parameters
        assert inspect.getdoc(twin) == inspect.getdoc(member)
    plain = EncryptedStore(
        MemoryHistoryStore(namespace=namespace()),
        key_store=MemoryHistoryStore(namespace=namespace()),
        master_keys={"k1": bytes(32)},
    )
    with SyncHistoryStore(plain) as view:
        assert type(view) is SyncHistoryStore
        assert not hasattr(view, "search")
