"""Chat history in a vector store, the pattern of Agent Framework's storage documentation, on a chatkeep store.

The documentation's ``VectorChatHistoryProvider`` upserts each message into a vector store under a per-session
key, with its timestamp and text, and keeps that key in the session's state, so that a serialized session finds
its messages again. Here the vector store is any chatkeep store with the search capability (``memory://``,
PostgreSQL with pgvector, SQLite on ``?transport=apsw``): each message is appended with its embedding under
``SessionKey(tenant, db_key)`` (an append skips message ids already stored, as an upsert by key would), the store
keeps its time (``created_at``) and its text, and ``db_key`` lives in the provider's slice of the session state.

Run it: ``python docs/examples/vector-history/vector_history.py`` (offline: no model, no network).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from chatkeep.core import (
    Agent,
    AgentSession,
    Embedder,
    HistoryProvider,
    HistoryStore,
    InvalidArgumentError,
    Message,
    SearchHit,
    SessionKey,
    default_embedder,
    embed_messages,
    open_store,
)
from chatkeep.core.backend import searchable


# --8<-- [start:provider]
class VectorChatHistoryProvider(HistoryProvider):
    """Keeps a session's messages in a search-capable store, under a key it keeps in the session's state.

    Args:
        store: a store with the search capability (the vector store).
        embedder: makes each message's vector (``None``: the offline default).
        last: how many of the newest messages a run is given (the documentation's 10).
    """

    def __init__(
        self, store: HistoryStore, embedder: Embedder | None = None, *, last: int = 10, source_id: str = "vector"
    ) -> None:
        super().__init__(source_id)
        self.store = store
        self.search_store = searchable(store)  # a store without the capability is refused here
        self.embedder = embedder if embedder is not None else default_embedder()
        self.last = last

    @staticmethod
    def db_key(session: AgentSession, state: dict[str, Any] | None) -> SessionKey | None:
        """Where this session's messages are stored: the key kept in its state (``None``: nothing stored yet)."""
        db_key = (state or {}).get("db_key")
        return None if db_key is None else SessionKey(session.tenant, str(db_key))

    async def get_messages(
        self, session_id: str, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """The newest ``last`` messages under the session's key, oldest first (none before the first store)."""
        key = self.db_key(kwargs["session"], state)
        return [] if key is None else await self.store.load(key, last=self.last)

    async def save_messages(
        self, session_id: str, messages: Sequence[Message], *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Upsert the run's messages with their vectors under the session's key (made on the first store)."""
        if state is None:
            raise InvalidArgumentError("VectorChatHistoryProvider keeps its key in the session state; pass one")
        db_key = state.setdefault("db_key", uuid.uuid4().hex)
        embeddings = await embed_messages(self.embedder, messages)
        await self.search_store.append(SessionKey(kwargs["session"].tenant, db_key), messages, embeddings=embeddings)

    async def search(self, session: AgentSession, query: str, k: int = 3) -> list[SearchHit]:
        """The session's stored messages that best match ``query``, by meaning and by words."""
        key = self.db_key(session, session.state.get(self.source_id))
        if key is None:
            return []
        [vector] = await self.embedder.embed([query])
        return await self.search_store.search(key, vector, query, k, embedder=self.embedder.name)


# --8<-- [end:provider]


async def main() -> None:
    """Two runs, the session serialized and resumed, then a search of its history (offline)."""
    from chatkeep.core.offline import OfflineChatClient

    store = open_store("memory://vector-history")
    history = VectorChatHistoryProvider(store)
    async with Agent(OfflineChatClient(), history=history) as agent:
        session = agent.create_session()
        await agent.run("My bicycle's spare key hangs behind the kitchen door.", session=session)
        saved = session.to_dict()  # the key travels in the session's state
        resumed = AgentSession.from_dict(saved)
        reply = await agent.run("Where is the spare key?", session=resumed)
        print(reply.text)
        for hit in await history.search(resumed, "where is the extra key for the bike?"):
            print(f"{hit.message.created_at:%H:%M:%S} {hit.message.role}: {hit.message.text}")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())
