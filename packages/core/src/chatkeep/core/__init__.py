"""chatkeep core: message and session contracts, history providers, the store contract, the agent pipeline."""

from chatkeep.core._agent import Agent, AgentInput, AgentResponse, AgentResponseUpdate, BaseChatClient
from chatkeep.core._chat import ChatClient, ChatOptions, ChatResponse, ChatResponseUpdate
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
    decode_records,
    encode_records,
    new_message_id,
)
from chatkeep.core._providers import (
    ContextProvider,
    HistoryProvider,
    InMemoryHistoryProvider,
    MessageFilter,
    SessionContext,
    StoreHistoryProvider,
)
from chatkeep.core._reducers import (
    MessageCountingReducer,
    Reducer,
    SummarizingReducer,
    TokenBudgetReducer,
    approximate_token_count,
)
from chatkeep.core._session import DEFAULT_TENANT, MAX_ID_LENGTH, AgentSession, ProviderSessionState, validate_id
from chatkeep.core._signing import SessionSigner
from chatkeep.core._store import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HistoryStore,
    SessionInfo,
    SessionKey,
    SessionPage,
    StoredSession,
    cutoff_time,
    ttl_seconds,
)
from chatkeep.core._sync import SyncHistoryStore
from chatkeep.core._tools import FunctionTool, tool
from chatkeep.core.plugins import BackendSpec, history_provider, installed_backends, open_store, register_plugin

__version__ = "0.1.0"

__all__ = [
    *_errors_all,
    "Agent",
    "AgentInput",
    "AgentResponse",
    "AgentResponseUpdate",
    "BaseChatClient",
    "ChatClient",
    "ChatOptions",
    "ChatResponse",
    "ChatResponseUpdate",
    "Content",
    "DataContent",
    "FunctionCallContent",
    "FunctionResultContent",
    "Message",
    "Role",
    "TextContent",
    "UriContent",
    "Usage",
    "UsageContent",
    "decode_records",
    "encode_records",
    "new_message_id",
    "ContextProvider",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "MessageFilter",
    "SessionContext",
    "StoreHistoryProvider",
    "MessageCountingReducer",
    "Reducer",
    "SummarizingReducer",
    "TokenBudgetReducer",
    "approximate_token_count",
    "DEFAULT_TENANT",
    "MAX_ID_LENGTH",
    "validate_id",
    "cutoff_time",
    "ttl_seconds",
    "AgentSession",
    "SessionSigner",
    "ProviderSessionState",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HistoryStore",
    "SessionInfo",
    "SessionKey",
    "SessionPage",
    "StoredSession",
    "SyncHistoryStore",
    "FunctionTool",
    "tool",
    "BackendSpec",
    "history_provider",
    "installed_backends",
    "open_store",
    "register_plugin",
]
