"""Semantic recall for an agent: earlier messages that match the new input, brought back into the context.

:class:`SemanticRecallProvider` searches a search-capable store before each run and indexes the run's messages
after it. With a history provider on the same store, each message is stored once and indexed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from chatkeep.core._default_embedder import default_embedder
from chatkeep.core._embedding import Embedder
from chatkeep.core._errors import InvalidArgumentError
from chatkeep.core._messages import Message
from chatkeep.core._providers import ContextProvider, SessionContext
from chatkeep.core._session import AgentSession
from chatkeep.core.backend import SearchHit, SessionKey, TenantScope, embed_messages, searchable

if TYPE_CHECKING:
    from chatkeep.core._agent import Agent
    from chatkeep.core.backend import HistoryStore

__all__ = ["SemanticRecallProvider", "recalled_message"]


def recalled_message(hit: SearchHit) -> Message:
    """The context message that brings ``hit`` back: its text, with who said it and when."""
    said = hit.message.created_at.strftime("%Y-%m-%d %H:%M UTC")
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

    async def before_run(
        self, *, agent: Agent, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Search with the input's text and add the best matches the context does not hold yet."""
        query = "\n".join(message.text for message in context.input_messages if message.text.strip())
        if not query:
            return
        [vector] = await self.embedder.embed([query])
        key = SessionKey.of(session)
        scope = key if self.scope == "session" else TenantScope(session.tenant)
        present = {message.message_id for message in context.get_messages()}
        # Ask for more than k: some of the best may be in the window already.
        hits = await self._search.search(scope, vector, query, self.k + len(present), embedder=self.embedder.name)
        fresh = [hit for hit in hits if hit.message.message_id not in present][: self.k]
        if fresh:
            context.extend_messages(self, [recalled_message(hit) for hit in fresh])

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
