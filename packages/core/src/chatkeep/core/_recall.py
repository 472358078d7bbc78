"""Semantic recall for an agent: earlier messages that match the new input, brought back into the context.

:class:`SemanticRecallProvider` searches a search-capable store before each run and indexes the run's messages
after it; optionally it gives the model a ``search_history`` tool on the same scope. With a history provider on
the same store, each message is stored once and indexed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from chatkeep.core._default_embedder import default_embedder
from chatkeep.core._embedding import Embedder
from chatkeep.core._errors import InvalidArgumentError
from chatkeep.core._messages import Message
from chatkeep.core._providers import ContextProvider, InMemoryHistoryProvider, SessionContext
from chatkeep.core._session import AgentSession
from chatkeep.core._tools import FunctionTool
from chatkeep.core.backend import SearchHit, SearchScope, SessionKey, TenantScope, embed_messages, searchable

if TYPE_CHECKING:
    from chatkeep.core._agent import Agent
    from chatkeep.core.backend import HistoryStore

__all__ = ["SEARCH_TOOL_NAME", "SemanticRecallProvider", "recalled_message"]

#: The name of the tool :class:`SemanticRecallProvider` gives the model with ``search_tool=True``.
SEARCH_TOOL_NAME = "search_history"
_SAID_AT = "%Y-%m-%d %H:%M UTC"


def recalled_message(hit: SearchHit) -> Message:
    """The context message that brings ``hit`` back: its text, with who said it and when."""
    said = hit.message.created_at.strftime(_SAID_AT)
    return Message(role="user", text=f"[recalled: the {hit.message.role} said on {said}] {hit.message.text}")


class SemanticRecallProvider(ContextProvider):
    """Before a run, adds the earlier messages that best match the new input; after it, indexes the new messages.

    The recalled messages are those the run's context does not already hold (a history provider's window), each
    as a context message saying who said it and when. They are stamped with this provider's ``source_id``, so
    a history provider never stores them again.

    Args:
        store: a store with the search capability (the one holding the history).
        embedder: the embedder (``None``: the offline default, :func:`~chatkeep.core.default_embedder`).
        k: how many earlier messages to bring back at most.
        scope: ``"session"`` searches the run's session; ``"tenant"`` every session of its tenant.
        source_id: names this provider.
        index: index the run's input and output messages after a successful run (storing them when no history
            provider has).
        search_tool: also give the model a ``search_history(query, limit)`` tool that searches the same scope
            and returns the matches (text, role, when said, session), best first, at most ``k`` of them.

    Raises:
        SearchUnsupportedError: the store cannot search.
        InvalidArgumentError: ``k`` below 1 or an unknown ``scope``.
    """

    def __init__(
        self,
        store: HistoryStore,
        embedder: Embedder | None = None,
        k: int = 5,
        scope: Literal["session", "tenant"] = "session",
        *,
        source_id: str = "recall",
        index: bool = True,
        search_tool: bool = False,
    ) -> None:
        super().__init__(source_id)
        self.store = store
        self._search = searchable(store)
        self.embedder = embedder if embedder is not None else default_embedder()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"k must be a whole number of 1 or more, got {k!r}")
        if scope not in ("session", "tenant"):
            raise InvalidArgumentError(f"scope must be 'session' or 'tenant', got {scope!r}")
        self.k = k
        self.scope = scope
        self.index = index
        self.search_tool = search_tool

    def _scope(self, session: AgentSession) -> SearchScope:
        key = SessionKey.of(session)
        return key if self.scope == "session" else TenantScope(session.tenant)

    async def _hits(self, scope: SearchScope, query: str, k: int) -> list[SearchHit]:
        [vector] = await self.embedder.embed([query])
        return await self._search.search(scope, vector, query, k, embedder=self.embedder.name)

    async def before_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Search with the input's text and add the best matches the context does not hold yet (and the tool)."""
        scope = self._scope(session)
        if self.search_tool:
            context.extend_tools(self, [self._tool(scope)])
        query = "\n".join(message.text for message in context.input_messages if message.text.strip())
        if not query:
            return
        present = {message.message_id for message in context.get_messages()}
        present |= await self._window_to_come(agent, session, context)
        # Ask for more than k: some of the best may be in the window already.
        hits = await self._hits(scope, query, self.k + len(present))
        fresh = [hit for hit in hits if hit.message.message_id not in present][: self.k]
        if fresh:
            context.extend_messages(self, [recalled_message(hit) for hit in fresh])

    @staticmethod
    async def _window_to_come(agent: Agent, session: AgentSession, context: SessionContext) -> set[str]:
        """The ids of the history window the agent's history provider adds after this provider, if it runs later.

        ``Agent(history=...)`` puts its history provider after the ``context_providers``, so the window is not in
        the context yet when this provider searches; it reads the window the provider is about to load (one
        windowed read, ``load(last=max_messages)``, for a store's provider; the session state for the default).
        """
        # Without a history provider, each run keeps history in the session state (InMemoryHistoryProvider, last).
        loader = agent.history_provider or InMemoryHistoryProvider()
        if loader.source_id in context.history_sources:
            return set()
        state = session.state.get(loader.source_id)
        window = await loader.load_history(agent=agent, session=session, state=state if isinstance(state, dict) else {})
        return {message.message_id for message in window}

    def _tool(self, scope: SearchScope) -> FunctionTool:
        """The ``search_history`` tool of one run: it searches ``scope`` (the run's session or tenant)."""
        most = self.k

        async def search_history(query: str, limit: int = most) -> list[dict[str, str]]:
            """Search the earlier conversation for messages about `query` (by meaning and by words), best first.

            Use it for what was said before and is not in view. Each match gives its text, who said it (role),
            when (UTC) and its session.
            """
            if not query.strip():
                return []
            hits = await self._hits(scope, query, max(1, min(limit, most)))
            return [
                {
                    "text": hit.message.text,
                    "role": hit.message.role,
                    "said_at": hit.message.created_at.strftime(_SAID_AT),
                    "session_id": hit.session_id,
                }
                for hit in hits
            ]

        return FunctionTool(search_history, name=SEARCH_TOOL_NAME)

    async def after_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Index the run's input and output messages (stored once, whoever appends them first)."""
        if not self.index or context.error is not None:
            return
        messages = list(context.input_messages)
        if context.response is not None:
            messages.extend(context.response.messages)
        if messages:
            embeddings = await embed_messages(self.embedder, messages)
            await self._search.append(SessionKey.of(session), messages, embeddings=embeddings)
