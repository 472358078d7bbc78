"""The search capability: a store that indexes messages by meaning (vectors) and by words, and searches both.

:class:`SearchableStore` is the template a backend subclasses to offer it (it then satisfies
:class:`SupportsSearch`). The rules every backend shares are here once: the arguments' checks, the embedder
check (:func:`check_index`), the fusion of the vector ranking with the keyword ranking (reciprocal rank fusion,
:func:`fuse`), the keyword terms of a text (:func:`keyword_terms`) and ``reindex``'s walk. A backend stores the
index beside the messages, so that deleting, trimming, popping, pruning or expiring them removes it too, and
returns its two rankings from ``_rankings``; ``unindex`` removes a scope's entries and keeps its messages (what
crypto-shredding needs: the sealed messages are already unreadable, their plaintext index entries must go too).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from chatkeep.core._embedding import Embedder
from chatkeep.core._errors import (
    EmbedderMismatchError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)
from chatkeep.core._messages import Message
from chatkeep.core._session import DEFAULT_TENANT, validate_id
from chatkeep.core._telemetry import operation
from chatkeep.core._terms import keyword_terms
from chatkeep.core.backend._refusals import search_unsupported_error
from chatkeep.core.backend._sessions import SessionKey
from chatkeep.core.backend._store import HistoryStore

if TYPE_CHECKING:
    from chatkeep.core.backend._sync import SyncSearchableStore

__all__ = [
    "KEYWORD_WEIGHT",
    "RRF_K",
    "Candidate",
    "Embeddings",
    "IndexInfo",
    "Rankings",
    "SearchHit",
    "SearchScope",
    "SearchableStore",
    "SupportsSearch",
    "TenantScope",
    "check_index",
    "embed_messages",
    "fuse",
    "keyword_terms",
    "searchable",
]

#: The constant of reciprocal rank fusion: a hit at rank r (from 1) of a ranking scores weight / (RRF_K + r).
#: The usual 60 flattens the ranks, so that any message both rankings hold outranks the vector ranking's best when
#: the keyword ranking misses it: on the recall set of the tests, the messages that merely share a word with a
#: question ("job interview" for "what is my job?") pushed 4 facts of 40 out of the first five. With 1, the head
#: of each ranking decides: a keyword-only first hit still lands third, beside the vector ranking's best.
RRF_K = 1
#: The keyword ranking's weight in the fusion (the vector ranking's is 1): a sentence embedding judges meaning
#: better than shared words do, so a shared word alone must not outrank it.
KEYWORD_WEIGHT = 0.5
#: How many candidates of each ranking are fused per result asked for (at least :data:`_MIN_CANDIDATES`).
_CANDIDATES_PER_RESULT = 4
_MIN_CANDIDATES = 50


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """The embedder a store's index was built with: its name and the width of its vectors."""

    embedder: str
    dimensions: int

    @classmethod
    def of(cls, embedder: Embedder) -> IndexInfo:
        """The index info of ``embedder``."""
        return cls(embedder.name, embedder.dimensions)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """The vectors an ``append`` stores with its messages: one per message (``None``: a message without text).

    Make them with :func:`embed_messages`.
    """

    info: IndexInfo
    vectors: tuple[tuple[float, ...] | None, ...]


@dataclass(frozen=True, slots=True)
class TenantScope:
    """Search every session of a tenant; with ``owner``, only the sessions whose document is bound to that owner."""

    tenant: str = DEFAULT_TENANT
    owner: str | None = None

    def __post_init__(self) -> None:
        validate_id(self.tenant, "tenant")
        if self.owner is not None:
            validate_id(self.owner, "owner")


#: What a search looks in: one session (its :class:`SessionKey`) or a tenant (:class:`TenantScope`).
SearchScope = SessionKey | TenantScope


class SearchHit(NamedTuple):
    """One result of ``search``: the message, its session's id and its fused score (higher is better)."""

    message: Message
    session_id: str
    score: float


@dataclass(frozen=True, slots=True)
class Candidate:
    """One entry of a backend's ranking: the message, its session, and its sequence number within the session."""

    session_id: str
    seq: int
    message: Message


