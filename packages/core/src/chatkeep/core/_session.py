"""Agent sessions: the handle that ties runs of one conversation together, and its JSON form."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from chatkeep.core._errors import InvalidSessionKeyError, SessionFormatError, SessionOwnershipError

if TYPE_CHECKING:
    from chatkeep.core._signing import SessionSigner

__all__ = ["DEFAULT_TENANT", "MAX_ID_LENGTH", "AgentSession", "ProviderSessionState", "validate_id"]

DEFAULT_TENANT = "default"
MAX_ID_LENGTH = 1024
SESSION_FORMAT_VERSION = 1
_FIELDS = {"type", "v", "session_id", "tenant", "service_session_id", "state"}


def validate_id(value: object, what: str) -> str:
    """Check that ``value`` is usable as a tenant or session id and return it unchanged.

    Ids are compared exactly (no case folding, trimming or normalization), so any non-empty
    unicode string of up to 1,024 characters is accepted.

    Raises:
        InvalidSessionKeyError: the id is not a string, is empty, is too long or holds lone surrogates.
    """
    if not isinstance(value, str):
        raise InvalidSessionKeyError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidSessionKeyError(f"{what} must not be empty; pass a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidSessionKeyError(
            f"{what} is {len(value):,} characters long, over the limit of {MAX_ID_LENGTH:,}; "
            "use a shorter id (a hash of a long natural key works well)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidSessionKeyError(
            f"{what} is not valid unicode (it holds a lone surrogate at position {exc.start}); "
            "decode the id properly before using it"
        ) from None
    return value


def _json_safe_copy(state: Any, what: str) -> Any:
    try:
        text = json.dumps(state, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise SessionFormatError(
            f"{what} must hold only JSON values (dict, list, str, int, float, bool, None): {exc}"
        ) from exc
    try:
        text.encode("utf-8")  # JSON can escape a lone surrogate, but no store can keep it as text
    except UnicodeEncodeError as exc:
        raise SessionFormatError(
            f"{what} holds a string that is not valid unicode (a lone surrogate, as a bad decode leaves, near "
            f"{text[max(0, exc.start - 20) : exc.start]!r}); decode the text properly before putting it in a session"
        ) from None
    return json.loads(text)


class AgentSession:
    """One conversation: its ids and the state its providers keep in it.

    Attributes:
        session_id: the conversation's id (a random UUID unless given).
        tenant: the tenant that owns it; it comes from the server, never from a client payload.
        service_session_id: the model service's conversation or response id, when the service keeps the history.
        state: JSON-safe dict; each provider keeps its own slice under its own key.
    """

    __slots__ = ("service_session_id", "session_id", "state", "tenant")

    def __init__(
        self,
        *,
        session_id: str | None = None,
        tenant: str = DEFAULT_TENANT,
        service_session_id: str | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.session_id: str = validate_id(session_id if session_id is not None else str(uuid.uuid4()), "session_id")
        self.tenant: str = validate_id(tenant, "tenant")
        self.service_session_id: str | None = service_session_id
        self.state: dict[str, Any] = state if state is not None else {}

    def __repr__(self) -> str:
        return (
            f"AgentSession(session_id={self.session_id!r}, tenant={self.tenant!r}, "
            f"service_session_id={self.service_session_id!r}, state_keys={sorted(self.state)!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentSession):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self, *, signer: SessionSigner | None = None) -> dict[str, Any]:
        """Return a JSON-safe dict that :meth:`from_dict` turns back into an equal session.

        Args:
            signer: sign the payload (do this when it travels through a client and comes back).

        Raises:
            SessionFormatError: ``state`` holds something that is not a JSON value, or it or
                ``service_session_id`` holds a string that is not valid unicode (a lone surrogate).
        """
        data = {
            "type": "session",
            "v": SESSION_FORMAT_VERSION,
            "session_id": self.session_id,
            "tenant": self.tenant,
            "service_session_id": _json_safe_copy(self.service_session_id, "session.service_session_id"),
            "state": _json_safe_copy(self.state, "session.state"),
        }
        return signer.sign(data) if signer is not None else data

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, tenant: str | None = None, signer: SessionSigner | None = None
    ) -> AgentSession:
        """Rebuild a session from :meth:`to_dict` output.

        Args:
            data: the serialized session (for example, parsed from JSON a client sent back).
            tenant: the tenant the server authenticated; when given, the payload must name the same tenant.
            signer: when given, the payload must carry a valid signature from one of its keys.

        Raises:
            SessionFormatError: ``data`` is not a serialized session; the message names the problem.
            SessionOwnershipError: ``tenant`` is given and the payload belongs to another tenant.
            SessionIntegrityError: ``signer`` is given and the payload is unsigned or was changed.
        """
        if not isinstance(data, Mapping):
            raise SessionFormatError(f"a serialized session must be a dict, got {type(data).__name__}")
        if signer is not None:
            data = signer.verify(data)
        elif "sig" in data:
            data = {k: v for k, v in data.items() if k != "sig"}  # signed, but the caller chose not to verify
        if data.get("type") != "session":
            raise SessionFormatError(
                f'this is not a serialized session: "type" is {data.get("type")!r}, expected "session"; '
                "pass the dict that AgentSession.to_dict() returned"
            )
        version = data.get("v")
        if type(version) is not int or version != SESSION_FORMAT_VERSION:  # True and 1.0 equal 1, but are not it
            raise SessionFormatError(
                f"unsupported session format version {version!r}; this chatkeep-core reads version "
                f"{SESSION_FORMAT_VERSION} (upgrade chatkeep-core to read sessions from a newer release)"
            )
        unknown = set(data) - _FIELDS
        if unknown:
            raise SessionFormatError(f"a serialized session has unknown fields {sorted(unknown)!r}")
        for name in ("session_id", "tenant"):
            if name not in data:
                raise SessionFormatError(f'a serialized session must have "{name}"')
            if not isinstance(data[name], str):
                raise SessionFormatError(f'"{name}" must be a string, got {type(data[name]).__name__}')
        service_id = data.get("service_session_id")
        if service_id is not None and not isinstance(service_id, str):
            raise SessionFormatError(f'"service_session_id" must be a string or null, got {type(service_id).__name__}')
        state = data.get("state", {})
        if not isinstance(state, dict):
            raise SessionFormatError(f'"state" must be a dict, got {type(state).__name__}')
        if tenant is not None:
            validate_id(tenant, "tenant")
            if data["tenant"] != tenant:
                raise SessionOwnershipError(
                    "this session belongs to another tenant than the one you passed; refuse the request "
                    "(the tenant must come from your server's authentication, never from the payload)"
                )
        try:
            return cls(
                session_id=data["session_id"],
                tenant=data["tenant"],
                service_session_id=_json_safe_copy(service_id, '"service_session_id"'),
                state=_json_safe_copy(state, '"state"'),
            )
        except InvalidSessionKeyError as exc:
            raise SessionFormatError(f"a serialized session has an invalid id: {exc}") from exc


T = TypeVar("T")


class ProviderSessionState(Generic[T]):
    """Typed state that one provider keeps in ``session.state`` under its own key.

    The provider instance is shared by every session, so it must keep per-session values here,
    never on itself.

    Example:
        ``ProviderSessionState(MyState, state_key="my-provider").get_or_initialize(session)``

    Args:
        state_type: the type of the value (a pydantic model, a dataclass, a TypedDict, a dict...).
        state_key: the key in ``session.state``; make it unique among the agent's providers.
        initializer: builds the value for a session that has none yet (default: ``state_type()``).
    """

    def __init__(
        self,
        state_type: type[T],
        *,
        state_key: str,
        initializer: Callable[[AgentSession | None], T] | None = None,
    ) -> None:
        self.state_key = state_key
        self._adapter: TypeAdapter[T] = TypeAdapter(state_type)
        self._initializer = initializer or (lambda _session: state_type())

    def get_or_initialize(self, session: AgentSession | None) -> T:
        """Read this provider's value from the session, initializing it when absent."""
        if session is None or self.state_key not in session.state:
            return self._initializer(session)
        try:
            return self._adapter.validate_python(session.state[self.state_key])
        except ValidationError as exc:
            raise SessionFormatError(
                f"session.state[{self.state_key!r}] does not hold the expected value: {exc}"
            ) from exc

    def save(self, session: AgentSession, value: T) -> None:
        """Write this provider's value into the session (as JSON-safe data)."""
        session.state[self.state_key] = self._adapter.dump_python(value, mode="json")
