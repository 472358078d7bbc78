"""Encryption at rest for any backend: :class:`EncryptedStore` wraps a :class:`HistoryStore`.

Envelope encryption: each tenant has a random 256-bit data key; message contents (and session
state) are sealed with AES-GCM under it; the data key is kept wrapped by a master key, with the
master key's id beside it. Each ciphertext is bound (as associated data) to its tenant, session,
message id, role and time, so a ciphertext moved to another place fails to decrypt.

* Rotating the master key rewraps data keys; history is not rewritten.
* Deleting a tenant's wrapped data key (:meth:`EncryptedStore.shred_tenant`) makes its history
  unreadable everywhere (crypto-shredding), backups included.
* Ids, roles, times and order stay in clear, so windowed loads keep their cost and idempotent
  appends keep working.

Search: an index (vectors, keywords) holds in clear what it encodes, so an ``EncryptedStore`` has no search
capability and refuses to index (:class:`PlaintextIndexError`) unless told ``allow_plaintext_index=True``; then it
is a :class:`SearchableEncryptedStore`, which indexes through the inner store (the messages stay sealed there, the
index holds the plaintext's vectors and words) and opens the messages a search returns.

Wrapped data keys live in a separate ``key_store`` (another URL: a separate memory namespace,
database schema or Redis prefix). Never prune it: its entries are only ever replaced or shredded.

A session's keys never fork. A tenant's data key is made only when the data store holds nothing of that tenant:
a ``key_store`` pointing at the wrong place (a misspelled URL, prefix or schema) is refused with
:class:`MissingDataKeyError` instead of minting a second key there. Before its first write to a session, a store
instance opens the session's newest message (a load through the store has done that already), so it never writes
with a key other than the one the session holds, nor on top of plaintext a store without the wrapper appended.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from chatkeep.core._errors import (
    ChatkeepError,
    MissingExtraError,
    SearchUnsupportedError,
    UnsupportedOperationError,
    redact_url,
)
from chatkeep.core._messages import Content, DataContent, Message, new_message_id
from chatkeep.core._session import AgentSession, validate_id
from chatkeep.core.backend import (
    Absent,
    Candidate,
    HistoryStore,
    IndexInfo,
    Rankings,
    SearchableStore,
    SearchScope,
    SessionInfo,
    SessionKey,
    SessionPage,
    SessionUsage,
    StoredSession,
    TelemetryTarget,
    TenantScope,
    checked,
    searchable,
)
from chatkeep.core.backend._sealed import KEYS_TENANT, SEALED_MEDIA_TYPE, SEALED_PROPERTY, is_sealed

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        "chatkeep.core.encryption needs the cryptography package; "
        'install it with: pip install "chatkeep-core[encryption]"'
    ) from exc

__all__ = [
    "KEYS_TENANT",
    "SEALED_MEDIA_TYPE",
    "DecryptionError",
    "EncryptedStore",
    "MissingDataKeyError",
    "PlaintextIndexError",
    "SearchableEncryptedStore",
]

_SEALED = SEALED_PROPERTY
_NONCE = 12
_DK_ID = "1"  # one data key per tenant; the id is bound into its wrap, leaving room for more later
_VERIFIED_LIMIT = 4096  # sessions whose newest message a store instance has opened (bounded, oldest dropped)


class DecryptionError(ChatkeepError):
    """Stored data could not be decrypted: its data key was shredded, its master key is not in the keyring,
    the ciphertext was changed or moved, or the session holds messages a store without the wrapper wrote."""


class MissingDataKeyError(DecryptionError):
    """The key store holds no data key for a tenant whose data the data store holds.

    Either ``key_store`` points at the wrong place (a misspelled URL, prefix, schema or namespace), or the tenant's
    key was shredded. Nothing is written: a new key there would make the tenant's stored data unreadable to the
    store configured with the right key store.
    """


class PlaintextIndexError(SearchUnsupportedError):
    """An :class:`EncryptedStore` was asked to index or search without ``allow_plaintext_index=True``."""


def _plaintext_index_error() -> PlaintextIndexError:
    return PlaintextIndexError(
        "EncryptedStore lacks the search capability by default: an index keeps in clear what it encodes (a "
        "message's words, and vectors from which its meaning, often its words, can be recovered), so it would leak "
        "what the store encrypts. To search all the same, pass EncryptedStore(..., allow_plaintext_index=True) over "
        "an inner store that can search (memory://, PostgreSQL with pgvector, SQLite with ?transport=apsw): the "
        "messages stay encrypted at rest, the index holds their plaintext words and vectors (docs/security.md)"
    )


class _SealedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    contents: list[Content] = Field(default_factory=list)
    author_name: str | None = None
    additional_properties: dict[str, JsonValue] = Field(default_factory=dict)


def _lp(*parts: str) -> bytes:
    """Length-prefixed concatenation: no two different tuples of parts give the same bytes."""
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _where(store: HistoryStore) -> str:
    """A store as its ``describe()`` tells it, passwords hidden: ``RedisHistoryStore(url=..., prefix=...)``."""
    described = dict(store.describe())
    kind = described.pop("type", type(store).__name__)
    fields = ", ".join(f"{name}={value}" for name, value in described.items() if value is not None)
    return redact_url(f"{kind}({fields})")


def _ids(messages: Sequence[Message]) -> str:
    shown = ", ".join(m.message_id for m in messages[:5])
    return shown + (f" and {len(messages) - 5} more" if len(messages) > 5 else "")


def _refused(call: str, why: str) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"EncryptedStore does not support {call}: {why}; call it on a store without encryption, or keep the "
        "session's title and tags in your own encrypted records"
    )


class EncryptedStore(HistoryStore):
    """A :class:`HistoryStore` that encrypts what it stores in ``inner`` (see the module docs).

    Args:
        inner: the backend that stores the (sealed) messages and sessions.
        key_store: where wrapped data keys live; keep it apart from ``inner`` and never prune it.
        master_keys: master key id -> 32-byte AES key; every key unwraps, ``current_key_id`` wraps.
        current_key_id: the master key that wraps new data keys (default: the first).
        owns_stores: close ``inner`` and ``key_store`` when this store is closed.
        key_cache_seconds: how long an unwrapped data key is reused before it is read again (so a shred
            reaches other processes within this time).
        allow_plaintext_index: make a :class:`SearchableEncryptedStore`, which indexes and searches through
            ``inner`` (which must be able to) with the index in plaintext; without it, indexing or searching raises
            :class:`PlaintextIndexError`.
    """

    def __new__(cls, *args: Any, allow_plaintext_index: bool = False, **options: Any) -> EncryptedStore:
        """A :class:`SearchableEncryptedStore` when ``allow_plaintext_index`` is true."""
        if cls is EncryptedStore and allow_plaintext_index:
            cls = SearchableEncryptedStore
        return super().__new__(cls)

    def __init__(
        self,
        inner: HistoryStore,
        *,
        key_store: HistoryStore,
        master_keys: Mapping[str, bytes],
        current_key_id: str | None = None,
        owns_stores: bool = True,
        key_cache_seconds: float = 60.0,
        allow_plaintext_index: bool = False,
    ) -> None:
        super().__init__(max_message_bytes=inner.max_message_bytes)
        if inner is key_store:
            raise ValueError("key_store must be another store than inner (another URL, schema or prefix)")
        if not master_keys:
            raise ValueError("EncryptedStore needs at least one master key")
        for key_id, key in master_keys.items():
            if len(key) != 32:
                raise ValueError(f"master key {key_id!r} must be 32 bytes (AES-256), got {len(key)}")
        self.inner = inner
        self.key_store = key_store
        self.serves_any_loop = inner.serves_any_loop and key_store.serves_any_loop  # it keeps nothing per loop
        self.creates_if_absent = inner.creates_if_absent  # a save passes ABSENT through to inner
        # The limit applies to what the caller stores; the sealed record is larger (base64 of the
        # ciphertext plus clear metadata), so the inner store is allowed that expansion.
        inner.max_message_bytes = self.max_message_bytes * 4 // 3 + 4096
        self._master = {key_id: AESGCM(bytes(key)) for key_id, key in master_keys.items()}
        self.current_key_id = current_key_id if current_key_id is not None else next(iter(master_keys))
        if self.current_key_id not in self._master:
            raise ValueError(f"current_key_id {self.current_key_id!r} is not among the master keys")
        self.owns_stores = owns_stores
        self.key_cache_seconds = key_cache_seconds
        self._cache: dict[str, tuple[float, AESGCM]] = {}
        self._verified: dict[SessionKey, None] = {}
        self.allow_plaintext_index = allow_plaintext_index
        # The inner store hands sealed records to this wrapper; without it, it refuses them (EncryptedSessionError).
        inner.sealed_passthrough = True

    def _search_refusal(self) -> SearchUnsupportedError:
        return _plaintext_index_error()

    # -- data keys -------------------------------------------------------------------------------

    def _wrap(self, tenant: str, data_key: bytes, *, first: bool) -> Message:
        nonce = os.urandom(_NONCE)
        wrapped = self._master[self.current_key_id].encrypt(nonce, data_key, _lp("data-key", tenant, _DK_ID))
        body = {"dk": _DK_ID, "kek": self.current_key_id, "wrapped": _b64(nonce + wrapped)}
        # The first wrap has a fixed id: appends are idempotent by id, so of two writers creating a
        # tenant's key at once only the first is stored, and both then read the same key.
        message_id = "data-key" if first else f"data-key-rewrap-{new_message_id()}"
        return Message(message_id=message_id, role="system", text=json.dumps(body))

    def _unwrap(self, tenant: str, wraps: list[Message]) -> bytes:
        """The data key, from the newest wrap whose master key this store holds."""
        for wrap in reversed(wraps):
            body = json.loads(wrap.text)
            master = self._master.get(body["kek"])
            if master is None:
                continue
            raw = base64.b64decode(body["wrapped"])
            try:
                return master.decrypt(raw[:_NONCE], raw[_NONCE:], _lp("data-key", tenant, body["dk"]))
            except InvalidTag as exc:
                raise DecryptionError(f"the data key of tenant {tenant!r} does not match its master key") from exc
        held = sorted({json.loads(w.text)["kek"] for w in wraps})
        raise DecryptionError(
            f"tenant {tenant!r}'s data key is wrapped by master key(s) {held!r}, none of which this store holds; "
            "add the master key to master_keys"
        )

    async def _data_key(self, session: SessionKey, *, create: bool) -> AESGCM | None:
        tenant = session.tenant
        cached = self._cache.get(tenant)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        key = SessionKey(KEYS_TENANT, tenant)
        wraps = await self.key_store.load(key, last=8)
        if not wraps and create:
            # Only here, once per tenant and key store, does a write cost more round trips: a key is made only
            # for a tenant the data store holds nothing of. Otherwise the key store is the wrong one, or the key
            # was shredded; a new key would fork the tenant's keys.
            if await self._tenant_has_data(session):
                # A first writer racing this one stores its key before its data: read the key store once more.
                wraps = await self.key_store.load(key, last=8)
                if not wraps:
                    raise self._missing_key(session, "nothing was written")
            else:
                await self.key_store.append(key, [self._wrap(tenant, os.urandom(32), first=True)])
                wraps = await self.key_store.load(key, last=8)
        if not wraps:
            return None
        aead = AESGCM(self._unwrap(tenant, wraps))
        self._cache[tenant] = (time.monotonic() + self.key_cache_seconds, aead)
        return aead

    async def _tenant_has_data(self, session: SessionKey) -> bool:
        """Whether ``inner`` holds any session of the tenant (or this session's document)."""
        listed = await self.inner.list_sessions(session.tenant, limit=1)
        return bool(listed.items) or await self.inner.load_session(session) is not None

    def _missing_key(self, session: SessionKey, outcome: str) -> MissingDataKeyError:
        return MissingDataKeyError(
            f"the data store {_where(self.inner)} holds data of tenant {session.tenant!r}, but the key store "
            f"{_where(self.key_store)} holds no data key for it, so {outcome}. Check key_store: it must be the "
            "key store that tenant's data was written with (a misspelled URL, prefix, schema or namespace opens "
            "an empty one). If the tenant's key was shredded, its history is gone by design: delete it "
            "(delete_tenant, or chatkeep sessions delete) before writing to the tenant again. A tenant stored "
            "without encryption is not encrypted in place: copy its sessions through EncryptedStore into "
            "another data store"
        )

    async def _writing_key(self, session: SessionKey) -> AESGCM:
        aead = await self._data_key(session, create=True)
        if aead is None:  # the key store lost the key it just acknowledged
            raise DecryptionError(
                f"could not create a data key for tenant {session.tenant!r} in the key store {_where(self.key_store)}"
            )
        return aead

    async def _reading_key(self, session: SessionKey) -> AESGCM:
        aead = await self._data_key(session, create=False)
        if aead is None:
            raise self._missing_key(session, "it cannot be read")
        return aead

    def _verify(self, key: SessionKey) -> None:
        """Remember that ``key``'s newest message opened with this store's data key (or that it has none)."""
        if key not in self._verified and len(self._verified) >= _VERIFIED_LIMIT:
            del self._verified[next(iter(self._verified))]
        self._verified[key] = None

    async def _check_before_first_write(self, key: SessionKey, aead: AESGCM) -> None:
        """Open the session's newest message once per session and instance, so a write never forks its keys.

        A load through this store has done it already (at no cost); otherwise it costs one ``load(last=1)``.
        """
        if key in self._verified:
            return
        newest = await self.inner.load(key, last=1)
        self._open_all(key, aead, newest, outcome="nothing was written")
        self._verify(key)

    @staticmethod
    def _message_aad(key: SessionKey, message: Message) -> bytes:
        return _lp(
            "message", key.tenant, key.session_id, message.message_id, message.role, message.created_at.isoformat()
        )

    def _seal(self, key: SessionKey, aead: AESGCM, message: Message) -> Message:
        body = message.model_dump_json(include={"contents", "author_name", "additional_properties"}).encode()
        nonce = os.urandom(_NONCE)
        sealed = aead.encrypt(nonce, body, self._message_aad(key, message))
        return Message(
            message_id=message.message_id,
            role=message.role,
            created_at=message.created_at,
            contents=[DataContent(data=_b64(nonce + sealed), media_type=SEALED_MEDIA_TYPE)],
            additional_properties={_SEALED: {"v": 1, "dk": _DK_ID}},
        )

    @staticmethod
    def _refuse_plaintext(key: SessionKey, read: Sequence[Message], *, outcome: str) -> None:
        """Raise naming every message of ``read`` that a store without keys wrote (it was not sealed)."""
        plain = [m for m in read if not is_sealed(m)]
        if plain:
            raise DecryptionError(
                f"session {key.session_id!r} of tenant {key.tenant!r} is read through EncryptedStore, but "
                f"{len(plain)} of the {len(read)} messages read are plaintext (message {_ids(plain)}): a store "
                f"without EncryptedStore appended them, so {outcome}. Configure that writer with EncryptedStore; "
                "read the plaintext messages with the wrapped store itself (store.inner) and remove them (pop() "
                "takes the newest), appending them again through EncryptedStore if they are wanted"
            )

    def _open_all(
        self, key: SessionKey, aead: AESGCM, sealed: Sequence[Message], *, outcome: str = "nothing was returned"
    ) -> list[Message]:
        """Open every message, or raise naming every message of ``sealed`` that a store without keys wrote."""
        self._refuse_plaintext(key, sealed, outcome=outcome)
        return [self._open(key, aead, m) for m in sealed]

    def _open(self, key: SessionKey, aead: AESGCM, message: Message) -> Message:
        content = cast("DataContent", message.contents[0])  # is_sealed checked it (_open_all)
        raw = base64.b64decode(content.data)
        try:
            body = aead.decrypt(raw[:_NONCE], raw[_NONCE:], self._message_aad(key, message))
            opened = _SealedBody.model_validate_json(body)
        except (InvalidTag, ValidationError) as exc:
            raise DecryptionError(
                f"message {message.message_id} in session {key.session_id!r} failed to decrypt: it was changed, "
                "or moved from another session or tenant, or sealed with another data key (written through another "
                f"key store than {_where(self.key_store)})"
            ) from exc
        return Message(
            message_id=message.message_id,
            role=message.role,
            created_at=message.created_at,
            contents=opened.contents,
            author_name=opened.author_name,
            additional_properties=opened.additional_properties,
        )

    # -- the contract's hooks (the base class checks the arguments) ------------------------------

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        """Seal and append (atomic and idempotent as ``inner`` is); the size limit applied to the plaintext."""
        aead = await self._writing_key(key)
        await self._check_before_first_write(key, aead)
        return await self.inner.append(key, [self._seal(key, aead, m) for m in messages])

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        sealed = await self.inner.load(key, last=last)
        if not sealed:
            self._verify(key)
            return []
        self._refuse_plaintext(key, sealed, outcome="nothing was returned")  # before the key: it names the cause
        opened = self._open_all(key, await self._reading_key(key), sealed)
        self._verify(key)  # the newest message opened: a first write needs no check of its own
        return opened

    async def _load_before(self, key: SessionKey, before: int, last: int | None) -> list[Message]:
        """Read the range from ``inner`` (as cheaply as it reads it) and open it."""
        sealed = await self.inner.load(key, last=last, before=before)
        return self._open_all(key, await self._reading_key(key), sealed) if sealed else []

    async def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        aead: AESGCM | None = None
        async for message in self.inner.iter_messages(key, batch=batch):
            self._refuse_plaintext(key, [message], outcome="the iteration stopped there")
            if aead is None:
                aead = await self._reading_key(key)
            yield self._open(key, aead, message)

    async def _count(self, key: SessionKey) -> int:
        return await self.inner.count(key)

    async def _delete(self, key: SessionKey) -> bool:
        return await self.inner.delete(key)

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        return await self.inner.trim(key, keep_last)

    async def _pop(self, key: SessionKey) -> Message | None:
        """Pop from ``inner`` (atomic as it is) and open the message."""
        sealed = await self.inner.pop(key)
        if sealed is None:
            return None
        try:
            return self._open_all(key, await self._reading_key(key), [sealed], outcome="it was put back")[0]
        except DecryptionError:
            # The pop already removed it, and it was the newest: appending it again puts it back in its place.
            await self.inner.append(key, [sealed])
            raise

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        return await self.inner.list_sessions(tenant, limit=limit, cursor=cursor)

    async def _session_info(self, key: SessionKey) -> SessionInfo | None:
        """As ``inner``, as ``list_sessions`` is (an entry holds no message: nothing in it is sealed)."""
        return await self.inner.session_info(key)

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | Absent | None, owner: str | None
    ) -> str:
        """Seal the session's state and save it in ``inner``."""
        aead = await self._writing_key(key)
        nonce = os.urandom(_NONCE)
        state = json.dumps(session.to_dict()["state"], separators=(",", ":")).encode()
        sealed = aead.encrypt(nonce, state, _lp("session", key.tenant, key.session_id))
        stored = AgentSession(
            session_id=session.session_id,
            tenant=session.tenant,
            service_session_id=session.service_session_id,
            state={_SEALED: {"v": 1, "dk": _DK_ID, "data": _b64(nonce + sealed)}},
        )
        return await self.inner.save_session(key, stored, expected_version=expected_version, owner=owner)

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        """Load the session from ``inner`` and open its state."""
        found = await self.inner.load_session(key)
        if found is None:
            return None
        sealed = found.session.state.get(_SEALED)
        if not isinstance(sealed, dict):
            raise DecryptionError(
                f"the session document of session {key.session_id!r} of tenant {key.tenant!r} is not sealed: a store "
                "without EncryptedStore saved it; configure that writer with EncryptedStore, then save the session "
                "again through EncryptedStore (or delete it)"
            )
        aead = await self._reading_key(key)
        raw = base64.b64decode(sealed["data"])
        try:
            state = json.loads(aead.decrypt(raw[:_NONCE], raw[_NONCE:], _lp("session", key.tenant, key.session_id)))
        except InvalidTag as exc:
            raise DecryptionError(f"the session document of {key} failed to decrypt: it was changed or moved") from exc
        session = found.session
        return StoredSession(
            AgentSession(
                session_id=session.session_id,
                tenant=session.tenant,
                service_session_id=session.service_session_id,
                state=state,
            ),
            found.version,
            found.owner,
        )

    async def _prune(self, cutoff: datetime, tenant: str | None) -> int:
        """As ``inner`` (data keys stay: a pruned tenant may write again)."""
        return await self.inner.prune(older_than=cutoff, tenant=tenant)

    async def _list_tenants(self) -> list[str]:
        """As ``inner`` (tenant names are stored in clear)."""
        return await self.inner.list_tenants()

    async def _delete_tenant(self, tenant: str) -> int:
        """Delete the tenant's data in ``inner`` and its data key."""
        removed = await self.inner.delete_tenant(tenant)
        await self.shred_tenant(tenant)
        return removed

    # Forks, usage and info are refused, not passed to ``inner``: a seal binds each message to its session (a fork
    # would read its source's messages under its own key and fail to open them), usage contents are sealed, and a
    # title, tags or metadata would be stored in clear beside the sealed history.

    async def _fork(self, source: SessionKey, target: SessionKey, through: str | None) -> int:
        raise _refused("fork()", "each message is sealed to its session, so a fork could not open what it took")

    async def _usage(self, key: SessionKey) -> SessionUsage:
        raise _refused("usage()", "the messages' usage contents are sealed")

    async def _update_info(
        self, key: SessionKey, title: str | None, tags: frozenset[str] | None, metadata: dict[str, Any] | None
    ) -> bool:
        raise _refused("update_info()", "a title, tags or metadata would be stored in clear")

    async def _list_tagged_sessions(self, tenant: str, tag: str, limit: int, cursor: str | None) -> SessionPage:
        raise _refused("list_sessions(tag=...)", "it keeps no tags")

    # -- key management --------------------------------------------------------------------------

    @checked
    async def shred_tenant(self, tenant: str) -> bool:
        """Delete the tenant's wrapped data key: its stored history becomes unreadable (crypto-shredding).

        When ``inner`` can search, the tenant's index entries are deleted from its storage too (the sealed
        messages stay, unreadable): they were made from the plaintext by ``allow_plaintext_index=True``. Should
        that fail after the key is gone, call it again: it deletes what is left.

        Returns:
            Whether a data key was deleted.
        """
        validate_id(tenant, "tenant")
        self._cache.pop(tenant, None)
        shredded = await self.key_store.delete(SessionKey(KEYS_TENANT, tenant))
        # Another wrapper on the same inner store may have indexed the tenant, whatever this one allows.
        if isinstance(self.inner, SearchableStore):
            # A database that cannot index (no pgvector, no sqlite-vec) holds no entries to delete.
            with contextlib.suppress(SearchUnsupportedError):
                await self.inner.unindex(TenantScope(tenant))
        return shredded

    @checked
    async def rotate_master_key(self) -> int:
        """Rewrap every data key not yet wrapped by ``current_key_id``; returns how many were rewrapped.

        Messages are not touched. Once this returns, retired master keys can leave ``master_keys``.
        """
        rewrapped = 0
        cursor: str | None = None
        while True:
            page = await self.key_store.list_sessions(KEYS_TENANT, limit=100, cursor=cursor)
            for info in page.items:
                tenant = info.session_id
                key = SessionKey(KEYS_TENANT, tenant)
                wraps = await self.key_store.load(key, last=8)
                if not wraps or json.loads(wraps[-1].text)["kek"] == self.current_key_id:
                    continue
                self._cache.pop(tenant, None)
                await self.key_store.append(key, [self._wrap(tenant, self._unwrap(tenant, wraps), first=False)])
                await self.key_store.trim(key, 1)
                rewrapped += 1
            if page.next_cursor is None:
                return rewrapped
            cursor = page.next_cursor

    # -- lifecycle -------------------------------------------------------------------------------

    async def _aclose(self) -> None:
        if self.owns_stores:
            await self.inner.close()
            await self.key_store.close()

    def describe(self) -> dict[str, Any]:
        """The wrapped store, and the master key in use (never the keys)."""
        return {"type": type(self).__name__, "inner": self.inner.describe(), "current_key_id": self.current_key_id}

    def _telemetry_target(self) -> TelemetryTarget:
        # Its spans wrap those of the inner store's calls (which name the database and server).
        return TelemetryTarget("chatkeep.encrypted")


