"""Microsoft Agent Framework history in a chatkeep store: :class:`ChatkeepHistoryProvider`.

Install with ``pip install "chatkeep-core[agent-framework]"`` (plus a backend's extra), then swap one line::

    context_providers=[InMemoryHistoryProvider("memory", load_messages=True)]
    context_providers=[ChatkeepHistoryProvider("memory", store="redis://localhost:6379/0", load_messages=True)]

Each framework :class:`~agent_framework.Message` is kept as its own ``to_dict()`` form inside a stored chatkeep
message (see :mod:`chatkeep.interop._envelope`) and read back with ``Message.from_dict``: role, contents
(function calls and results, reasoning, data), author, message id and additional properties, as written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

from agent_framework import AgentSession, HistoryProvider, SessionContext, SupportsAgentRun
from agent_framework import Message as FrameworkMessage

# The rule the framework's own providers use to drop what a run hands over again (a replayed transcript, a tool
# loop persisted per model call); importing it keeps this provider's semantics exactly theirs.
from agent_framework._sessions import filter_new_messages

from chatkeep.core import (
    DEFAULT_TENANT,
    HistoryStore,
    InvalidArgumentError,
    InvalidSessionKeyError,
    Message,
    MessageFormatError,
    Role,
    SessionKey,
)
from chatkeep.interop._binding import StoreBinding
from chatkeep.interop._envelope import unwrap, wrap

__all__ = ["ChatkeepHistoryProvider"]

#: The envelope format of an Agent Framework message.
FORMAT = "agent-framework.message"

_ROLES: dict[str, Role] = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ChatkeepHistoryProvider(HistoryProvider):
    """An Agent Framework ``HistoryProvider`` whose history lives in a chatkeep store.

    One instance serves every session of an agent, as the framework asks: the provider holds the store, and
    each session's chatkeep session id lives in that session's provider state
    (``session.state[source_id]["chatkeep_session_id"]``), so it survives ``AgentSession.to_dict()`` /
    ``from_dict()``. It is the session's own ``session_id`` unless the state names another.

    Args:
        source_id: the provider's id (message attribution and the key of its session state).
        store: a :class:`HistoryStore` (yours to close), a store URL (``"sqlite:///chat.db"``) or a backend
            name (``"memory"``), which the provider opens and closes (:meth:`aclose`).
        tenant: the tenant every session of this provider belongs to.
        store_options: options for a store opened from a URL.
        load_last: load only the newest ``load_last`` messages before each run (a windowed read; the store
            never reads the rest). ``None`` loads the whole history. A window that would start with tool
            results whose call fell outside it starts after them, since no model API accepts those.
        load_messages: load history before each run (the framework's flag, unchanged).
        store_inputs: store the run's input messages.
        store_context_messages: store the messages other context providers added.
        store_context_from: with ``store_context_messages``, only those of these source ids.
        store_outputs: store the response messages.

    Raises:
        InvalidArgumentError: ``load_last`` is not a positive integer or ``None``.
        StoreConfigurationError: see :class:`~chatkeep.interop._binding.StoreBinding`.
        UnknownBackendError: no installed backend handles the URL.
    """

    DEFAULT_SOURCE_ID: ClassVar[str] = "chatkeep"
    #: The provider-state entry that holds the session's chatkeep session id.
    STATE_KEY: ClassVar[str] = "chatkeep_session_id"

    def __init__(
        self,
        source_id: str | None = None,
        *,
        store: HistoryStore | str,
        tenant: str = DEFAULT_TENANT,
        store_options: Mapping[str, Any] | None = None,
        load_last: int | None = None,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: set[str] | None = None,
        store_outputs: bool = True,
    ) -> None:
        if load_last is not None and (isinstance(load_last, bool) or not isinstance(load_last, int) or load_last < 1):
            raise InvalidArgumentError(
                f"load_last must be a positive number of messages, or None to load the whole history, not {load_last!r}"
            )
        super().__init__(
            source_id or self.DEFAULT_SOURCE_ID,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_context_messages=store_context_messages,
            store_context_from=store_context_from,
            store_outputs=store_outputs,
        )
        self._binding = StoreBinding(store, store_options=store_options)
        self._binding.key("probe", tenant)  # a bad tenant fails here, not at the first run
        self.tenant = tenant
        self.load_last = load_last

    @property
    def store(self) -> HistoryStore:
        """The chatkeep store the history lives in."""
        return self._binding.store

    def session_key(self, session_id: str | None, state: dict[str, Any] | None = None) -> SessionKey:
        """The chatkeep key of a session: the id its provider ``state`` names, else ``session_id`` (recorded there).

        Raises:
            InvalidSessionKeyError: neither names a session, or the id is not a valid chatkeep session id.
        """
        recorded = state.get(self.STATE_KEY) if state is not None else None
        chosen = recorded if isinstance(recorded, str) else session_id
        if not chosen:
            raise InvalidSessionKeyError(
                f"{type(self).__name__} needs a session: run the agent with session=agent.create_session(), or "
                "pass a session id"
            )
        key = self._binding.key(chosen, self.tenant)
        if state is not None and recorded is None:
            state[self.STATE_KEY] = chosen
        return key

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[FrameworkMessage]:
        """The session's history (its newest ``load_last`` messages when set), oldest first."""
        key = self.session_key(session_id, state)
        stored = await self.store.load(key, last=self.load_last)
        whole = self.load_last is None or len(stored) < self.load_last
        if not whole:
            start = 0
            while start < len(stored) and stored[start].role == "tool":
                start += 1
            stored = stored[start:]
        messages = [_decode(message) for message in stored]
        loading = _LOADING.get()
        if loading is not None:
            loading.append(_Window(key, messages, whole))
        return messages

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[FrameworkMessage],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append the messages the history does not already end with, in one atomic append.

        Like the framework's own providers, messages that repeat the stored history's end (a replayed
        transcript, a tool loop persisted after each model call) are not stored twice. That overlap is never
        longer than ``messages``, so only that many of the newest stored messages are compared: those this
        run loaded before the model call when they suffice, else as many as are read from the store.
        """
        if not messages:
            return
        key = self.session_key(session_id, state)
        window = _RUN_WINDOW.get()
        tail = window.tail(key, len(messages)) if window is not None else None
        if tail is None:
            tail = [_decode(message) for message in await self.store.load(key, last=len(messages))]
        new = filter_new_messages(tail, messages) if _may_overlap(tail, messages) else list(messages)
        if new:
            await self.store.append(key, [_encode(message) for message in new])

    async def before_run(
        self, *, agent: SupportsAgentRun, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Load the history into the run's context (the base class's), keeping what was loaded for the run's append."""
        loading: list[_Window] = []
        token = _LOADING.set(loading)
        try:
            await super().before_run(agent=agent, session=session, context=context, state=state)
        finally:
            _LOADING.reset(token)
        if loading:
            context.metadata[self._window_key] = loading[-1]

    async def after_run(
        self, *, agent: SupportsAgentRun, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Store the run's messages (the base class's), comparing them with what this run loaded."""
        window = context.metadata.get(self._window_key)
        token = _RUN_WINDOW.set(window if isinstance(window, _Window) else None)
        try:
            await super().after_run(agent=agent, session=session, context=context, state=state)
        finally:
            _RUN_WINDOW.reset(token)

    @property
    def _window_key(self) -> str:
        return f"chatkeep.interop:{self.source_id}:loaded"

    async def clear(self, session: AgentSession | str) -> None:
        """Delete a session's history (give the :class:`AgentSession`, or a chatkeep session id)."""
        if isinstance(session, AgentSession):
            key = self.session_key(session.session_id, session.state.get(self.source_id))
        else:
            key = self.session_key(session)
        await self.store.delete(key)

    async def aclose(self) -> None:
        """Close the store if the provider opened it (from a URL or backend name)."""
        await self._binding.aclose()

    async def __aenter__(self) -> ChatkeepHistoryProvider:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@dataclass(frozen=True)
class _Window:
    """The newest messages of a session as a run loaded them before its model call."""

    key: SessionKey
    messages: list[FrameworkMessage]
    whole: bool  # the session held no more than these

    def tail(self, key: SessionKey, n: int) -> list[FrameworkMessage] | None:
        """The session's ``n`` newest messages, or ``None`` when this window cannot tell them."""
        if key != self.key or (len(self.messages) < n and not self.whole):
            return None
        return self.messages[-n:]


# A run loads in before_run and appends in after_run, with only the model call between: the append compares
# with what the run loaded instead of reading the store again. get_messages reports what it loaded through
# _LOADING while before_run runs; save_messages finds it in _RUN_WINDOW while after_run runs. Both hooks await
# the base class's in the same task, so each variable is seen only inside the call that set it.
_LOADING: ContextVar[list[_Window] | None] = ContextVar("chatkeep_interop_af_loading", default=None)
_RUN_WINDOW: ContextVar[_Window | None] = ContextVar("chatkeep_interop_af_window", default=None)


def _may_overlap(stored: Sequence[FrameworkMessage], incoming: Sequence[FrameworkMessage]) -> bool:
    """Whether any incoming message may repeat a stored one by the framework's identity rule.

    The framework's ``filter_new_messages`` compares messages by id, or without one by role and serialized
    contents: serializing every message's contents costs more than the rest of a turn. Equal contents have
    equal text, so when no pair shares an id, or a role and text, nothing repeats and its answer is known:
    every incoming message is new.
    """

    def coarse(message: FrameworkMessage) -> tuple[str, ...]:
        identity = getattr(message, "message_id", None)
        if identity is None:
            identity = getattr(message, "id", None)
        return ("id", str(identity)) if identity is not None else ("content", str(message.role), message.text)

    seen = {coarse(message) for message in stored}
    return any(coarse(message) in seen for message in incoming)


def _encode(message: FrameworkMessage) -> Message:
    return wrap(message.to_dict(), format=FORMAT, role=_ROLES.get(message.role, "user"), text=message.text)


def _decode(message: Message) -> FrameworkMessage:
    item = unwrap(message, format=FORMAT)
    if item is None:
        raise MessageFormatError(
            f"message {message.message_id} was not written through ChatkeepHistoryProvider (it holds no Agent "
            "Framework message); keep this session for the provider alone, or delete that message"
        )
    try:
        return FrameworkMessage.from_dict(item)
    except (TypeError, ValueError) as exc:
        raise MessageFormatError(
            f"message {message.message_id} holds an Agent Framework message this version cannot read ({exc}); it "
            "was probably written by a newer agent-framework-core: upgrade it here (the stored item is unchanged)"
        ) from exc
