"""Parsing ``azblob://CONTAINER[/PREFIX]`` URLs, the store's options, and where the account's credentials come from.

Secrets never live in the URL: a connection string comes from the ``connection_string`` keyword or the
``AZURE_STORAGE_CONNECTION_STRING`` variable, a SAS token from ``sas_token`` or ``AZURE_STORAGE_SAS_TOKEN``,
and an Azure credential from ``credential`` (or ``DefaultAzureCredential`` with azure-identity installed).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

from pydantic import Field

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import (
    Flag,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    StoreSettings,
    converted,
    positive_int,
    redact_url,
)

__all__ = [
    "CONNECTION_STRING_VARIABLE",
    "DEFAULT_PREFIX",
    "SAS_TOKEN_VARIABLE",
    "BlobConfig",
    "BlobSettings",
    "BlobURLError",
    "Credentials",
    "parse_url",
]

CONNECTION_STRING_VARIABLE = "AZURE_STORAGE_CONNECTION_STRING"
SAS_TOKEN_VARIABLE = "AZURE_STORAGE_SAS_TOKEN"
DEFAULT_PREFIX = "chatkeep"
#: Azure refuses an append blob's 50,001st block; a segment rolls over to the next one before.
MAX_SEGMENT_BLOCKS = 50_000
DEFAULT_SEGMENT_BLOCKS = 49_000
#: An append blob holds at most about 195 GiB; roll over well before.
DEFAULT_SEGMENT_BYTES = 64 * 1024**3
DEFAULT_INDEX_WINDOW = 1_000

_CONTAINER = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")
_PREFIX_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")
# Query parameters that carry secrets: refused in the URL (and hidden in the message that says so).
_SECRET_QUERY = {"sig", "sv", "se", "sp", "sas_token", "account_key", "accountkey", "connection_string", "credential"}


def shown(url: str) -> str:
    """``url`` with its secrets hidden, also where they are percent-encoded (``%26sig=``)."""
    return redact_url(unquote(url))


class BlobURLError(StoreConfigurationError):
    """An ``azblob://`` URL, one of its options, or the account's configuration is malformed or missing."""