@dataclass(frozen=True, slots=True)
class Rankings:
    """What a backend's ``_rankings`` returns: its best candidates by vector and by keywords, best first."""

    vector: list[Candidate]
    keyword: list[Candidate]


def fuse(
    rankings: Rankings, k: int, *, recency_half_life: timedelta | None = None, now: datetime | None = None
) -> list[SearchHit]:
    """The ``k`` best of both rankings by weighted reciprocal rank fusion, optionally weighted towards recent messages.

    A candidate scores the sum over the rankings that hold it of ``weight / (RRF_K + rank)``, the weight being 1
    for the vector ranking and :data:`KEYWORD_WEIGHT` for the keyword ranking; with ``recency_half_life``, that
    score is halved for every half-life of the message's age.
    """
    scores: dict[tuple[str, str], float] = {}
    found: dict[tuple[str, str], Candidate] = {}
    for weight, ranking in ((1.0, rankings.vector), (KEYWORD_WEIGHT, rankings.keyword)):
        for rank, candidate in enumerate(ranking, start=1):
            ident = (candidate.session_id, candidate.message.message_id)
            scores[ident] = scores.get(ident, 0.0) + weight / (RRF_K + rank)
            found.setdefault(ident, candidate)
    if recency_half_life is not None:
        moment = now or datetime.now(timezone.utc)
        half_life = recency_half_life.total_seconds()
        for ident, candidate in found.items():
            age = max((moment - candidate.message.created_at).total_seconds(), 0.0)
            scores[ident] *= 0.5 ** (age / half_life)
    best = sorted(scores, key=lambda ident: (-scores[ident], ident))[:k]
    return [SearchHit(found[ident].message, found[ident].session_id, scores[ident]) for ident in best]


_REINDEX_HINT = (
    "run: chatkeep reindex --store URL (or store.reindex(embedder)) to rebuild the index with the new embedder"
)


def check_index(recorded: IndexInfo | None, wanted: IndexInfo) -> None:
    """Raise :class:`EmbedderMismatchError` when a store's index was built with another embedder than ``wanted``.

    A backend calls it where it reads the recorded info, in the transaction of the write it guards.
    """
    if recorded is not None and recorded != wanted:
        raise EmbedderMismatchError(
            f"this store's index was built with embedder {recorded.embedder!r} ({recorded.dimensions} dimensions), "
            f"not {wanted.embedder!r} ({wanted.dimensions} dimensions); use that embedder, or {_REINDEX_HINT}"
        )


async def embed_messages(embedder: Embedder, messages: Sequence[Message]) -> Embeddings:
    """Embed the text of each message (a message without text gets no vector), for ``append(embeddings=...)``."""
    listed = list(messages)
    texts = [(n, message.text) for n, message in enumerate(listed) if message.text.strip()]
    vectors = await embedder.embed([text for _, text in texts]) if texts else []
    info = IndexInfo.of(embedder)
    by_position: list[tuple[float, ...] | None] = [None] * len(listed)
    for (n, _), vector in zip(texts, vectors, strict=True):
        by_position[n] = _checked_vector(vector, info)
    return Embeddings(info, tuple(by_position))


def _checked_vector(vector: Sequence[float], info: IndexInfo) -> tuple[float, ...]:
    if len(vector) != info.dimensions:
        raise EmbedderMismatchError(
            f"embedder {info.embedder!r} says it makes vectors of {info.dimensions} dimensions but made one of "
            f"{len(vector)}; fix its dimensions property"
        )
    return tuple(map(float, vector))


@runtime_checkable
class SupportsSearch(Protocol):
    """A store that indexes messages by meaning and by words, and searches them (see :class:`SearchableStore`)."""

    async def append(
        self, key: SessionKey, messages: Sequence[Message], *, embeddings: Embeddings | None = None
    ) -> int:
        """Append messages, indexing them with ``embeddings`` when given."""
        ...

    async def search(
        self,
        scope: SearchScope,
        query_vector: Sequence[float] | None,
        query_text: str | None,
        k: int,
        *,
        before_seq: int | None = None,
        roles: Sequence[str] | None = None,
        embedder: str | None = None,
        recency_half_life: timedelta | None = None,
    ) -> list[SearchHit]:
        """The ``k`` best matches in ``scope``, best first."""
        ...

    async def reindex(
        self, embedder: Embedder, tenant: str | None = None, *, progress: Callable[[int], None] | None = None
    ) -> int:
        """Index every message (of ``tenant``) not yet indexed with ``embedder``; returns how many were indexed."""
        ...

    async def unindex(self, scope: SessionKey | TenantScope) -> int:
        """Remove the index entries of a session or a tenant, keeping its messages; returns how many were removed."""
        ...

    async def index_info(self) -> IndexInfo | None:
        """The embedder the index was built with (``None``: nothing indexed yet)."""
        ...


