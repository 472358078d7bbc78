"""``chatkeep search`` (the best matches of some words in a tenant or a session) and ``chatkeep reindex``.

Both need a store with the search capability and an embedder: the offline default, or with ``--openai-model``
and ``--dimensions`` an :class:`~chatkeep.core.openai.OpenAIEmbedder` (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import argparse

from chatkeep.core._default_embedder import default_embedder
from chatkeep.core._embedding import Embedder
from chatkeep.core._errors import redact_url
from chatkeep.core._session import DEFAULT_TENANT
from chatkeep.core.backend import SessionKey, TenantScope, searchable
from chatkeep.core.cli._app import store_url
from chatkeep.core.cli._inspect import open_existing_store
from chatkeep.core.cli._output import UsageError, emit_json, iso, say, table, when

__all__ = ["reindex", "search"]


def _embedder(args: argparse.Namespace) -> Embedder:
    if args.openai_model is None:
        offline = default_embedder()  # its model loads on first use, not here
        if args.dimensions is not None:
            raise UsageError(
                f"--dimensions goes with --openai-model; the offline embedder ({offline.name}) makes vectors of "
                f"{offline.dimensions} dimensions"
            )
        return offline
    if args.dimensions is None:
        raise UsageError("--openai-model needs --dimensions, the width of the model's vectors")
    from chatkeep.core.openai import OpenAIEmbedder

    return OpenAIEmbedder(args.openai_model, dimensions=args.dimensions)


async def search(args: argparse.Namespace) -> int:
    """Print the best matches of ``args.words``: session, time, role, score and text, best first."""
    url, tenant = store_url(args), args.tenant or DEFAULT_TENANT
    scope = TenantScope(tenant) if args.session is None else SessionKey(tenant, args.session)
    embedder = _embedder(args)
    async with open_existing_store(url) as opened:
        store = searchable(opened)
        [vector] = await embedder.embed([args.words])
        hits = await store.search(scope, vector, args.words, args.limit, embedder=embedder.name)
    if args.json:
        emit_json(
            {
                "store": redact_url(url),
                "tenant": tenant,
                "session_id": args.session,
                "results": [
                    {
                        "session_id": hit.session_id,
                        "message_id": hit.message.message_id,
                        "role": hit.message.role,
                        "created_at": iso(hit.message.created_at),
                        "score": hit.score,
                        "text": hit.message.text,
                    }
                    for hit in hits
                ],
            }
        )
    elif not hits:
        say(f"no matches in {redact_url(url)}")
    else:
        rows = [
            (
                hit.session_id,
                when(hit.message.created_at),
                hit.message.role,
                f"{hit.score:.4f}",
                _short(hit.message.text),
            )
            for hit in hits
        ]
        table(("SESSION", "TIME (UTC)", "ROLE", "SCORE", "TEXT"), rows, right=(3,))
    return 0


def _short(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def reindex(args: argparse.Namespace) -> int:
    """Index every message not yet indexed with the embedder (of ``--tenant``, or of every tenant); resumable."""
    url = store_url(args)
    embedder = _embedder(args)
    async with open_existing_store(url) as opened:
        store = searchable(opened)

        def progress(done: int) -> None:
            if not args.json:
                say(f"indexed {done} messages", err=True)

        indexed = await store.reindex(embedder, args.tenant, progress=progress)
    if args.json:
        emit_json({"store": redact_url(url), "tenant": args.tenant, "embedder": embedder.name, "indexed": indexed})
    else:
        where = "every tenant" if args.tenant is None else f"tenant {args.tenant!r}"
        say(f"indexed {indexed} messages of {where} in {redact_url(url)} with {embedder.name}")
    return 0
