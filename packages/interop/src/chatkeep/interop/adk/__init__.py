"""Google ADK on chatkeep stores: :class:`ChatkeepSessionService` and :class:`ChatkeepMemoryService`.

Install with ``pip install "chatkeep-core[adk]"`` plus the backend you use (``[redis]``, ``[sql]``; the memory
service needs a store that can search and ``[recall]`` for the offline embedder).
"""

from chatkeep.interop.adk._memory import ChatkeepMemoryService
from chatkeep.interop.adk._sessions import ChatkeepSessionService

__all__ = ["ChatkeepMemoryService", "ChatkeepSessionService"]
