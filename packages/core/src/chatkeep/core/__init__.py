"""chatkeep core: messages, sessions, history providers, stores by URL, the agent pipeline.

These are the names an application uses. Backend authors build on :mod:`chatkeep.core.backend`.
"""

from chatkeep.core._agent import Agent, AgentInput, AgentResponse, AgentResponseUpdate, BaseChatClient
from chatkeep.core._chat import ChatClient, ChatOptions, ChatResponse, ChatResponseUpdate
from chatkeep.core._default_embedder import MiniLMEmbedder, default_embedder
from chatkeep.core._embedding import Embedder, WordLlamaEmbedder
from chatkeep.core._errors import *  # noqa: F403
from chatkeep.core._errors import __all__ as _errors_all
from chatkeep.core._messages import (
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    Role,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
    new_message_id,
)
from chatkeep.core._providers import (
    BackendHistoryProvider,
    ContextProvider,
    HistoryProvider,
    InMemoryHistoryProvider,
    MessageFilter,
    SessionContext,
    StoreHistoryProvider,
    history_provider,
)
from chatkeep.core._recall import SemanticRecallProvider
from chatkeep.core._reducers import MessageCountingReducer, Reducer, SummarizingReducer, TokenBudgetReducer
from chatkeep.core._session import DEFAULT_TENANT, MAX_ID_LENGTH, AgentSession, ProviderSessionState
from chatkeep.core._signing import SessionSigner
from chatkeep.core._tools import FunctionTool, tool
from chatkeep.core._version import __version__ as __version__
from chatkeep.core.backend import (
    ABSENT,
    ForkInfo,
    HistoryStore,
    ModelUsage,
    SearchHit,
    SessionInfo,
    SessionKey,
    SessionPage,
    SessionUsage,
    StoredSession,
    SupportsSearch,
    TenantScope,
    embed_messages,
)
from chatkeep.core.backend._sync import SyncHistoryStore, SyncSearchableStore
from chatkeep.core.plugins import installed_backends, open_store, register_plugin

__all__ = [
    "SemanticRecallProvider",
    "embed_messages",
    "TenantScope",
    "SupportsSearch",
    "SearchHit",
    "default_embedder",
    "WordLlamaEmbedder",
    "MiniLMEmbedder",
    "Embedder",
    *(name for name in _errors_all if name != "redact_url"),
    "ABSENT",
    "DEFAULT_TENANT",
    "MAX_ID_LENGTH",
    "Agent",
    "AgentInput",
    "AgentResponse",
    "AgentResponseUpdate",
    "AgentSession",
    "BackendHistoryProvider",
    "BaseChatClient",
    "ChatClient",
    "ChatOptions",
    "ChatResponse",
    "ChatResponseUpdate",
    "Content",
    "ContextProvider",
    "DataContent",
    "FunctionCallContent",
    "FunctionResultContent",
    "ForkInfo",
    "FunctionTool",
    "HistoryProvider",
    "HistoryStore",
    "InMemoryHistoryProvider",
    "Message",
    "MessageCountingReducer",
    "MessageFilter",
    "ModelUsage",
    "ProviderSessionState",
    "Reducer",
    "Role",
    "SessionContext",
    "SessionInfo",
    "SessionKey",
    "SessionPage",
    "SessionSigner",
    "SessionUsage",
    "StoreHistoryProvider",
    "StoredSession",
    "SummarizingReducer",
    "SyncHistoryStore",
    "SyncSearchableStore",
    "TextContent",
    "TokenBudgetReducer",
    "UriContent",
    "Usage",
    "UsageContent",
    "history_provider",
    "installed_backends",
    "new_message_id",
    "open_store",
    "register_plugin",
    "tool",
]
