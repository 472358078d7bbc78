"""``ChatkeepSession``: the OpenAI Agents SDK's ``Session`` protocol on any chatkeep store, with the branches and
per-turn usage of the SDK's ``AdvancedSQLiteSession``."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from chatkeep.core import (
    DEFAULT_TENANT,
    ConcurrencyConflictError,
    HistoryStore,
    InvalidArgumentError,
    Message,
    SessionKey,
    UnsupportedOperationError,
)
from chatkeep.interop._binding import StoreBinding
from chatkeep.interop.openai_agents._branches import MAIN, branch_key, branch_name, branch_tag, check_branch_name
from chatkeep.interop.openai_agents._items import item_of, message_of, sendable_window
from chatkeep.interop.openai_agents._turns import Turn, content_preview, matches, tool_name, tool_usage, turns_of
from chatkeep.interop.openai_agents._turns import item_type as _item_type
from chatkeep.interop.openai_agents._usage import summed, usage_message, usage_record_of

if TYPE_CHECKING:
    from agents import TResponseInputItem
    from agents.result import RunResultBase

__all__ = ["ChatkeepSession"]


class ChatkeepSession:
    """An Agents SDK session whose history lives in a chatkeep store.

    A drop-in for ``SQLiteSession``, ``SQLAlchemySession`` or ``RedisSession``: pass it to
    ``Runner.run(agent, input, session=...)``. Each item the SDK adds is kept exactly (reasoning items with
    their encrypted content, fields the SDK does not know yet), one chatkeep message per item, so chatkeep's
    tools (``chatkeep sessions show``, export, copy between backends, prune) see the conversation too.

    It also does what the SDK's ``AdvancedSQLiteSession`` does, on every store that forks (memory, SQL, Redis):
    branches (:meth:`create_branch_from_turn`, :meth:`switch_to_branch`, :meth:`list_branches`), each a
    chatkeep fork of the branch it came from, and the usage of each turn (:meth:`store_run_usage`,
    :meth:`get_turn_usage`, :meth:`get_session_usage`), kept in the history beside the turn.

    Example:
        ```python
        session = ChatkeepSession("user-1", store="redis://localhost:6379/0")
        result = await Runner.run(agent, "Hello", session=session)
        ```

    Args:
        session_id: the conversation's id (any non-empty string up to 1,024 characters, compared exactly).
        store: a :class:`~chatkeep.core.HistoryStore` (you keep owning it), or a store URL or backend name that
            the session opens and closes in :meth:`close`.
        tenant: the tenant the conversation belongs to; another tenant's session of the same id is another
            conversation.
        session_settings: the SDK's settings; their ``limit`` is the default of :meth:`get_items`.
        store_options: options for a store opened from a URL (as keywords, what its query string takes).

    Raises:
        InvalidSessionKeyError: an empty or too long ``session_id`` or ``tenant``.
        UnknownBackendError: no installed backend handles the URL; the message names the extra to install.
        StoreConfigurationError: ``store_options`` with a store object, or a ``store`` of the wrong type.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: HistoryStore | str,
        tenant: str = DEFAULT_TENANT,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._key: SessionKey = StoreBinding.key(session_id, tenant)
        self._binding = StoreBinding(store, store_options=store_options)
        self.session_id = session_id
        self.tenant = tenant
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        self._branch = MAIN
        # An empty branch (made from turn 1) has no session yet: its first append creates it, then tags it.
        self._untagged: str | None = None

    @property
    def store(self) -> HistoryStore:
        """The store the history lives in."""
        return self._binding.store

    @property
    def current_branch_id(self) -> str:
        """The branch the session reads and writes (``"main"`` until :meth:`create_branch_from_turn` or
        :meth:`switch_to_branch`); kept by this object only, as the SDK's session keeps it."""
        return self._branch

    def branch_key(self, branch_id: str | None = None) -> SessionKey:
        """The chatkeep session a branch is (default: the current one), for chatkeep's own tools.

        ``main`` is ``SessionKey(tenant, session_id)``; branch ``b`` is
        ``SessionKey(tenant, f"{session_id}#branch:{b}")``.
        """
        return branch_key(self._key, self._branch if branch_id is None else branch_id)

    # -- the SDK's Session protocol --------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None, branch_id: str | None = None) -> list[TResponseInputItem]:
        """The history of the current branch (or of ``branch_id``), oldest first: all of it, or the newest
        ``limit`` items (default: the settings' limit).

        A window that cuts the history never starts with an item whose partner fell outside it: it starts
        past tool outputs whose call is older than the window, and past the item an older reasoning item was
        emitted with (the Responses API refuses either). So it may hold fewer than ``limit`` items.

        Raises:
            InvalidArgumentError: a negative ``limit``.
        """
        key = self.branch_key(branch_id)
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is None:
            return [_typed(item) for item in _items(await self.store.load(key))]
        if limit < 0:
            raise InvalidArgumentError(
                f"limit must be 0 or more (0: no history), or None for the whole history; got {limit}"
            )
        if limit == 0:
            return []
        # One item more than asked: the item before the window tells whether the window starts mid-response.
        # Usage records are not items: a read that met some reads that many more.
        asked = limit + 1
        while True:
            messages = await self.store.load(key, last=asked)
            loaded = _items(messages)
            if len(loaded) > limit or len(messages) < asked:
                break
            asked += len(messages) - len(loaded)
        if len(loaded) <= limit:
            return [_typed(item) for item in loaded]
        return [_typed(item) for item in sendable_window(loaded[-limit:], before=loaded[-limit - 1])]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items to the current branch, in order, in one atomic write (all of them or none)."""
        # An empty list makes no round trip, but a closed store still says so, as the SDK's sessions do.
        key = self.branch_key()
        added = await self.store.append(key, [message_of(item) for item in items])
        if added and self._untagged == self._branch:
            await self.store.update_info(key, tags={branch_tag(self.session_id)})
            self._untagged = None

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item of the current branch and return it (``None`` when the branch is empty).

        Atomic on every backend: two concurrent pops never return the same item. Usage records stored after
        the item (:meth:`store_run_usage`) are removed with it.

        Raises:
            MessageFormatError: the newest message was not written through this adapter (it is removed all
                the same; the message names it).
        """
        key = self.branch_key()
        while True:
            message = await self.store.pop(key)
            if message is None:
                return None
            if usage_record_of(message) is None:
                return _typed(item_of(message))

    async def clear_session(self) -> None:
        """Delete the whole history of this session: every branch, then ``main``, which becomes current."""
        for _, key, _ in await self._tagged_branches():
            await self.store.delete(key)
        await self.store.delete(self._key)
        self._branch, self._untagged = MAIN, None

    async def close(self) -> None:
        """Close the store if the session opened it from a URL (a store object you passed stays open)."""
        await self._binding.aclose()

    # -- usage ------------------------------------------------------------------------------------------------

    async def store_run_usage(self, result: RunResultBase) -> None:
        """Store a run's token usage as the usage of the current turn of the current branch (call it after
        ``Runner.run``, and after a run resumed from its ``RunState``: the newest call gives the turn's usage).

        The usage is appended to the branch as a usage record after the turn's items (the SDK's ``Usage`` with
        its token details, and chatkeep usage contents for what it adds, so
        ``store.usage(session.branch_key())`` counts it). A branch without items has no turn: nothing is stored.

        Raises:
            StoreUnavailableError: the store failed (the SDK's session logs the error instead; chatkeep raises).
        """
        usage = result.context_wrapper.usage
        if usage is None:
            return
        key = self.branch_key()
        turn = await self._current_turn(key)
        if turn is None:
            return
        replaced = turn.usage[-1][1] if turn.usage else None
        await self.store.append(key, [usage_message(usage, replaces=replaced)])

    async def _current_turn(self, key: SessionKey) -> Turn | None:
        """The newest turn of a branch, read from the end of its history (``None`` when the branch is empty)."""
        asked = 8
        while True:
            messages = await self.store.load(key, last=asked)
            turns = turns_of(messages)
            if len(turns) > 1 or (turns and turns[0].message is not None):  # the newest turn starts in the window
                return turns[-1]
            if len(messages) < asked:
                return turns[-1] if turns else None
            asked *= 4

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """The usage stored with each turn of a branch (default: the current one), or with one turn.

        Returns:
            For ``user_turn_number``: a dict with ``requests``, ``input_tokens``, ``output_tokens``,
            ``total_tokens``, ``input_tokens_details`` and ``output_tokens_details`` (``{}`` when the turn has no
            usage). Else a list of such dicts, each with its ``user_turn_number``, for the turns with usage. A
            branch's turns include those it took from the branch it was made from, with their usage.
        """
        turns = [turn for turn in await self._turns(branch_id) if turn.usage]
        if user_turn_number is None:
            return [{"user_turn_number": turn.number, **turn.usage[-1][1]} for turn in turns]
        found = next((turn for turn in turns if turn.number == user_turn_number), None)
        return {} if found is None else dict(found.usage[-1][1])

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """The usage of one branch, or of every branch (default): the turns' usage, summed.

        Every turn counts once: those a branch took from its source are the source's. Reads each branch's
        history; ``store.usage(session.branch_key(b))`` gives a branch's tokens and calls in one read.

        Returns:
            ``requests``, ``input_tokens``, ``output_tokens``, ``total_tokens`` and ``total_turns`` (the turns
            with usage), or ``None`` when no usage is stored.
        """
        branches = [branch_id] if branch_id else [name for name, _, _ in await self._branches()]
        newest: dict[str, list[tuple[str, dict[str, Any]]]] = {}  # turn (its user message's id) -> its records
        for name in branches:
            for turn in await self._turns(name):
                where = turn.message.message_id if turn.message else f"{name}: turn 0"
                if len(turn.usage) > len(newest.get(where, ())):  # a shared turn: the branch that kept more
                    newest[where] = turn.usage
        if not newest:
            return None
        return {**summed(records[-1][1] for records in newest.values()), "total_turns": len(newest)}

    # -- branches ---------------------------------------------------------------------------------------------

    async def create_branch_from_turn(self, turn_number: int, branch_name: str | None = None) -> str:
        """Branch off before turn ``turn_number`` of the current branch, and make the new branch current.

        The new branch holds the turns before it (with their usage), so a new answer to turn ``turn_number``'s
        question, or another question, continues from there. It is a chatkeep fork of the current branch: nothing
        is copied, whatever the history's length, and the old branch stays as it was. Finding the turn reads the
        current branch's history.

        Args:
            turn_number: the turn (its number in :meth:`get_conversation_turns`) to branch off before.
            branch_name: the new branch's name (default: ``branch_from_turn_<n>_<unix time>``).

        Returns:
            The new branch's name.

        Raises:
            InvalidArgumentError: the turn does not exist in the current branch, a branch of that name exists
                (``"already been used"``), or the name is blank.
            UnsupportedOperationError: the store cannot fork (the Blob backend, ``EncryptedStore``).
        """
        name = None if branch_name is None else check_branch_name(branch_name)
        source = self.branch_key()
        messages = await self.store.load(source)
        turn = next((t for t in turns_of(messages) if t.number == turn_number and turn_number > 0), None)
        if turn is None or turn.message is None:
            raise InvalidArgumentError(
                f"Turn {turn_number} does not contain a user message in branch '{self._branch}'. Pass the number "
                "of a turn that get_conversation_turns() lists"
            )
        start = next(n for n, message in enumerate(messages) if message.message_id == turn.message.message_id)
        through = messages[start - 1].message_id if start else None
        if name is not None:
            await self._make_branch(name, source, through)
        else:  # a generated name: the next free one of ..._<n>, as the SDK's session makes them
            base = f"branch_from_turn_{turn_number}_{int(time.time())}"
            for suffix in itertools.count(1):
                name = base if suffix == 1 else f"{base}_{suffix}"
                try:
                    await self._make_branch(name, source, through)
                    break
                except _BranchExists:
                    continue
        assert name is not None
        self._branch, self._untagged = name, (name if through is None else None)
        return name

    async def _make_branch(self, name: str, source: SessionKey, through: str | None) -> None:
        """Fork ``source`` through message ``through`` into branch ``name`` (an empty branch, for ``None``)."""
        target = branch_key(self._key, name)
        if name == MAIN:
            raise _BranchExists(name)
        if through is None:  # nothing to fork: the first append creates the branch (and tags it)
            if await self.store.count(target) or await self.store.load_session(target) is not None:
                raise _BranchExists(name)
            return
        try:
            await self.store.fork(source, target, through=through)
        except ConcurrencyConflictError:
            raise _BranchExists(name) from None
        await self.store.update_info(target, tags={branch_tag(self.session_id)})

    async def create_branch_from_content(self, search_term: str, branch_name: str | None = None) -> str:
        """:meth:`create_branch_from_turn` from the first turn whose user message holds ``search_term``.

        Raises:
            InvalidArgumentError: no turn holds it, or as :meth:`create_branch_from_turn`.
        """
        found = await self.find_turns_by_content(search_term)
        if not found:
            raise InvalidArgumentError(
                f"No user turns found containing '{search_term}' in branch '{self._branch}'. Pass words of a user "
                "message that get_conversation_turns() lists"
            )
        return await self.create_branch_from_turn(found[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Make ``branch_id`` the branch this session reads and writes.

        Raises:
            InvalidArgumentError: the branch holds no items (it does not exist, or was deleted).
        """
        if not await self._exists(branch_id):
            raise InvalidArgumentError(
                f"Branch '{branch_id}' does not exist in session {self.session_id!r}. Pass a name list_branches() "
                "returns"
            )
        self._branch, self._untagged = branch_id, None

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        """Delete a branch (its chatkeep session): the branches made from it keep their history.

        Args:
            branch_id: the branch; not ``main`` (:meth:`clear_session` deletes everything).
            force: allow deleting the current branch (``main`` becomes current).

        Raises:
            InvalidArgumentError: the branch is ``main``, blank, current without ``force``, or does not exist.
        """
        if not isinstance(branch_id, str) or not branch_id.strip():
            raise InvalidArgumentError("Branch ID cannot be empty. Pass the name of a branch list_branches() returns")
        if branch_id == MAIN:
            raise InvalidArgumentError(
                "Cannot delete the 'main' branch. Pass another branch, or call clear_session() to delete them all"
            )
        if branch_id == self._branch and not force:
            raise InvalidArgumentError(
                f"Cannot delete current branch '{branch_id}'. Use force=True or switch branches first: pass "
                "force=True to delete it and go back to 'main'"
            )
        if not await self._exists(branch_id):
            raise InvalidArgumentError(
                f"Branch '{branch_id}' does not exist in session {self.session_id!r}. Pass a name list_branches() "
                "returns"
            )
        if branch_id == self._branch:
            self._branch, self._untagged = MAIN, None
        await self.store.delete(branch_key(self._key, branch_id))

    async def list_branches(self) -> list[dict[str, Any]]:
        """The branches that hold items, ``main`` first, then by creation time; reads every branch's history.

        Returns:
            A dict per branch: ``branch_id``, ``message_count`` (its items), ``user_turns``, ``is_current``,
            ``created_at`` (a ``datetime``), and ``session_id``, the chatkeep session it is.
        """
        branches = []
        for name, key, created_at in await self._branches():
            messages = await self.store.load(key)
            if not messages:
                continue
            turns = turns_of(messages)
            branches.append(
                {
                    "branch_id": name,
                    "message_count": sum(len(turn.items) for turn in turns),
                    "user_turns": sum(1 for turn in turns if turn.number),
                    "is_current": name == self._branch,
                    "created_at": created_at or messages[0].created_at,
                    "session_id": key.session_id,
                }
            )
        return branches

    async def _branches(self) -> list[tuple[str, SessionKey, datetime | None]]:
        """``main`` (no creation time: its first message's) and every tagged branch, oldest first."""
        return [(MAIN, self._key, None), *await self._tagged_branches()]

    async def _tagged_branches(self) -> list[tuple[str, SessionKey, datetime]]:
        found: list[tuple[str, SessionKey, datetime]] = []
        cursor: str | None = None
        while True:
            try:
                page = await self.store.list_sessions(self.tenant, tag=branch_tag(self.session_id), cursor=cursor)
            except UnsupportedOperationError:  # a store without tags (Blob, EncryptedStore) cannot fork either
                return []
            for info in page.items:
                name = branch_name(self._key, info.session_id)
                if name is not None and name != MAIN:
                    found.append((name, SessionKey(self.tenant, info.session_id), info.created_at))
            cursor = page.next_cursor
            if cursor is None:
                return sorted(found, key=lambda branch: (branch[2], branch[0]))

    async def _exists(self, branch_id: str) -> bool:
        return await self.store.count(branch_key(self._key, branch_id)) > 0

    # -- turns ------------------------------------------------------------------------------------------------

    async def _turns(self, branch_id: str | None) -> list[Turn]:
        return turns_of(await self.store.load(self.branch_key(branch_id)))

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of a branch (default: the current one), to choose where to branch from.

        Returns:
            A dict per turn: ``turn`` (its number), ``content`` (the user message, cut at 100 characters),
            ``full_content``, ``timestamp`` (a ``datetime``) and ``can_branch`` (always ``True``).
        """
        return [_turn_entry(turn, 100) for turn in await self._turns(branch_id) if turn.number]

    async def find_turns_by_content(self, search_term: str, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of a branch whose message holds ``search_term`` (ASCII letters in any case), as
        :meth:`get_conversation_turns` lists them (``content`` not cut)."""
        turns = await self._turns(branch_id)
        return [_turn_entry(turn, None) for turn in turns if turn.number and matches(turn, search_term)]

    async def get_conversation_by_turns(self, branch_id: str | None = None) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items as ``{"type": ..., "tool_name": ...}``, by turn number (0: items before any user
        message)."""
        return {
            turn.number: [{"type": _item_type(item), "tool_name": tool_name(item)} for item in turn.items]
            for turn in await self._turns(branch_id)
        }

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str, int, int]]:
        """``(tool name, calls, turn number)`` for each tool called in each turn of a branch."""
        return tool_usage(await self._turns(branch_id))

    def __repr__(self) -> str:
        return (
            f"ChatkeepSession({self.session_id!r}, tenant={self.tenant!r}, branch={self._branch!r}, "
            f"store={type(self.store).__name__})"
        )


class _BranchExists(InvalidArgumentError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"Branch ID '{name}' has already been used in this session. Pass a new branch name, or None for a "
            "generated one"
        )


def _items(messages: list[Message]) -> list[dict[str, Any]]:
    """The items of a history, without its usage records."""
    return [item_of(message) for message in messages if usage_record_of(message) is None]


def _turn_entry(turn: Turn, max_length: int | None) -> dict[str, Any]:
    return {
        "turn": turn.number,
        "content": content_preview(turn.content, max_length),
        "full_content": turn.content,
        "timestamp": turn.created_at,
        "can_branch": True,
    }


def _typed(item: dict[str, Any]) -> TResponseInputItem:
    # The item is what the SDK added; its type is the SDK's union, which a plain dict cannot be narrowed to.
    return cast("TResponseInputItem", item)
