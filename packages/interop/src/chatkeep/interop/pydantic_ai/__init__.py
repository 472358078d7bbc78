"""Pydantic AI on chatkeep stores: :class:`ChatkeepConversationStore`, Pydantic AI's ``ConversationStore``.

Install with ``pip install "chatkeep-core[pydantic-ai]"`` plus the backend you use (``[redis]``, ``[sql]``).
"""

from chatkeep.interop.pydantic_ai._store import ChatkeepConversationStore

__all__ = ["ChatkeepConversationStore"]
