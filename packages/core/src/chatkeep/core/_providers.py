"""Context and history providers: the hooks an agent runs before and after each run.

A run goes: every provider's ``before_run`` (history providers load, filter, reduce and stamp
history into the :class:`SessionContext`), the model call(s), then every provider's ``after_run``
(history providers store the run's new messages, and nothing when the run failed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from chatkeep.core._errors import AgentConfigurationError, InvalidArgumentError
from chatkeep.core._messages import Message, decode_records
from chatkeep.core._reducers import MessageCountingReducer, Reducer, drop_orphan_tool_results
from chatkeep.core._session import AgentSession
from chatkeep.core._tools import FunctionTool
from chatkeep.core.backend import HistoryStore, SessionKey
from chatkeep.core.plugins import default_registry

if TYPE_CHECKING:
    from chatkeep.core._agent import Agent, AgentResponse

__all__ = [
    "BackendHistoryProvider",
    "ContextProvider",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "MessageFilter",
    "SessionContext",
    "StoreHistoryProvider",
    "history_provider",
]

MessageFilter = Callable[[list[Message]], list[Message]]


class SessionContext:
    """What providers see and shape during one run.

    Attributes:
        input_messages: the new messages the caller passed to ``run``.
        context_messages: messages providers added, by the ``source_id`` of the provider that added them.
        instructions: extra instructions providers added, by source.
        tools: tools providers gave the model for this run, by source (the agent's own tools come first).
        response: the run's response, set before ``after_run`` when the run succeeded.
        error: the exception that failed the run, set before ``after_run`` when it failed.
    """

    def __init__(self, input_messages: Sequence[Message]) -> None:
        self.input_messages: list[Message] = list(input_messages)
        self.context_messages: dict[str, list[Message]] = {}
        self.instructions: dict[str, str] = {}
        self.tools: dict[str, list[FunctionTool]] = {}
        self.response: AgentResponse | None = None
        self.error: BaseException | None = None
        self.history_sources: set[str] = set()

    def extend_messages(self, source: ContextProvider | str, messages: Sequence[Message]) -> None:
        """Add messages from ``source`` (the calling provider, or its ``source_id``); they go before the input."""
        source_id = source if isinstance(source, str) else source.source_id
        stamped = [m.with_source(source_id) for m in messages]
        self.context_messages.setdefault(source_id, []).extend(stamped)
        if isinstance(source, HistoryProvider):
            self.history_sources.add(source_id)

    def extend_instructions(self, source: ContextProvider | str, text: str) -> None:
        """Add instructions from ``source``; they are appended to the agent's instructions for this run."""
        source_id = source if isinstance(source, str) else source.source_id
        previous = self.instructions.get(source_id)
        self.instructions[source_id] = f"{previous}\n{text}" if previous else text

    def extend_tools(self, source: ContextProvider | str, tools: Sequence[FunctionTool]) -> None:
        """Give the model ``tools`` for this run, from ``source``; the agent calls them as it calls its own."""
        source_id = source if isinstance(source, str) else source.source_id
        self.tools.setdefault(source_id, []).extend(tools)

    def get_messages(self, *, include_input: bool = True) -> list[Message]:
        """All context messages (in the order providers added them), then the input."""
        messages = [m for batch in self.context_messages.values() for m in batch]
        if include_input:
            messages.extend(self.input_messages)
        return messages


class ContextProvider:
    """Base class of anything that adds context to a run or observes it.

    Override ``before_run`` and/or ``after_run``. They receive the agent, the session, the
    :class:`SessionContext` and ``state``: this provider's own slice of ``session.state`` (a dict
    under ``source_id``), which travels with the session.

    Args:
        source_id: names this provider; unique within an agent.
    """

    def __init__(self, source_id: str) -> None:
        if not source_id:
            raise InvalidArgumentError("a provider needs a non-empty source_id")
        self.source_id = source_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source_id!r})"

    async def before_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Called before the model is called."""

    async def after_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Called after the run, successful or not (``context.error`` says which)."""

    async def close(self) -> None:
        """Release what this provider opened (called by ``Agent.close`` for providers the agent owns)."""


