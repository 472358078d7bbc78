"""The error hierarchy: one base class, and every message says what was wrong and what to do next."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

__all__ = [
    "AgentConfigurationError",
    "BackendConflictError",
    "ChatkeepError",
    "ConcurrencyConflictError",
    "DamagedListingError",
    "EmbedderMismatchError",
    "EncryptedSessionError",
    "HistoryModeConflictError",
    "IncompatiblePluginError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidSessionKeyError",
    "MessageFormatError",
    "MessageTooLargeError",
    "MissingExtraError",
    "ModelError",
    "ReplicationTimeoutError",
    "SearchUnsupportedError",
    "SessionFormatError",
    "SessionIntegrityError",
    "SessionOwnershipError",
    "StoreClosedError",
    "StoreConfigurationError",
    "StoreFullError",
    "StoreLoopError",
    "StoreNotFoundError",
    "StoreUnavailableError",
    "SyncCallError",
    "ToolError",
    "UnknownBackendError",
    "UnsupportedOperationError",
    "redact_url",
]


class ChatkeepError(Exception):
    """Base class of every error chatkeep raises on purpose."""


class AgentConfigurationError(ChatkeepError, ValueError):
    """An agent was built with settings that cannot work together."""


class HistoryModeConflictError(AgentConfigurationError):
    """A run mixes service-managed history with locally stored history."""


class SessionFormatError(ChatkeepError, ValueError):
    """A dict handed to ``AgentSession.from_dict``, or a session document a store holds, is not a serialized session."""


class DamagedListingError(SessionFormatError):
    """``list_sessions`` met stored data that no longer says which session it is (a Blob metadata blob).

    The message names each such entry where it is stored and how to remove it; nothing else is wrong with the
    tenant. A caller that can go on without them (``chatkeep sessions list --skip-damaged``) reads the rest:

    Attributes:
        page: the :class:`~chatkeep.core.SessionPage` of the listing without the damaged entries (its
            ``next_cursor`` goes on as usual; each later page names them again).
        entries: one text per damaged entry, naming where it is stored and what to do with it.
    """

    # Defaults only so that pickling (which calls the class with the message alone) round-trips.
    def __init__(self, message: str, *, page: Any = None, entries: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.page = page
        self.entries = entries


class SessionOwnershipError(ChatkeepError, PermissionError):
    """A session belongs to another tenant or owner than the caller's."""


class SessionIntegrityError(ChatkeepError, ValueError):
    """A signed session payload failed verification."""


class MessageFormatError(ChatkeepError, ValueError):
    """A stored message record cannot be read by this version of chatkeep, or a message cannot be encoded as one."""


class MessageTooLargeError(ChatkeepError, ValueError):
    """A message is larger than the store's configured limit."""


class InvalidSessionKeyError(ChatkeepError, ValueError):
    """A tenant or session id is empty, too long or not valid unicode."""


class InvalidArgumentError(ChatkeepError, ValueError):
    """A store call got an argument out of its range (a negative ``last``, a ``limit`` of 0, a bad cursor...)."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """A call got a value of the wrong type (a string where a list of messages belongs, ``None`` for a URL...).

    Both a :class:`ValueError` (as every :class:`InvalidArgumentError`) and a :class:`TypeError`.
    """


class EncryptedSessionError(ChatkeepError):
    """A store without keys met a session ``EncryptedStore`` wrote: its records are sealed, unreadable here.

    Raised instead of returning sealed messages (whose text would look empty) or adding plaintext to an encrypted
    session; the message names the session and says to open it through ``EncryptedStore``.
    """


class ConcurrencyConflictError(ChatkeepError):
    """A versioned write found a newer version than the one it expected."""


class StoreUnavailableError(ChatkeepError, ConnectionError):
    """The storage server could not be reached or failed; the driver's error is chained as the cause."""


