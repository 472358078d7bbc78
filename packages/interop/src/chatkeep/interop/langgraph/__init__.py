"""LangGraph persistence on any chatkeep store (``pip install "chatkeep-core[langgraph]"`` plus a backend's extra).

* :class:`ChatkeepSaver`: a ``BaseCheckpointSaver``, the checkpointer a compiled graph takes
  (``builder.compile(checkpointer=ChatkeepSaver("redis://localhost:6379/0", tenant="acme"))``).
* :class:`ChatkeepStore`: a ``BaseStore``, LangGraph's long-term memory (``builder.compile(..., store=...)``),
  whose ``search(query=...)`` is chatkeep's semantic recall where the store has it.
"""

from chatkeep.interop.langgraph._records import FORMAT
from chatkeep.interop.langgraph._saver import ChatkeepSaver
from chatkeep.interop.langgraph._store import ITEM_FORMAT, ChatkeepStore

__all__ = ["FORMAT", "ITEM_FORMAT", "ChatkeepSaver", "ChatkeepStore"]
