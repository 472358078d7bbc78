"""The error hierarchy: one base class, and every message says what was wrong and what to do next."""

from __future__ import annotations

import re

__all__ = [
    "AgentConfigurationError",
    "BackendConflictError",
    "ChatkeepError",
    "ConcurrencyConflictError",
    "HistoryModeConflictError",
    "IncompatiblePluginError",
    "InvalidArgumentError",
    "InvalidSessionKeyError",
    "MessageFormatError",
    "MessageTooLargeError",
    "MissingExtraError",
    "ModelError",
    "SessionFormatError",
    "SessionIntegrityError",
    "SessionOwnershipError",
    "StoreClosedError",
    "StoreConfigurationError",
    "StoreLoopError",
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
    """A dict handed to ``AgentSession.from_dict`` is not a serialized session."""


class SessionOwnershipError(ChatkeepError, PermissionError):
    """A session belongs to another tenant or owner than the caller's."""


class SessionIntegrityError(ChatkeepError, ValueError):
    """A signed session payload failed verification."""


class MessageFormatError(ChatkeepError, ValueError):
    """A stored message record cannot be read by this version of chatkeep."""


class MessageTooLargeError(ChatkeepError, ValueError):
    """A message is larger than the store's configured limit."""


class InvalidSessionKeyError(ChatkeepError, ValueError):
    """A tenant or session id is empty, too long or not valid unicode."""


class InvalidArgumentError(ChatkeepError, ValueError):
    """A store call got an argument out of its range (a negative ``last``, a ``limit`` of 0, a bad cursor...)."""


class ConcurrencyConflictError(ChatkeepError):
    """A versioned write found a newer version than the one it expected."""


class StoreUnavailableError(ChatkeepError, ConnectionError):
    """The storage server could not be reached or failed; the driver's error is chained as the cause."""


class StoreConfigurationError(ChatkeepError, ValueError):
    """A store URL or option is malformed or unknown; the message names the one to fix."""


class StoreClosedError(ChatkeepError, RuntimeError):
    """A store was used after ``close()``."""


class StoreLoopError(ChatkeepError, RuntimeError):
    """A store was used from another event loop than the one it was opened on."""


class SyncCallError(ChatkeepError, RuntimeError):
    """A blocking call (``SyncHistoryStore``, ``Agent.run_sync``) cannot run on its private event-loop thread.

    It was made from that very thread (it would wait on itself forever), or after the thread was stopped.
    """


class UnknownBackendError(ChatkeepError, LookupError):
    """No installed plugin handles a backend name or URL scheme."""


class UnsupportedOperationError(ChatkeepError, NotImplementedError):
    """A backend does not implement an optional store operation (its plugin was written before the operation)."""


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
_SECRET_PARAM = re.compile(
    r"(?P<head>(?:[?&;]|^)[\w.\-]*(?:password|passwd|pwd|secret|token|key|sas|sig|credential)[\w.\-]*=)[^&;#\s]*",
    re.I,
)


def redact_url(text: str) -> str:
    """Hide passwords and secret query parameters in any URL inside ``text``.

    Args:
        text: a URL, or a message that contains URLs.

    Returns:
        The same text with secrets replaced by ``***``.
    """
    text = _PASSWORD_IN_URL.sub(r"\g<head>***\g<at>", text)
    return _SECRET_PARAM.sub(r"\g<head>***", text)