class ReplicationTimeoutError(StoreUnavailableError):
    """A write was stored on the primary, but fewer replicas than asked for confirmed it in time.

    Unlike other unavailable-store errors, the write itself happened and is not undone: it may be
    lost if the primary fails before a replica has it. Retrying the same append is safe (appends are
    idempotent by ``message_id``) and waits for the replicas again.

    Attributes:
        acknowledged: how many replicas confirmed the write.
        required: how many were asked for.
        timeout_ms: how long the store waited for them, in milliseconds.
        popped: for a ``pop``, the message it removed (``None`` for other writes, or a pop of an empty session).
            Do not retry a pop: it would remove the next message.
    """

    popped: Any = None

    # Defaults only so that pickling (which calls the class with the message alone) round-trips.
    def __init__(self, message: str, *, acknowledged: int = 0, required: int = 0, timeout_ms: int = 0) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged
        self.required = required
        self.timeout_ms = timeout_ms


class StoreFullError(StoreUnavailableError):
    """The storage has no room left (a full disk, volume, quota or tablespace): nothing of the call was stored.

    A :class:`StoreUnavailableError`, so handlers of an unavailable store keep working; the message says to free
    space. The store needs no restart: once there is room again, its next call works.
    """


class StoreConfigurationError(ChatkeepError, ValueError):
    """A store URL or option is malformed or unknown; the message names the one to fix."""


class StoreNotFoundError(StoreConfigurationError):
    """A command that only reads found no storage at the URL (a misspelled SQLite path); nothing was created."""


class StoreClosedError(ChatkeepError, RuntimeError):
    """A store was used after ``close()``."""


class StoreLoopError(ChatkeepError, RuntimeError):
    """A store was used from another event loop than the one it was opened on."""


class SyncCallError(ChatkeepError, RuntimeError):
    """A blocking call (``SyncHistoryStore``, ``Agent.run_sync``) could not run.

    It was made from code running on its own private event loop (it would wait on itself forever), or after
    that loop was closed.
    """


class UnknownBackendError(ChatkeepError, LookupError):
    """No installed plugin handles a backend name or URL scheme."""


class UnsupportedOperationError(ChatkeepError, NotImplementedError):
    """A backend does not implement an optional store operation (its plugin was written before the operation)."""


class SearchUnsupportedError(UnsupportedOperationError):
    """A store without the search capability (``SupportsSearch``) was asked to index or search messages."""


class EmbedderMismatchError(ChatkeepError, ValueError):
    """A store's index was built with another embedder (name or dimensions) than the one a call uses."""


class BackendConflictError(ChatkeepError):
    """Two installed plugins claim the same backend name or URL scheme."""


class IncompatiblePluginError(ChatkeepError):
    """A plugin was built for a chatkeep-core version other than the one installed."""


class MissingExtraError(ChatkeepError, ImportError):
    """An optional dependency is not installed; the message names the command that installs it."""


class ModelError(ChatkeepError):
    """The model service failed or answered with something chatkeep cannot use."""


class ToolError(ChatkeepError):
    """A tool loop could not finish (for example, it exceeded its iteration limit)."""


# The userinfo password runs to the last "@" before the host, so a password holding "@" is hidden whole.
_PASSWORD_IN_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<secret>[^/?#\s]*)(?P<at>@)")
# A query parameter (or a connection-string field) and its value. Its name is matched decoded, as the URL
# parsers read it: ``pass%77ord=`` is a password too.
_PARAM = re.compile(r"(?P<head>(?:[?&;]|^)(?P<name>(?:[\w.\-]|%[0-9A-Fa-f]{2})+)=)[^&;#\s]*")
_SECRET_NAME = re.compile(r"password|passwd|pwd|secret|token|key|sas|sig|credential", re.I)


def _hide_secret_param(match: re.Match[str]) -> str:
    return match["head"] + "***" if _SECRET_NAME.search(unquote(match["name"])) else match[0]


def redact_url(text: str) -> str:
    """Hide passwords and secret query parameters in any URL inside ``text``.

    Args:
        text: a URL, or a message that contains URLs.

    Returns:
        The same text with secrets replaced by ``***``.
    """
    text = _PASSWORD_IN_URL.sub(r"\g<head>***\g<at>", text)
    return _PARAM.sub(_hide_secret_param, text)