class HistoryProvider(ContextProvider):
    """Loads a conversation's history before a run and stores its new messages after it.

    A simple provider overrides :meth:`get_messages` and :meth:`save_messages`; an advanced one
    overrides ``before_run`` / ``after_run``. Only one provider of an agent may load history.

    Args:
        source_id: names this provider (and its slice of ``session.state``).
        load_messages: load history before each run (``False`` makes a write-only provider, e.g. an audit log).
        store_inputs: store the run's input messages.
        store_outputs: store the messages the run produced.
        store_context_messages: also store messages other context providers added (never loaded history).
        store_context_from: with ``store_context_messages``, only from these sources (``None``: every source).
        reducer: shapes what is sent to the model; never deletes stored history.
        provide_filter: applied to loaded messages before reducing.
        store_filter: applied to the messages about to be stored.
    """

    def __init__(
        self,
        source_id: str = "history",
        *,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: Sequence[str] | None = None,
        reducer: Reducer | None = None,
        provide_filter: MessageFilter | None = None,
        store_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id)
        self.load_messages = load_messages
        self.store_inputs = store_inputs
        self.store_outputs = store_outputs
        self.store_context_messages = store_context_messages
        self.store_context_from = None if store_context_from is None else frozenset(store_context_from)
        self.reducer = reducer
        self.provide_filter = provide_filter
        self.store_filter = store_filter

    async def get_messages(
        self, session_id: str, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """Return the stored history of ``session_id`` in order (``kwargs`` carries ``session`` and ``agent``)."""
        raise NotImplementedError(f"{type(self).__name__} must override get_messages (or before_run)")

    async def save_messages(
        self, session_id: str, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Store new messages of ``session_id`` (``kwargs`` carries ``session`` and ``agent``)."""
        raise NotImplementedError(f"{type(self).__name__} must override save_messages (or after_run)")

    async def load_history(self, *, agent: Agent, session: AgentSession, state: dict[str, Any]) -> list[Message]:
        """Load, filter and reduce the history (what ``before_run`` puts in the context)."""
        messages = await self.get_messages(session.session_id, state=state, session=session, agent=agent)
        if self.provide_filter is not None:
            messages = self.provide_filter(messages)
        if self.reducer is not None:
            messages = await self.reducer.reduce(messages)
        return messages

    def messages_to_store(self, context: SessionContext) -> list[Message]:
        """The run's new messages this provider stores: chosen context messages, inputs, outputs, in model order."""
        messages: list[Message] = []
        if self.store_context_messages:
            for source_id, batch in context.context_messages.items():
                if source_id == self.source_id or source_id in context.history_sources:
                    continue  # loaded history is never stored again
                if self.store_context_from is None or source_id in self.store_context_from:
                    messages.extend(batch)
        if self.store_inputs:
            messages.extend(context.input_messages)
        if self.store_outputs and context.response is not None:
            messages.extend(context.response.messages)
        if self.store_filter is not None:
            messages = self.store_filter(messages)
        return messages

    async def before_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Load history into the context (when ``load_messages``)."""
        if not self.load_messages:
            return
        context.extend_messages(self, await self.load_history(agent=agent, session=session, state=state))

    async def after_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Store the run's new messages, or nothing when the run failed."""
        if context.error is not None:
            return
        messages = self.messages_to_store(context)
        if messages:
            await self.save_messages(session.session_id, messages, state=state, session=session, agent=agent)


class InMemoryHistoryProvider(HistoryProvider):
    """Keeps history in ``session.state``, so it travels with ``session.to_dict()``.

    This is the default: an agent with no history provider uses one for each run (while the model
    service does not keep the history itself).
    """

    def __init__(self, source_id: str = "in_memory", **options: Any) -> None:
        super().__init__(source_id, **options)

    async def get_messages(
        self, session_id: str, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """The messages kept in this provider's slice of the session state."""
        records = (state or {}).get("messages", [])
        return decode_records(records)

    async def save_messages(
        self, session_id: str, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Append to the messages kept in the session state."""
        if state is None:
            raise InvalidArgumentError("InMemoryHistoryProvider needs the session state to store messages")
        state.setdefault("messages", []).extend(m.to_record() for m in messages)

    def messages(self, session: AgentSession) -> list[Message]:
        """The history this provider keeps in ``session``."""
        return decode_records(session.state.get(self.source_id, {}).get("messages", []))


class StoreHistoryProvider(HistoryProvider):
    """Turns any :class:`HistoryStore` into a history provider, keyed by the session's tenant and id.

    It loads a bounded window of the newest ``max_messages`` (a ``MessageCountingReducer(n)`` sets
    the window to ``n``); a window never starts with a tool result whose call fell outside it.

    Args:
        store: the backend.
        source_id: names this provider.
        max_messages: how many of the newest messages to load (``None`` loads the whole history).
        owns_store: close the store when the provider is closed (set when the agent opened it from a URL).
        **options: the :class:`HistoryProvider` options.
    """

    def __init__(
        self,
        store: HistoryStore,
        *,
        source_id: str = "history",
        max_messages: int | None = 100,
        owns_store: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(source_id, **options)
        if isinstance(self.reducer, MessageCountingReducer):
            max_messages = self.reducer.n
        if max_messages is not None and max_messages < 1:
            raise InvalidArgumentError(f"max_messages must be at least 1 (or None for everything), got {max_messages}")
        self.store = store
        self.max_messages = max_messages
        self.owns_store = owns_store

    @staticmethod
    def _key(session_id: str, kwargs: dict[str, Any]) -> SessionKey:
        """The store key: the tenant always comes from the session (or a key) the caller passes, never a default."""
        session, key = kwargs.get("session"), kwargs.get("key")
        if isinstance(key, SessionKey):
            if key.session_id != session_id:
                raise AgentConfigurationError(
                    f"the key names session {key.session_id!r} but the call names {session_id!r}; pass one session"
                )
            if isinstance(session, AgentSession) and session.tenant != key.tenant:
                raise AgentConfigurationError(
                    f"the key's tenant {key.tenant!r} is not the session's tenant {session.tenant!r}"
                )
            return key
        if isinstance(session, AgentSession):
            return SessionKey(session.tenant, session_id)
        raise AgentConfigurationError(
            "StoreHistoryProvider needs to know whose history this is: pass session=AgentSession(...) or "
            "key=SessionKey(tenant, session_id); it never assumes a tenant"
        )

    async def get_messages(
        self, session_id: str, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """The newest ``max_messages`` of the session, never starting with an orphaned tool result."""
        messages = await self.store.load(self._key(session_id, kwargs), last=self.max_messages)
        return drop_orphan_tool_results(messages)

    async def save_messages(
        self, session_id: str, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Append the messages in one atomic, idempotent store call."""
        await self.store.append(self._key(session_id, kwargs), messages)

    async def close(self) -> None:
        """Close the store if this provider owns it."""
        if self.owns_store:
            await self.store.close()


class BackendHistoryProvider(StoreHistoryProvider):
    """Base of each backend's named provider (``RedisHistoryProvider``, ``SQLHistoryProvider``...): one signature.

    A subclass names its store class and default URL; every named provider then takes the same arguments
    in the same order.

    Args:
        store: a URL (the provider opens the store and closes it with itself), or an open store of the
            backend's class (the caller closes it). ``None`` opens the backend's default URL.
        store_options: options for the store when the provider opens it (as the URL query takes them).
        source_id: names this provider.
        max_messages: how many of the newest messages to load per run (``None``: the whole history).
        **options: the other :class:`HistoryProvider` options (``reducer``, ``store_inputs``...).
    """

    store_class: ClassVar[type[HistoryStore]]
    default_url: ClassVar[str]

    def __init__(
        self,
        store: str | HistoryStore | None = None,
        *,
        store_options: Mapping[str, Any] | None = None,
        source_id: str = "history",
        max_messages: int | None = 100,
        **options: Any,
    ) -> None:
        if isinstance(store, HistoryStore):
            if not isinstance(store, self.store_class):
                raise AgentConfigurationError(
                    f"{type(self).__name__} takes a {self.store_class.__name__} or a URL, got {type(store).__name__}"
                )
            if store_options:
                raise AgentConfigurationError(
                    "store_options configure a store the provider opens; give them when you open the store instead"
                )
            backend, owns = store, False
        else:
            open_backend: Callable[..., HistoryStore] = self.store_class
            backend, owns = open_backend(store or self.default_url, **dict(store_options or {})), True
        super().__init__(backend, source_id=source_id, max_messages=max_messages, owns_store=owns, **options)


def history_provider(
    url_or_name: str, *, store_options: Mapping[str, Any] | None = None, **provider_options: Any
) -> StoreHistoryProvider:
    """A history provider on the store a URL (or backend name) names; the provider owns and closes the store.

    Args:
        url_or_name: a store URL (``"redis://localhost:6379/0"``) or an installed backend's name (``"memory"``).
        store_options: options for the store (what its URL query takes, as keywords).
        **provider_options: the :class:`StoreHistoryProvider` options (``source_id``, ``max_messages``,
            ``reducer``, ``load_messages``, ``store_*``, filters).

    Raises:
        UnknownBackendError: no installed backend handles it; the message names the extra to install.
    """
    accepted = {
        name
        for cls in (StoreHistoryProvider, HistoryProvider)
        for name in inspect.signature(cls.__init__).parameters
        if name not in ("self", "store", "owns_store", "options")
    }
    unknown = sorted(set(provider_options) - accepted)
    if unknown:
        raise AgentConfigurationError(
            f"history_provider takes no provider option {', '.join(unknown)}; give store options as "
            f"store_options={{...}} (or in the URL's query); the provider options are {', '.join(sorted(accepted))}"
        )
    store = default_registry().open_store(url_or_name, **dict(store_options or {}))
    return StoreHistoryProvider(store, owns_store=True, **provider_options)
