"""The API for backend authors: the store contract as a base class, the option parser, capabilities, the plugin hook.

A backend subclasses :class:`HistoryStore` and implements its protected hooks (``_append``, ``_load``, ...):
the public methods check arguments and state once, for every backend alike. It declares its options once, as
the typed fields of a :class:`StoreSettings` model, registers a
:class:`BackendSpec` from a :func:`hookimpl` of ``chatkeep_register_backends``, and proves itself with the
conformance kit (a backend that can search messages subclasses :class:`SearchableStore`). The rules every
backend would otherwise copy are here once: the write stamp
(:func:`write_stamp`), the ``list_sessions`` cursor (:func:`encode_cursor`), keys hashed from ids
(:func:`hashed_key`), and a write that a cancelled caller lets end (:func:`finish_if_cancelled`). Telemetry
needs nothing of a backend: the base class traces every public method; a backend may name its server
(``_telemetry_target``) and report retries (:func:`record_retry`).
User code imports :mod:`chatkeep.core` instead.
"""

from chatkeep.core._errors import redact_url
from chatkeep.core._finishing import finish_if_cancelled
from chatkeep.core._loop_thread import in_blocking_call, run_in_place
from chatkeep.core._messages import decode_records, encode_records
from chatkeep.core._telemetry import TelemetryTarget, record_retry
from chatkeep.core.backend import hookspecs
from chatkeep.core.backend._capabilities import (
    SupportsExistenceCheck,
    SupportsMigrate,
    SupportsNativeTTL,
    SupportsReadProbe,
    SupportsSchemaRevision,
)
from chatkeep.core.backend._converters import (
    Flag,
    NonEmptyText,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    boolean,
    converted,
    non_negative_int,
    positive_int,
    positive_seconds,
    text,
)
from chatkeep.core.backend._damage import damaged_listing_error, damaged_record_error, damaged_session_error
from chatkeep.core.backend._info import (
    ForkInfo,
    ModelUsage,
    SessionUsage,
    check_metadata,
    check_tag,
    check_tags,
    check_title,
    usage_of,
)
from chatkeep.core.backend._keys import hashed_key, length_prefixed
from chatkeep.core.backend._lazy import lazy_exports
from chatkeep.core.backend._loops import PerLoop
from chatkeep.core.backend._paging import decode_cursor, encode_cursor
from chatkeep.core.backend._refusals import (
    conflict_error,
    feature_unsupported_error,
    fork_source_error,
    fork_target_exists_error,
    owner_error,
)
from chatkeep.core.backend._search import (
    KEYWORD_WEIGHT,
    RRF_K,
    Candidate,
    Embeddings,
    IndexInfo,
    Rankings,
    SearchableStore,
    SearchHit,
    SearchScope,
    SupportsSearch,
    TenantScope,
    check_index,
    embed_messages,
    fuse,
    keyword_terms,
    searchable,
)
from chatkeep.core.backend._sessions import (
    ABSENT,
    Absent,
    SessionInfo,
    SessionKey,
    SessionPage,
    StoredSession,
    decode_session_document,
    session_document,
)
from chatkeep.core.backend._settings import DriverOptions, StoreSettings, TTLStoreSettings
from chatkeep.core.backend._spec import BackendSpec, hookimpl
from chatkeep.core.backend._stamps import stamp_time, time_stamp, write_stamp
from chatkeep.core.backend._store import DEFAULT_MAX_MESSAGE_BYTES, HistoryStore, checked

__all__ = [
    "ABSENT",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "KEYWORD_WEIGHT",
    "RRF_K",
    "Absent",
    "BackendSpec",
    "Candidate",
    "DriverOptions",
    "Embeddings",
    "Flag",
    "ForkInfo",
    "HistoryStore",
    "IndexInfo",
    "ModelUsage",
    "NonEmptyText",
    "NonNegativeInt",
    "PerLoop",
    "PositiveInt",
    "Rankings",
    "SearchHit",
    "SearchScope",
    "SearchableStore",
    "Seconds",
    "SessionInfo",
    "SessionKey",
    "SessionPage",
    "SessionUsage",
    "StoreSettings",
    "StoredSession",
    "SupportsExistenceCheck",
    "SupportsMigrate",
    "SupportsNativeTTL",
    "SupportsReadProbe",
    "SupportsSchemaRevision",
    "SupportsSearch",
    "TTLStoreSettings",
    "TelemetryTarget",
    "TenantScope",
    "boolean",
    "check_index",
    "check_metadata",
    "check_tag",
    "check_tags",
    "check_title",
    "checked",
    "conflict_error",
    "converted",
    "damaged_listing_error",
    "damaged_record_error",
    "damaged_session_error",
    "decode_cursor",
    "decode_records",
    "decode_session_document",
    "embed_messages",
    "encode_cursor",
    "encode_records",
    "feature_unsupported_error",
    "finish_if_cancelled",
    "fork_source_error",
    "fork_target_exists_error",
    "fuse",
    "hashed_key",
    "hookimpl",
    "hookspecs",
    "in_blocking_call",
    "keyword_terms",
    "lazy_exports",
    "length_prefixed",
    "non_negative_int",
    "owner_error",
    "positive_int",
    "positive_seconds",
    "record_retry",
    "redact_url",
    "run_in_place",
    "searchable",
    "session_document",
    "stamp_time",
    "text",
    "time_stamp",
    "usage_of",
    "write_stamp",
]
