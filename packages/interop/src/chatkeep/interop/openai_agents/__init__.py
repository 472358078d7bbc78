"""The OpenAI Agents SDK on chatkeep stores: :class:`ChatkeepSession`, the SDK's ``Session`` protocol.

Install with ``pip install "chatkeep-core[openai-agents]"`` plus the backend you use (``[redis]``, ``[sql]``).
"""

from chatkeep.interop.openai_agents._session import ChatkeepSession

__all__ = ["ChatkeepSession"]
