"""chatkeep core: message and session contracts, history providers, the store contract, the agent pipeline."""

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
from chatkeep.core._session import DEFAULT_TENANT, AgentSession, ProviderSessionState
from chatkeep.core._store import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HistoryStore,
    SessionInfo,
    SessionKey,
    SessionPage,
    StoredSession,
)
from chatkeep.core._tools import FunctionTool, tool

__version__ = "0.1.0"