def searchable(store: object) -> SupportsSearch:
    """``store`` as a search-capable store.

    Raises:
        SearchUnsupportedError: the store does not have the search capability.
    """
    if not isinstance(store, SupportsSearch):
        raise store._search_refusal() if isinstance(store, HistoryStore) else search_unsupported_error(store)
    return store


def _check_vector(vector: object) -> tuple[float, ...]:
    if isinstance(vector, (str, bytes)) or not isinstance(vector, Sequence) or not vector:
        raise InvalidArgumentTypeError(
            f"query_vector must be a non-empty list of numbers (an embedder's vector), got {type(vector).__name__}"
        )
    try:
        values = tuple(float(x) for x in vector)
    except (TypeError, ValueError):
        raise InvalidArgumentTypeError("query_vector must hold numbers only") from None
    if not all(math.isfinite(x) for x in values):
        raise InvalidArgumentError("query_vector holds a NaN or an infinity; embed the query again")
    return values


class SearchableStore(HistoryStore):
    """A :class:`HistoryStore` with the search capability: subclass it and implement the index hooks.

    The hooks: ``_append_indexed`` (store messages with their vectors and keyword entries, atomically),
    ``_index_info``, ``_rankings`` (the best candidates by vector and by keywords in a scope), ``_unindex`` (drop a
    scope's entries, keep its messages), ``_unindexed``, ``_index`` and ``_begin_reindex`` (what ``reindex``
    needs). The index must live and die with the messages: ``_delete``, ``_trim``, ``_pop``, ``_prune``,
    ``_delete_tenant`` and expiry remove what they indexed.
    """

    def sync(self) -> SyncSearchableStore:
        """A blocking view of this store, with ``search``, ``reindex`` and ``index_info`` too."""
        from chatkeep.core.backend._sync import SyncSearchableStore

        return SyncSearchableStore(self)

    async def _append_embedded(self, key: SessionKey, messages: Sequence[Message], embeddings: Embeddings) -> int:
        if not isinstance(embeddings, Embeddings):
            raise InvalidArgumentTypeError(
                f"embeddings must be what embed_messages(embedder, messages) returns, got {type(embeddings).__name__}"
            )
        listed = list(messages) if isinstance(messages, Sequence) and not isinstance(messages, str) else messages
        kept, records = self._appendable(key, listed)  # refuses anything but a list of messages
        listed = list(listed)
        if len(listed) != len(embeddings.vectors):
            raise InvalidArgumentError(
                f"append got {len(listed)} messages but {len(embeddings.vectors)} vectors; embed the same messages"
            )
        if not records:
            return 0
        vectors = {
            message.message_id: vector
            for message, vector in reversed(list(zip(listed, embeddings.vectors, strict=True)))
        }
        return await self._append_indexed(
            key, kept, records, embeddings.info, [vectors[message.message_id] for message in kept]
        )

    @operation("search", lambda hits: {"db.response.returned_rows": len(hits)})
    async def search(
        self,
        scope: SearchScope,
        query_vector: Sequence[float] | None,
        query_text: str | None,
        k: int,
        *,
        before_seq: int | None = None,
        roles: Sequence[str] | None = None,
        embedder: str | None = None,
        recency_half_life: timedelta | None = None,
    ) -> list[SearchHit]:
        """The ``k`` best matches in ``scope`` (one session, or a tenant and optionally an owner), best first.

        The vector ranking (by cosine similarity to ``query_vector``) and the keyword ranking (of ``query_text``)
        are fused by reciprocal rank fusion; give only one of them to search by it alone.

        Args:
            scope: a :class:`SessionKey`, or a :class:`TenantScope` (another tenant's or owner's messages are
                never returned).
            query_vector: the query's vector, from the embedder the index was built with (``None``: words only).
            query_text: the query's words (``None`` or empty: meaning only).
            k: how many results at most (1 or more).
            before_seq: only messages at sequence numbers below it within their session (a session's first
                message is 0; a trim does not renumber the rest).
            roles: only messages of these roles.
            embedder: the name of the embedder that made ``query_vector``, checked against the index's.
            recency_half_life: weigh results towards recent messages: a score halves per half-life of age.

        Raises:
            EmbedderMismatchError: the index was built with another embedder (name or width).
        """
        self._check_usable()
        if not isinstance(scope, (SessionKey, TenantScope)):
            raise InvalidArgumentTypeError(
                f"search takes a SessionKey or a TenantScope, got {type(scope).__name__}; "
                "write TenantScope(tenant) to search a whole tenant"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidArgumentError(f"k must be a whole number of 1 or more, got {k!r}")
        if before_seq is not None and (isinstance(before_seq, bool) or not isinstance(before_seq, int)):
            raise InvalidArgumentError(f"before_seq must be a whole number or None, got {before_seq!r}")
        if roles is not None and (
            isinstance(roles, str) or not isinstance(roles, Sequence) or not all(isinstance(r, str) for r in roles)
        ):
            raise InvalidArgumentTypeError(f"roles must be a list of role names, e.g. ['user'], got {roles!r}")
        role_set = None if roles is None else frozenset(roles)
        vector = None if query_vector is None else _check_vector(query_vector)
        terms = keyword_terms(query_text) if query_text else []
        if vector is None and not terms:
            return []
        recorded = await self._index_info()
        if recorded is None:
            return []
        if vector is not None:
            check_index(recorded, IndexInfo(embedder or recorded.embedder, len(vector)))
        elif embedder is not None:
            check_index(recorded, IndexInfo(embedder, recorded.dimensions))
        if recency_half_life is not None and (
            not isinstance(recency_half_life, timedelta) or recency_half_life <= timedelta(0)
        ):
            raise InvalidArgumentError(f"recency_half_life must be a positive duration, got {recency_half_life!r}")
        limit = max(k * _CANDIDATES_PER_RESULT, _MIN_CANDIDATES)
        rankings = await self._rankings(scope, vector, terms, limit, before_seq, role_set)
        return fuse(rankings, k, recency_half_life=recency_half_life)

    @operation("unindex", lambda removed: {"db.response.returned_rows": removed})
    async def unindex(self, scope: SessionKey | TenantScope) -> int:
        """Remove the index entries of one session or of a whole tenant; the messages stay stored.

        The entries are gone from storage when it returns, not only from search results.
        ``EncryptedStore.shred_tenant`` calls it, so that a shredded tenant's plaintext index goes with its key.
        ``reindex`` indexes the messages again.

        Args:
            scope: a :class:`SessionKey`, or a :class:`TenantScope` without an owner.

        Returns:
            How many index entries were removed.
        """
        self._check_usable()
        if not isinstance(scope, (SessionKey, TenantScope)):
            raise InvalidArgumentTypeError(
                f"unindex takes a SessionKey or a TenantScope, got {type(scope).__name__}; "
                "write TenantScope(tenant) to unindex a whole tenant"
            )
        if isinstance(scope, TenantScope) and scope.owner is not None:
            raise InvalidArgumentError(
                "unindex takes a TenantScope without an owner; unindex the owner's sessions one by one (SessionKey)"
            )
        return await self._unindex(scope)

    @operation("index_info")
    async def index_info(self) -> IndexInfo | None:
        """The embedder the index was built with (``None``: nothing indexed yet)."""
        self._check_usable()
        return await self._index_info()

    async def reindex(
        self,
        embedder: Embedder,
        tenant: str | None = None,
        *,
        batch: int = 256,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Index every message (of ``tenant``, or of every tenant) that is not yet indexed with ``embedder``.

        With another embedder than the index's, the index switches to it: what the old one indexed is dropped and
        rebuilt. Memory stays constant (``batch`` messages at a time); after an interruption, run it again: it
        resumes, skipping what is already indexed.

        Args:
            embedder: the embedder to index with.
            tenant: only this tenant (``None``: every tenant).
            batch: messages read and embedded at a time.
            progress: called with the number of messages indexed so far, after each batch.

        Returns:
            How many messages were indexed.
        """
        self._check_usable()
        if not isinstance(embedder, Embedder):
            raise InvalidArgumentTypeError(f"reindex takes an Embedder, got {type(embedder).__name__}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgumentError(f"batch must be a whole number of 1 or more, got {batch!r}")
        info = IndexInfo.of(embedder)
        await self._begin_reindex(info)
        tenants = [validate_id(tenant, "tenant")] if tenant is not None else await self.list_tenants()
        done = 0
        for name in tenants:
            cursor: str | None = None
            while True:
                page = await self.list_sessions(name, limit=100, cursor=cursor)
                for session in page.items:
                    key = SessionKey(name, session.session_id)
                    pending: list[Message] = []
                    async for message in self.iter_messages(key, batch=batch):
                        pending.append(message)
                        if len(pending) == batch:
                            done += await self._index_batch(key, pending, embedder, info)
                            pending = []
                            if progress is not None:
                                progress(done)
                    if pending:
                        done += await self._index_batch(key, pending, embedder, info)
                        if progress is not None:
                            progress(done)
                cursor = page.next_cursor
                if cursor is None:
                    break
        return done

    async def _index_batch(self, key: SessionKey, messages: list[Message], embedder: Embedder, info: IndexInfo) -> int:
        missing = await self._unindexed(key, info, [m for m in messages if m.text.strip()])
        if not missing:
            return 0
        embeddings = await embed_messages(embedder, missing)
        return await self._index(key, info, missing, [v for v in embeddings.vectors if v is not None])

    # -- what a searchable backend implements --------------------------------------------------------

    @abc.abstractmethod
    async def _append_indexed(
        self,
        key: SessionKey,
        messages: Sequence[Message],
        records: Sequence[str],
        info: IndexInfo,
        vectors: Sequence[tuple[float, ...] | None],
    ) -> int:
        """``_append``, indexing each new message with a vector (and its keywords) in the same transaction.

        Call :func:`check_index` with the recorded info first (record ``info`` when there is none); a message
        with no vector is stored but not indexed. A message the session already holds is not stored again, but
        indexed if it is not yet (a history provider may have stored it first); count only the new ones.
        """

    @abc.abstractmethod
    async def _index_info(self) -> IndexInfo | None:
        """The recorded embedder of the index (``None``: none yet)."""

    @abc.abstractmethod
    async def _rankings(
        self,
        scope: SearchScope,
        vector: tuple[float, ...] | None,
        terms: list[str],
        limit: int,
        before_seq: int | None,
        roles: frozenset[str] | None,
    ) -> Rankings:
        """The ``limit`` best indexed messages in ``scope`` by cosine similarity to ``vector`` and by ``terms``.

        An empty ranking for a missing ``vector`` or empty ``terms``. Never a message of another tenant, nor,
        for a :class:`TenantScope` with an owner, of a session not bound to that owner.
        """

    @abc.abstractmethod
    async def _unindex(self, scope: SearchScope) -> int:
        """Delete the index entries of ``scope`` (a session, or a tenant without an owner) from storage; keep the
        messages and the recorded embedder. Return how many entries were deleted."""

    @abc.abstractmethod
    async def _begin_reindex(self, info: IndexInfo) -> None:
        """Record ``info`` as the index's embedder; when it differs from the recorded one, drop the old entries."""

    @abc.abstractmethod
    async def _unindexed(self, key: SessionKey, info: IndexInfo, messages: Sequence[Message]) -> list[Message]:
        """Those of ``messages`` the session holds that are not indexed with ``info``."""

    @abc.abstractmethod
    async def _index(
        self, key: SessionKey, info: IndexInfo, messages: Sequence[Message], vectors: Sequence[tuple[float, ...]]
    ) -> int:
        """Index stored ``messages`` with ``vectors`` (skip any no longer stored); return how many were indexed."""