class SearchableEncryptedStore(EncryptedStore, SearchableStore):
    """An :class:`EncryptedStore` that indexes and searches, its index in plaintext: ``allow_plaintext_index=True``.

    Messages are sealed in ``inner`` as by any ``EncryptedStore``; their index entries (vectors and keywords,
    made from the plaintext) go to ``inner``'s index in the same atomic append, and live and die with the sealed
    messages there. A search ranks in ``inner`` and opens what it returns. Crypto-shredding a tenant
    (``shred_tenant``) makes its messages unreadable and deletes their index entries (``unindex``).

    Raises:
        SearchUnsupportedError: ``inner`` cannot search.
    """

    def __init__(self, inner: HistoryStore, **options: Any) -> None:
        searchable(inner)  # names what the inner store lacks
        if not isinstance(inner, SearchableStore):
            raise SearchUnsupportedError(
                f"allow_plaintext_index=True needs an inner store that subclasses SearchableStore; "
                f"{type(inner).__name__} does not: wrap a store from open_store() that can search"
            )
        super().__init__(inner, **options)
        self._searching: SearchableStore = inner

    async def _append_indexed(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        records: Sequence[str],
        info: IndexInfo,
        vectors: Sequence[tuple[float, ...] | None],
    ) -> int:
        """Seal the messages and append them to ``inner`` with index entries made from their plaintext."""
        aead = await self._writing_key(key)
        await self._check_before_first_write(key, aead)
        # The inner store checks and encodes the sealed records as its own append would (size, duplicates).
        sealed, sealed_records = self.inner._appendable(key, [self._seal(key, aead, m) for m in messages])
        plain = {m.message_id: m for m in messages}
        return await self._searching._append_indexed(
            key, [plain[m.message_id] for m in sealed], sealed_records, info, vectors
        )

    async def _index_info(self) -> IndexInfo | None:
        return await self._searching._index_info()

    async def _rankings(
        self,
        scope: SearchScope,
        vector: tuple[float, ...] | None,
        terms: list[str],
        limit: int,
        before_seq: int | None,
        roles: frozenset[str] | None,
    ) -> Rankings:
        """``inner``'s rankings, each message opened."""
        found = await self._searching._rankings(scope, vector, terms, limit, before_seq, roles)
        if not found.vector and not found.keyword:
            return found
        first = (found.vector or found.keyword)[0]
        aead = await self._reading_key(SessionKey(scope.tenant, first.session_id))  # one data key per tenant

        def opened(ranking: list[Candidate]) -> list[Candidate]:
            return [
                Candidate(
                    c.session_id, c.seq, self._open_all(SessionKey(scope.tenant, c.session_id), aead, [c.message])[0]
                )
                for c in ranking
            ]

        return Rankings(opened(found.vector), opened(found.keyword))

    async def _unindex(self, scope: SearchScope) -> int:
        return await self._searching._unindex(scope)

    async def _begin_reindex(self, info: IndexInfo) -> None:
        await self._searching._begin_reindex(info)

    async def _unindexed(self, key: SessionKey, info: IndexInfo, messages: Sequence[Message]) -> list[Message]:
        return await self._searching._unindexed(key, info, messages)

    async def _index(
        self, key: SessionKey, info: IndexInfo, messages: Sequence[Message], vectors: Sequence[tuple[float, ...]]
    ) -> int:
        """Index stored messages (read and opened by ``reindex``) with entries made from their plaintext."""
        return await self._searching._index(key, info, messages, vectors)