def _account_url(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be the account's blob endpoint, like https://ACCOUNT.blob.core.windows.net")
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an http(s) URL, like https://ACCOUNT.blob.core.windows.net")
    if parts.query or "@" in parts.netloc:
        raise ValueError(
            "must not carry a SAS token or password: pass sas_token= or set AZURE_STORAGE_SAS_TOKEN instead"
        )
    return value.rstrip("/")


def _segment_blocks(value: object) -> int:
    number = positive_int(value)
    if number > MAX_SEGMENT_BLOCKS:
        raise ValueError(f"must be at most {MAX_SEGMENT_BLOCKS:,} (Azure's limit of blocks in an append blob)")
    return number


def check_prefix(value: object) -> str:
    """A blob-name prefix: ``/``-separated segments of letters, digits, ``_``, ``.`` and ``-`` (no ``.``/``..``)."""
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError("must be non-empty text of at most 256 characters")
    segments = value.split("/")
    if any(not _PREFIX_SEGMENT.match(s) or s in (".", "..") for s in segments):
        raise ValueError("must be /-separated names of letters, digits, '_', '.' and '-' (no empty, '.' or '..' part)")
    return value


class BlobSettings(StoreSettings):
    """The store's options (URL query or keywords). Credentials are keywords only: see :class:`Credentials`."""

    store_name = "Azure Blob"
    store_error = BlobURLError
    no_ttl_hint = (
        "Blob Storage has no per-blob TTL; delete idle sessions with store.prune(older_than=...) on a schedule, "
        "or with a lifecycle-management rule (see docs/backends/blob.md)"
    )
    option_hints = MappingProxyType(
        {"max_messages": "the load window is a history provider's max_messages; this store keeps everything"}
    )

    account_url: Annotated[str, converted(_account_url)] | None = Field(
        None, description="the account's blob endpoint (https://ACCOUNT.blob...)"
    )
    prefix: Annotated[str, converted(check_prefix)] = Field(
        DEFAULT_PREFIX, description="the first part of every blob name in the container; stores on others never meet"
    )
    create_container: Flag = Field(True, description="create the container on first use when it is missing")
    segment_blocks: Annotated[int, converted(_segment_blocks)] = Field(
        DEFAULT_SEGMENT_BLOCKS,
        description="appends per segment blob before the next segment starts (Azure's limit is 50,000)",
    )
    segment_bytes: PositiveInt = Field(
        DEFAULT_SEGMENT_BYTES, description="bytes per segment blob before the next starts"
    )
    index_window: PositiveInt = Field(
        DEFAULT_INDEX_WINDOW,
        description="newest messages whose ids and offsets each session's metadata blob keeps (exact windowed reads)",
    )
    connect_timeout: Seconds = Field(
        5.0,
        description="seconds the store's first request may take to get an answer from the service, retries "
        "included (a peer that accepts and never answers fails within it)",
    )
    read_timeout: Seconds = Field(
        30.0, description="seconds any later request may wait for the service's answer, retries included"
    )
    retries: NonNegativeInt = Field(
        3, description="retries of a failed request (503 and 429 throttling, 5xx, lost connections)"
    )
    retry_backoff: Seconds = Field(0.5, description="seconds before the first retry; doubles each retry (with jitter)")


@dataclass(frozen=True)
class Credentials:
    """Where the store gets the account from (exactly one of the three ways).

    Attributes:
        connection_string: a full connection string (``AccountName=...;AccountKey=...`` or a SAS one).
        account_url: the account's blob endpoint, used with ``sas_token`` or ``credential``.
        sas_token: a shared access signature for ``account_url``.
        credential: an Azure credential object (a token credential or a named key) for ``account_url``;
            ``None`` with neither this nor ``sas_token`` means ``DefaultAzureCredential``.
    """

    connection_string: str | None = None
    account_url: str | None = None
    sas_token: str | None = None
    credential: Any = None

    @property
    def shown(self) -> str:
        """Where the account is, without secrets, for messages."""
        if self.connection_string is None and self.account_url is None:
            return "the container client handed to the store"
        if self.connection_string is not None:
            fields = self._connection_fields()
            endpoint = fields.get("BlobEndpoint") or fields.get("AccountName", "?")
            return redact_url(f"the account {endpoint} (connection string)")
        return redact_url(f"the account {self.account_url}")

    @property
    def endpoint(self) -> str | None:
        """The account's blob endpoint URL (``None``: a container client was handed in, or it is not named)."""
        if self.connection_string is None:
            return self.account_url
        fields = self._connection_fields()
        if "BlobEndpoint" in fields:
            return fields["BlobEndpoint"]
        if "AccountName" not in fields:
            return None
        protocol = fields.get("DefaultEndpointsProtocol", "https")
        return f"{protocol}://{fields['AccountName']}.blob.{fields.get('EndpointSuffix', 'core.windows.net')}"

    def _connection_fields(self) -> dict[str, str]:
        return dict(part.strip().split("=", 1) for part in (self.connection_string or "").split(";") if "=" in part)


@dataclass(frozen=True)
class BlobConfig:
    """What an ``azblob://`` URL and its options select.

    Attributes:
        container: the container holding every blob of this store.
        credentials: where the account comes from.
        settings: the store's options, the prefix in the URL's path included.
        given_url: the URL as the caller wrote it.
    """

    container: str
    credentials: Credentials
    settings: BlobSettings
    given_url: str = ""

    @property
    def shown_url(self) -> str:
        """The URL as given, with any secret hidden, for messages and logs."""
        return shown(self.given_url)

    @property
    def where(self) -> str:
        """The container and account, for messages."""
        return f"container {self.container!r} of {self.credentials.shown}"


def parse_url(
    url: str,
    *,
    connection_string: str | None = None,
    sas_token: str | None = None,
    credential: Any = None,
    account_required: bool = True,
    **options: Any,
) -> BlobConfig:
    """Read ``azblob://CONTAINER[/PREFIX][?account_url=URL&OPTION=VALUE...]`` and the keyword options.

    The account: ``connection_string`` (or ``AZURE_STORAGE_CONNECTION_STRING``) when no ``account_url`` is given;
    else ``account_url`` with ``sas_token`` (or ``AZURE_STORAGE_SAS_TOKEN``), with ``credential``, or with
    ``DefaultAzureCredential``. Keyword options override the query; ``None`` means "not given". With
    ``account_required=False`` (a container client handed to the store) no account is looked for.

    Raises:
        BlobURLError: the URL is not an ``azblob://`` one, names no valid container, carries a secret, or an
            option is unknown or malformed, or no account is configured.
    """
    shown_url = shown(url)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise BlobURLError(f"{shown_url!r} is not a valid azblob URL ({exc})") from None
    if parts.scheme.lower() != "azblob" or not url[len(parts.scheme) :].startswith("://"):
        raise BlobURLError(
            f"{shown_url!r} is not an Azure Blob URL; write azblob://CONTAINER[/PREFIX][?account_url=...]"
        )
    if parts.fragment:
        raise BlobURLError(f"{shown_url!r} has a fragment (#...); remove it")
    if "@" in parts.netloc:
        raise BlobURLError(
            f"{shown_url!r} carries credentials; put the account in AZURE_STORAGE_CONNECTION_STRING (or pass "
            "connection_string=, sas_token= or credential=), never in the URL"
        )
    secrets = sorted({name.lower() for name, _ in _pairs(parts.query)} & _SECRET_QUERY)
    if secrets:
        raise BlobURLError(
            f"{shown_url!r} carries a secret ({', '.join(secrets)}); pass sas_token= or connection_string=, or set "
            f"{SAS_TOKEN_VARIABLE} / {CONNECTION_STRING_VARIABLE}, instead of putting it in the URL"
        )
    container = unquote(parts.netloc)
    if not _CONTAINER.match(container):
        raise BlobURLError(
            f"{shown_url!r} names the container {container!r}; a container name is 3 to 63 lowercase letters, digits "
            "and single hyphens, starting and ending with a letter or digit (azblob://CONTAINER)"
        )
    try:
        settings = BlobSettings.parse(parts.query, options, url=url)
    except BlobURLError as exc:
        # The parser shows the value it refused; a secret in it may be percent-encoded (%26sig=...).
        raise BlobURLError(shown(str(exc))) from None
    path = unquote(parts.path).strip("/")
    if path:
        if "prefix" in settings.model_fields_set:
            raise BlobURLError(f"{shown_url!r} gives the prefix twice (in the path and as prefix=); give it once")
        try:
            settings = settings.model_copy(update={"prefix": check_prefix(path)})
        except ValueError as exc:
            raise BlobURLError(f"the prefix {path!r} in {shown_url!r} {exc}") from None
    credentials = (
        _credentials(settings.account_url, connection_string, sas_token, credential)
        if account_required
        else Credentials()
    )
    return BlobConfig(container=container, credentials=credentials, settings=settings, given_url=url)


def _pairs(query: str) -> list[tuple[str, str]]:
    return [(pair.partition("=")[0], pair.partition("=")[2]) for pair in query.split("&") if pair]


def _credentials(
    account_url: str | None, connection_string: str | None, sas_token: str | None, credential: Any
) -> Credentials:
    if connection_string is not None:
        if account_url is not None or sas_token is not None or credential is not None:
            raise BlobURLError(
                "give either connection_string= or account_url with sas_token=/credential=, not both; "
                "a connection string names its account itself"
            )
        if not isinstance(connection_string, str) or "=" not in connection_string:
            raise BlobURLError("connection_string= must be an Azure Storage connection string (AccountName=...;...)")
        return Credentials(connection_string=connection_string)
    if account_url is None:
        from_env = os.environ.get(CONNECTION_STRING_VARIABLE, "").strip()
        if sas_token is not None or credential is not None:
            raise BlobURLError("sas_token= and credential= need the account: add ?account_url=https://ACCOUNT.blob...")
        if not from_env:
            raise BlobURLError(
                "no Azure Storage account is configured: set AZURE_STORAGE_CONNECTION_STRING, pass "
                "connection_string=, or name the account with ?account_url=https://ACCOUNT.blob.core.windows.net "
                "(with sas_token=, AZURE_STORAGE_SAS_TOKEN, credential=, or DefaultAzureCredential)"
            )
        return Credentials(connection_string=from_env)
    if sas_token is not None and credential is not None:
        raise BlobURLError("give sas_token= or credential=, not both")
    if sas_token is None and credential is None:
        sas_token = os.environ.get(SAS_TOKEN_VARIABLE, "").strip() or None
    if sas_token is not None and (not isinstance(sas_token, str) or "sig=" not in sas_token):
        raise BlobURLError("sas_token= must be a shared access signature (sv=...&sig=...)")
    return Credentials(account_url=account_url, sas_token=sas_token, credential=credential)
