"""Signed session payloads: a session that travels through a client comes back unchanged, or is refused.

``session.to_dict(signer=signer)`` adds an HMAC-SHA256 signature over the canonical JSON of the payload;
``AgentSession.from_dict(data, signer=signer)`` verifies it. Keys rotate: the signer signs with its
current key and accepts every key it holds, so a key can be retired once payloads signed with it expire.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from chatkeep.core._errors import InvalidArgumentError, SessionIntegrityError

__all__ = ["SIGNATURE_FIELD", "SessionSigner"]

SIGNATURE_FIELD = "sig"
_MIN_KEY_BYTES = 32


def _canonical(data: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _mac(key: bytes, key_id: str, payload: bytes) -> str:
    # The key id is part of what is signed, so a signature cannot be replayed under another key's name.
    digest = hmac.new(key, key_id.encode() + b"\x00" + payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class SessionSigner:
    """Signs and verifies serialized sessions with server-side secrets.

    Args:
        keys: key id -> secret (at least 32 bytes; ``str`` secrets are UTF-8 encoded). Every key verifies.
        current: the id of the key that signs (default: the first one).

    Example:
        ``signer = SessionSigner({"2026-11": secret_new, "2026-05": secret_old}, current="2026-11")``
    """

    def __init__(self, keys: Mapping[str, bytes | str], *, current: str | None = None) -> None:
        if not keys:
            raise InvalidArgumentError("SessionSigner needs at least one key")
        self._keys: dict[str, bytes] = {}
        for key_id, secret in keys.items():
            raw = secret.encode() if isinstance(secret, str) else bytes(secret)
            if len(raw) < _MIN_KEY_BYTES:
                raise InvalidArgumentError(
                    f"signing key {key_id!r} is {len(raw)} bytes; use at least {_MIN_KEY_BYTES} random bytes "
                    "(for example secrets.token_bytes(32))"
                )
            self._keys[key_id] = raw
        self.current = current if current is not None else next(iter(self._keys))
        if self.current not in self._keys:
            raise InvalidArgumentError(f"current key {self.current!r} is not among the keys {sorted(self._keys)!r}")

    def sign(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Return a copy of ``data`` with a signature field added (replacing any earlier one)."""
        signed = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
        mac = _mac(self._keys[self.current], self.current, _canonical(data))
        signed[SIGNATURE_FIELD] = {"kid": self.current, "mac": mac}
        return signed

    def verify(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """Check the signature and return the payload without it.

        Raises:
            SessionIntegrityError: the payload is unsigned, signed with an unknown key, or was changed.
        """
        signature = data.get(SIGNATURE_FIELD)
        if signature is None:
            raise SessionIntegrityError(
                "this session payload is not signed, and a signature is required; sign payloads with "
                "session.to_dict(signer=...) before they leave the server"
            )
        if not isinstance(signature, Mapping) or not isinstance(signature.get("kid"), str):
            raise SessionIntegrityError("this session payload's signature is malformed; refuse the request")
        key_id, mac = signature["kid"], signature.get("mac")
        key = self._keys.get(key_id)
        if key is None:
            raise SessionIntegrityError(
                f"this session payload was signed with key {key_id!r}, which this server does not hold (retired or "
                "never issued); ask the client to start a new session"
            )
        if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, key_id, _canonical(data))):
            raise SessionIntegrityError("this session payload was changed after it was signed; refuse the request")
        return {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
