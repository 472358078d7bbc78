"""What every conformance mixin shares: the subclass contract, the store tracker, the override guard, helpers."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, ClassVar, Protocol, TypeVar

import pytest
import pytest_asyncio

from chatkeep.core import AgentSession, Message
from chatkeep.core.backend import HistoryStore, SessionKey, SupportsReadProbe

__all__ = [
    "WINDOW_SLACK",
    "Clock",
    "ConformanceBase",
    "DocumentDamager",
    "FakeClock",
    "StoreFactory",
    "StoreKit",
    "TTLTimeline",
    "make_messages",
    "message_ids",
    "not_implemented_yet",
    "texts",
]

#: How many records beyond the requested window a backend may read (a page boundary, a look-ahead row).
WINDOW_SLACK = 10

_KIT_PACKAGE = "chatkeep.testing.conformance"
#: The large sessions filled on backing data that outlives a test, by (backing, size, batch): key and last batch.
_FILLED: dict[tuple[str, int, int], tuple[SessionKey, list[Message]]] = {}
_T = TypeVar("_T")
_C = TypeVar("_C", bound="type[ConformanceBase]")


class Clock:
    """The time the TTL tests run on: :func:`time.monotonic` and real sleeps (what a server's expiry needs)."""

    def now(self) -> float:
        """Seconds on a clock that never goes back."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        await asyncio.sleep(max(0.0, seconds))


class FakeClock(Clock):
    """A clock that moves only when the test sleeps on it: the TTL tests run at once, without waiting.

    For a backend whose expiry reads a time source it is given (``MemoryHistoryStore(clock=...)``): call the
    clock for its time. Give the same one to every store of the test and return it from the ``ttl_clock``
    fixture, so the kit's sleeps move the time the stores expire sessions by.
    """

    def __init__(self, start: float = 1_000.0) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.time += max(0.0, seconds)
        await asyncio.sleep(0)  # still a point where other tasks run, as a real sleep is


class TTLTimeline:
    """The clock of a TTL scenario, which tells a wrong expiry from a machine too slow to time a 1 s TTL.

    A scenario runs its writes and reads through :meth:`write` and :meth:`read`. A step that ended a TTL or more
    after the last write began may have run after that write's data could lawfully expire, so the scenario's
    failure then proves nothing: :meth:`run` runs it again (with new keys) instead of failing. Expiry checks
    need no care (a late check only gives the data longer to expire).
    """

    #: Attempts before a scenario that was too late every time fails anyway.
    ATTEMPTS = 3

    def __init__(self, ttl: float = 1.0, clock: Clock | None = None) -> None:
        self.ttl = ttl
        self.clock = clock or Clock()
        self.started = self.refreshed = self.clock.now()
        self.late = False

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on the scenario's clock."""
        await self.clock.sleep(seconds)

    async def sleep_until(self, offset: float) -> None:
        """Sleep until ``offset`` seconds after the scenario started (not at all when that is past)."""
        await self.clock.sleep(offset - (self.clock.now() - self.started))

    async def read(self, call: Awaitable[_T]) -> _T:
        """Await a read that relies on the last write's data being unexpired."""
        result = await call
        self.late = self.late or self.clock.now() - self.refreshed >= self.ttl
        return result

    async def write(self, call: Awaitable[_T]) -> _T:
        """Await a write (which relies on the data before it, and restarts the TTL)."""
        began = self.clock.now()
        result = await self.read(call)
        self.refreshed = began
        return result

    @classmethod
    async def run(cls, scenario: Callable[[TTLTimeline], Awaitable[None]], clock: Clock | None = None) -> None:
        """Run ``scenario`` until it passes, or fails in time; after :attr:`ATTEMPTS` late failures, fail."""
        for attempt in range(1, cls.ATTEMPTS + 1):
            timeline = cls(clock=clock)
            try:
                await scenario(timeline)
            except AssertionError as failure:
                if not timeline.late:
                    raise
                if attempt == cls.ATTEMPTS:
                    raise AssertionError(
                        f"{failure} (in each of {cls.ATTEMPTS} attempts a step ran more than the {timeline.ttl} s TTL "
                        "after the write it relied on: the machine was too busy to time the TTL)"
                    ) from failure
            else:
                return


#: What the ``damage_session_document`` fixture returns: ``await damage(store, key)`` writes text that is not JSON
#: where the backend keeps the session document of ``key`` (which exists), behind the store's back (a file edit,
#: a SQL ``UPDATE``, a Redis ``HSET``), as a disk fault or a bad restore would. The damaged-session tests of
#: :class:`HistoryStoreConformance` and :class:`CLIConformance` use it; ``store`` is open on the test's backing.
DocumentDamager = Callable[[HistoryStore, SessionKey], Awaitable[None]]


class StoreFactory(Protocol):
    """The callable the ``make_store`` fixture returns.

    It opens a new store instance on the same backing data every time it is called, with the given
    options (``ttl=``, ``max_message_bytes=``); it may return the store or an awaitable of it.
    """

    def __call__(self, **options: Any) -> HistoryStore | Awaitable[HistoryStore]: ...


class StoreKit:
    """Opens stores through the subclass's factory, hands out unique tenants, and cleans up after a test.

    Every tenant a test uses comes from :meth:`tenant`, so tests never meet data left by other tests or
    runs on a shared server; at the end those tenants are deleted and every store opened here is closed.
    """

    def __init__(self, factory: StoreFactory, clock: Clock | None = None, shared_backing: str | None = None) -> None:
        self.factory = factory
        #: The time the TTL tests run on (the ``ttl_clock`` fixture): real, or a :class:`FakeClock`.
        self.clock = clock or Clock()
        #: The backing data's name when it outlives the test (the ``shared_backing`` fixture), else ``None``.
        self.shared_backing = shared_backing
        self._stores: list[HistoryStore] = []
        self._tenants: list[str] = []
        self._run = uuid.uuid4().hex[:10]

    async def open(self, **options: Any) -> HistoryStore:
        """A new store instance on the test's backing data (closed by the kit at the end of the test)."""
        store = await open_from(self.factory, **options)
        self._stores.append(store)
        return store

    def tenant(self, label: str = "t") -> str:
        """A tenant name no other test or run uses; the kit deletes it at the end of the test."""
        tenant = f"ck-{self._run}-{len(self._tenants)}-{label}"
        self._tenants.append(tenant)
        return tenant

    def key(self, session_id: str | None = None, *, tenant: str | None = None) -> SessionKey:
        """A key in a fresh tenant (or in ``tenant``), with a random session id unless given."""
        return SessionKey(tenant or self.tenant(), session_id or f"s-{uuid.uuid4().hex[:12]}")

    async def large_session(self, writer: HistoryStore, size: int, batch: int) -> tuple[SessionKey, list[Message]]:
        """A session of ``size`` messages with texts ``#0``, ``#1``..., appended ``batch`` at a time; its last batch.

        On backing data that outlives the test (:attr:`shared_backing`), it is filled once per backing and reused
        by later tests while it still holds ``size`` messages (a ``prune`` of every tenant may take it): a test may
        read and fork it, never change it. Otherwise it is filled for the test, in a tenant of its own.
        """
        shared = None if self.shared_backing is None else (self.shared_backing, size, batch)
        if shared is not None and shared in _FILLED:
            filled = _FILLED[shared]
            if await writer.count(filled[0]) == size:
                return filled
        key = self.key() if shared is None else SessionKey(f"ck-large-{uuid.uuid4().hex[:10]}", "large")
        last: list[Message] = []
        for start in range(0, size, batch):
            last = [Message(role="user", text=f"#{n}") for n in range(start, min(start + batch, size))]
            await writer.append(key, last)
        if shared is not None:
            _FILLED[shared] = key, last
        return key, last

    def remember_tenant(self, tenant: str) -> None:
        """Have the kit delete ``tenant`` at the end (for tenants built by the test itself)."""
        self._tenants.append(tenant)

    async def aclose(self) -> None:
        """Delete the test's tenants through a fresh store, then close every store the test opened."""
        try:
            if self._tenants:
                cleaner = await self.open()
                for tenant in dict.fromkeys(self._tenants):
                    await cleaner.delete_tenant(tenant)
        finally:
            for store in self._stores:
                await store.close()


async def open_from(factory: StoreFactory, **options: Any) -> HistoryStore:
    """Call ``factory`` and await its result when it is awaitable."""
    made = factory(**options)
    store = await made if inspect.isawaitable(made) else made
    if not isinstance(store, HistoryStore):
        raise TypeError(f"make_store must return a HistoryStore (or an awaitable of one), got {type(store).__name__}")
    return store


def make_messages(n: int, label: str = "m") -> list[Message]:
    """``n`` small messages alternating user and assistant, with texts ``"{label}-0"``, ``"{label}-1"``..."""
    return [Message(role="user" if i % 2 == 0 else "assistant", text=f"{label}-{i}") for i in range(n)]


def texts(messages: Sequence[Message]) -> list[str]:
    """The texts of ``messages``, in order."""
    return [m.text for m in messages]


def message_ids(messages: Sequence[Message]) -> list[str]:
    """The ids of ``messages``, in order."""
    return [m.message_id for m in messages]


def _is_strict_xfail_with_reason(test: object) -> bool:
    marks = getattr(test, "pytestmark", [])
    if any(mark.name in ("skip", "skipif") for mark in marks):
        return False
    return any(
        mark.name == "xfail" and mark.kwargs.get("reason") and mark.kwargs.get("strict") is True for mark in marks
    )


def not_implemented_yet(*mixins: type[ConformanceBase], reason: str) -> Callable[[_C], _C]:
    """Declare, on a backend's conformance class, that it does not implement the calls ``mixins`` test yet.

    A class decorator: each test of ``mixins`` becomes a strict expected failure with ``reason``, expected to
    fail only with :class:`~chatkeep.core.UnsupportedOperationError` (the error the base class raises for a hook
    a backend lacks). The tests still run: one that starts passing, or fails with another error, fails the run::

        @not_implemented_yet(ForkConformance, UsageConformance, reason="not implemented yet on Acme: issue 22")
        class TestAcmeConformance(HistoryStoreConformance): ...
    """
    if not reason:
        raise TypeError("not_implemented_yet needs a reason= saying why the backend lacks these calls")

    def declare(cls: _C) -> _C:
        for mixin in mixins:
            for name, test in vars(mixin).items():
                if name.startswith("test_"):
                    setattr(cls, name, _expected_failure(test, reason))
        return cls

    return declare


def _expected_failure(test: Callable[..., Awaitable[None]], reason: str) -> Callable[..., Awaitable[None]]:
    from chatkeep.core import UnsupportedOperationError

    @functools.wraps(test)
    async def declared(self: Any, *args: Any, **kwargs: Any) -> None:
        await test(self, *args, **kwargs)

    marked: Callable[..., Awaitable[None]] = pytest.mark.xfail(
        strict=True, reason=reason, raises=UnsupportedOperationError
    )(declared)
    return marked


class ConformanceBase:
    """The subclass contract shared by every conformance mixin.

    A subclass provides:

    * the ``make_store`` fixture, returning a :class:`StoreFactory` (new instance, same backing data);
    * the read probe: a store with a ``messages_read`` property (:class:`~chatkeep.core.backend.SupportsReadProbe`)
      needs nothing more; otherwise override :meth:`messages_read`;
    * ``store_url`` (a class attribute or a fixture) when ``multi_process`` is true;
    * the ``damage_session_document`` fixture (see :data:`DocumentDamager`), in the class or a ``conftest.py``;
    * the capability flags ``native_ttl`` and ``multi_process``.

    Anything else a backend cannot do is declared by overriding that one test with
    ``@pytest.mark.xfail(strict=True, reason="...")`` and calling ``super()``; any other override, a skip
    mark, or a removed test makes the subclass fail at import with the names of the tests concerned.
    """

    #: The backend expires sessions by itself (``ttl=`` option, refreshed on every write).
    native_ttl: ClassVar[bool] = False
    #: Several OS processes can share the backing data through ``store_url``.
    multi_process: ClassVar[bool] = False
    # ``store_url`` (a class attribute or a fixture, not declared here so either type-checks in a subclass):
    # a URL that ``chatkeep.core.open_store`` in a child process opens on the same backing data.

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio(loop_scope="function")]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith(_KIT_PACKAGE):
            return
        standard: dict[str, object] = {}
        for klass in reversed(cls.__mro__):
            if klass.__module__.startswith(_KIT_PACKAGE):
                standard.update({name: value for name, value in vars(klass).items() if name.startswith("test_")})
        wrong = sorted(
            name
            for name, kit_test in standard.items()
            if getattr(cls, name, None) is not kit_test and not _is_strict_xfail_with_reason(getattr(cls, name, None))
        )
        wrong += sorted(name for name, kit_test in standard.items() if getattr(kit_test, "pytestmark", None))
        if wrong:
            raise TypeError(
                f"{cls.__qualname__} overrides, skips or removes the standard conformance tests {', '.join(wrong)}. "
                "A backend may only declare what it cannot do: override the test with "
                '@pytest.mark.xfail(strict=True, reason="why the backend cannot") and call super() in its body.'
            )

    def skip_without_native_ttl(self) -> None:
        """Skip the calling test, saying why, unless the backend expires sessions itself (``native_ttl``)."""
        if not self.native_ttl:
            pytest.skip(f"{type(self).__name__}.native_ttl is False: the backend expires nothing by itself")

    async def check_write_restarts_ttl(
        self, kit: StoreKit, write: Callable[[HistoryStore, SessionKey], Awaitable[object]], *, kept: int, what: str
    ) -> None:
        """With a 1 s TTL, ``write`` (of a session of 3 messages and a document) at 0.7 s keeps all of it to 1.4 s.

        ``kept`` is how many messages the write leaves; ``what`` names it in the failures ("popped", "trimmed").
        Then, 1.5 s on with no write, the whole session is gone.
        """
        self.skip_without_native_ttl()

        async def scenario(timeline: TTLTimeline) -> None:
            store = await kit.open(ttl=timedelta(seconds=timeline.ttl))
            key = kit.key()
            await timeline.write(store.append(key, make_messages(3)))  # t = 0: messages and document
            await timeline.write(
                store.save_session(key, AgentSession(session_id=key.session_id, tenant=key.tenant, state={"t": 0}))
            )
            await timeline.sleep_until(0.7)
            await timeline.write(write(store, key))  # t = 0.7: a write, for the document too
            await timeline.sleep_until(1.4)
            fresh = await kit.open()
            assert await timeline.read(fresh.count(key)) == kept, (
                f"messages expired although the session was {what} 0.7 s ago"
            )
            assert await timeline.read(fresh.load_session(key)) is not None, (
                f"the document expired although the session was {what}"
            )
            await timeline.sleep(1.5)
            assert await fresh.count(key) == 0, f"the session outlived its TTL after it was last {what}"
            assert await fresh.load_session(key) is None

        await TTLTimeline.run(scenario, kit.clock)

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Override: return a callable opening a new store instance on the test's backing data."""
        raise NotImplementedError(
            f"{type(self).__name__} must override the make_store fixture: return a callable that, given options "
            "such as ttl= and max_message_bytes=, opens a new store instance on the same backing data"
        )

    async def messages_read(self, store: HistoryStore) -> int:
        """How many message records ``store`` has read from its backing so far (rows fetched, records decoded).

        By default the store's own read probe (:class:`~chatkeep.core.backend.SupportsReadProbe`); override it
        for a store without one.
        """
        if isinstance(store, SupportsReadProbe):
            return store.messages_read
        raise TypeError(
            f"{type(store).__name__} has no read probe: give it a messages_read property counting the records it "
            f"reads (chatkeep.core.backend.SupportsReadProbe), or override {type(self).__name__}.messages_read"
        )

    @pytest.fixture
    def shared_backing(self) -> str | None:
        """The name of the backing data when it outlives the test; ``None`` (the default) when it does not.

        Override it when every test of a run opens the same backing data (a schema, database or file the run
        drops at its end), naming it so that parametrizations opening the same data (transports) give the same
        name: the kit then fills its 100,000-message sessions once per backing, not once per test
        (:meth:`StoreKit.large_session`), and leaves them there.
        """
        return None

    @pytest.fixture
    def ttl_clock(self) -> Clock:
        """The time the TTL tests run on: real time, which a server's expiry needs.

        A backend whose stores take a time source overrides this fixture with a :class:`FakeClock` given to
        every store ``make_store`` makes: its TTL tests then run without waiting.
        """
        return Clock()

    @pytest_asyncio.fixture(loop_scope="function")
    async def kit(
        self, make_store: StoreFactory, ttl_clock: Clock, shared_backing: str | None
    ) -> AsyncIterator[StoreKit]:
        """A :class:`StoreKit` over ``make_store`` that cleans up when the test ends."""
        kit = StoreKit(make_store, ttl_clock, shared_backing)
        try:
            yield kit
        finally:
            await kit.aclose()

    @pytest_asyncio.fixture(loop_scope="function")
    async def store(self, kit: StoreKit) -> HistoryStore:
        """One store instance for tests that need just one."""
        return await kit.open()
