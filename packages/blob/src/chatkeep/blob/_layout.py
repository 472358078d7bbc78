"""Where a session lives in the container: blob names, the segment framing, id digests and list cursors.

Layout (``P`` is the prefix; ``T`` is the SHA-256 of the length-prefixed tenant, ``S`` of the length-prefixed
tenant and session id, both in hex)::

    P/m/T/S              block blob: the session's metadata (JSON, ETag-guarded): originals of the tenant and
                         id, generation, sequence numbers, segments, the index window, the session document,
                         usage, title, tags, metadata and the fork it came from
    P/d/T/S/GEN/NNNNNNNN append blobs: segment N of generation GEN, message records one per line
    P/d/T/S/GEN/r/HHHHHHHH.F.FGEN
                         empty: a reference of the fork F (its generation FGEN) to segments 0..H of this folder,
                         which keeps them when this session deletes or trims them
    P/t/T/G/S            empty: session S carries the tag whose hash is G (the tag's index)

Hex digests have no ``/``, ``.`` or ``%``, so no id can reach another folder; names stay under 200
characters whatever the ids (Azure allows 1,024), and ids that differ in any way hash apart.
A segment is a sequence of blocks, one per append: a header line ``~TOKEN`` (the append's random token, so
a writer recognises its own block after a lost reply) and the records, each on one line (JSON has no raw
newline). The generation changes when a session is deleted, so a writer that raced the delete can never
mix old blocks into the new session.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Iterator

from chatkeep.core.backend import hashed_key

__all__ = [
    "HEADER_BYTES",
    "Layout",
    "digest",
    "frame",
    "headers_after",
    "id_timestamp",
    "lines",
    "new_token",
    "parse_data_name",
    "session_hash",
]

_DIGEST_BYTES = 10
HEADER_BYTES = 18  # "~" + 16 hex digits + "\n"
NOT_UUID7 = (1 << 48) - 1  # the timestamp slot of an id that is not a UUIDv7


def tenant_hash(tenant: str) -> str:
    return hashed_key(tenant, domain=b"tenant\x00").hex()


def session_hash(tenant: str, session_id: str) -> str:
    return hashed_key(tenant, session_id, domain=b"session\x00").hex()


class Layout:
    """Blob names of one store (its prefix)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def meta(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}/m/{tenant_hash(tenant)}/{session_hash(tenant, session_id)}"

    def metas(self, tenant: str | None = None) -> str:
        """The folder of one tenant's metadata blobs (or of every tenant's)."""
        return f"{self.prefix}/m/" + ("" if tenant is None else f"{tenant_hash(tenant)}/")

    def data(self, tenant: str, session_id: str | None = None) -> str:
        """The folder of one session's segments (every generation), or of a whole tenant's."""
        folder = f"{self.prefix}/d/{tenant_hash(tenant)}/"
        return folder if session_id is None else folder + session_hash(tenant, session_id) + "/"

    def folder(self, tenant: str, session_id: str, generation: str) -> str:
        """The data folder of one generation of a session, as a fork's segments name it: ``T/S/GEN``."""
        return f"{tenant_hash(tenant)}/{session_hash(tenant, session_id)}/{generation}"

    def in_folder(self, folder: str, number: int | None = None) -> str:
        """Segment ``number`` of data folder ``folder`` (``None``: the folder itself, ending in ``/``)."""
        return f"{self.prefix}/d/{folder}/" + ("" if number is None else f"{number:08d}")

    def ref(self, folder: str, high: int, holder: str) -> str:
        """The reference of the fork ``holder`` (session hash and generation) to segments 0..``high`` of ``folder``."""
        return f"{self.prefix}/d/{folder}/r/{high:08d}.{holder}"

    def meta_of_folder(self, folder: str) -> str:
        """The metadata blob of the session whose data folder is ``folder``."""
        tenant, session, _ = folder.split("/")
        return f"{self.prefix}/m/{tenant}/{session}"

    def tagged(self, tenant: str, tag: str | None = None, session_id: str | None = None) -> str:
        """The tag index of a tenant (every tag's), of one tag, or one session's entry in it."""
        name = f"{self.prefix}/t/{tenant_hash(tenant)}/"
        if tag is not None:
            name += hashed_key(tenant, tag, domain=b"tag\x00").hex() + "/"
            if session_id is not None:
                name += session_hash(tenant, session_id)
        return name

    def data_of_meta(self, meta_name: str) -> str:
        """The data folder of the session whose metadata blob is ``meta_name``."""
        tenant, session = meta_name[len(self.prefix) + 3 :].split("/")
        return f"{self.prefix}/d/{tenant}/{session}/"

    def segment(self, tenant: str, session_id: str, generation: str, number: int) -> str:
        return self.in_folder(self.folder(tenant, session_id, generation), number)


def parse_data_name(name: str) -> tuple[str, int, bool]:
    """``(folder path ending in /, number, is a reference)`` of a blob in a data folder (a segment or a reference)."""
    head, _, tail = name.rpartition("/")
    if head.endswith("/r"):
        return head[:-1], int(tail.split(".", 1)[0]), True
    return head + "/", int(tail), False


def digest(message_id: str) -> bytes:
    """The index window's fingerprint of a message id (80 bits: a false match is beyond any practical odds)."""
    return hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).digest()[:_DIGEST_BYTES]


def id_timestamp(message_id: str) -> int:
    """The millisecond timestamp of a UUIDv7 id; :data:`NOT_UUID7` for any other id."""
    try:
        value = uuid.UUID(message_id)
    except (ValueError, AttributeError):
        return NOT_UUID7
    if value.version != 7 or str(value) != message_id:
        return NOT_UUID7
    return value.int >> 80


def new_token() -> str:
    return uuid.uuid4().hex[:16]


def frame(token: str, records: list[bytes]) -> bytes:
    """One append's block: the header line with its token, then one record per line."""
    return b"".join([b"~", token.encode("ascii"), b"\n", *(r + b"\n" for r in records)])


def lines(data: bytes, start: int) -> Iterator[tuple[str | None, bytes, int]]:
    """Complete lines of segment bytes read from offset ``start``: ``(token, b"", end)`` for a block header,
    ``(None, record, end)`` for a record, where ``end`` is the offset just past the line; a partial last line
    is left out."""
    position = 0
    while True:
        newline = data.find(b"\n", position)
        if newline < 0:
            return
        line = data[position:newline]
        position = newline + 1
        if line.startswith(b"~"):
            yield line[1:].decode("ascii"), b"", start + position
        elif line:
            yield None, line, start + position


def headers_after(data: bytes, start: int, position: int) -> int:
    """How many block headers in ``data`` (segment bytes from ``start``) begin at ``position`` or later."""
    count, index = 0, max(position - start, 0)
    if index and data[index - 1 : index] != b"\n":
        index = data.find(b"\n", index) + 1 or len(data)
    while index < len(data):
        if data[index : index + 1] == b"~":
            count += 1
        newline = data.find(b"\n", index)
        if newline < 0:
            break
        index = newline + 1
    return count


def encode_id(session_id: str) -> str:
    """A session id as blob metadata can carry it (ASCII): base64url of its UTF-8."""
    return base64.urlsafe_b64encode(session_id.encode("utf-8", "surrogatepass")).decode("ascii").rstrip("=")


def decode_id(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8", "surrogatepass")
