"""Talking to a model with the history in a store: ``chatkeep chat``, and ``chatkeep demo`` across two processes."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from chatkeep.core._agent import Agent
from chatkeep.core._chat import ChatClient
from chatkeep.core._errors import ChatkeepError, redact_url
from chatkeep.core._providers import InMemoryHistoryProvider
from chatkeep.core._session import AgentSession
from chatkeep.core.backend import SessionKey
from chatkeep.core.cli._app import DEFAULT_STORE, store_url
from chatkeep.core.cli._inspect import tenant_of
from chatkeep.core.cli._output import emit_json, printable, printable_lines, say
from chatkeep.core.plugins import default_registry, open_store

__all__ = ["chat", "demo", "demo_process"]

DEMO_TURNS = ("Remember that I like Italian food.", "What kind of food do I like?")
DEMO_INSTRUCTIONS = "You are a helpful assistant. Answer in one or two sentences."
CHAT_INSTRUCTIONS = "You are a helpful assistant."
QUIT = {"/quit", "/exit"}


def _client() -> tuple[ChatClient, str]:
    """The OpenAI-compatible model the environment configures, else the offline model."""
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        from chatkeep.core.openai import OpenAIChatClient

        client = OpenAIChatClient()
        return client, f"OpenAI-compatible model {getattr(client, 'model', '?')!r}"
    from chatkeep.core.offline import OfflineChatClient

    return OfflineChatClient(), "the built-in offline demo model (set OPENAI_API_KEY and OPENAI_MODEL for a real one)"


def _print(text: str = "") -> None:
    say(text)


# -- demo ----------------------------------------------------------------------------------------


async def _demo_turn(step: int, saved: dict[str, Any] | None, url: str | None) -> dict[str, Any] | None:
    """One process of the demo: returns the session to save, or ``None`` when the check failed."""
    client, _ = _client()
    history = url if url else InMemoryHistoryProvider()
    async with Agent(client, name="DemoAgent", instructions=DEMO_INSTRUCTIONS, history=history) as agent:
        if step == 1:
            session = agent.create_session()
        else:
            session = AgentSession.from_dict(saved or {})
            provider = agent.history_provider
            stored = (
                await provider.get_messages(
                    session.session_id, state=session.state.get(provider.source_id), session=session
                )
                if provider
                else []
            )
            _print(f"loaded session {session.session_id} with {len(stored)} stored messages")
            if not any(m.text == DEMO_TURNS[0] for m in stored):
                _print("error: the first process's message is not in the stored history")
                return None
        prompt = DEMO_TURNS[step - 1]
        _print(f"you:   {prompt}")
        print("agent: ", end="", flush=True)
        async for update in agent.run_stream(prompt, session=session):
            print(update.text, end="", flush=True)
        _print()
        return session.to_dict()


def demo_process(args: argparse.Namespace) -> int:
    """One process of the demo (the hidden ``_demo-turn`` command)."""
    session_file: Path = args.session_file
    saved = json.loads(session_file.read_text(encoding="utf-8")) if args.step == 2 else None
    session = asyncio.run(_demo_turn(args.step, saved, args.store))
    if session is None:
        return 1
    session_file.write_text(json.dumps(session, ensure_ascii=False, indent=2), encoding="utf-8")
    if args.step == 1:
        _print(f"saved session {session['session_id']} to {session_file}")
    return 0


def demo(args: argparse.Namespace) -> int:
    """Run the demo: one conversation in two processes, the second resuming from what the first stored."""
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    session_file = state_dir / "session.json"
    where = f"the session itself, saved as JSON to {session_file}"
    if args.store is None and not args.in_session and _sqlite_installed():
        # The embedded default: a SQLite file beside the demo's session, so the demo leaves nothing elsewhere.
        database = (state_dir / "history.db").resolve()
        args.store = f"sqlite:///{database}"
        where = f"a SQLite file, {database} (the embedded default store)"
    elif args.store:
        where = f"the {redact_url(args.store)} store"
    _, model = _client()
    _print("chatkeep demo: one conversation, kept across two separate processes")
    _print(f"  model:   {model}")
    _print(f"  history: {where}")
    for step, title in ((1, "talks and stores"), (2, "resumes from what was stored")):
        _print()
        _print(f"-- process {step}: {title} --")
        command = [sys.executable, "-m", "chatkeep.core.cli", "_demo-turn", str(step), str(session_file)]
        if args.store:
            command += ["--store", args.store]
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            _print(f"\nthe demo failed in process {step} (exit code {result.returncode})")
            return result.returncode
    _print()
    _print("done: the second process answered with the history the first one stored.")
    return 0


def _sqlite_installed() -> bool:
    try:
        default_registry().resolve(DEFAULT_STORE)
    except ChatkeepError:
        return False
    return True


# -- chat ----------------------------------------------------------------------------------------


async def chat(args: argparse.Namespace) -> int:
    """An interactive conversation: each line read is a turn, the history is loaded from and stored in the store.

    Quitting (``/quit``, or the end of input) and starting again with the same ``--session`` resumes it.
    """
    url, tenant = store_url(args), tenant_of(args)
    client, model = _client()
    interactive = sys.stdin.isatty()
    async with open_store(url) as store:
        key = SessionKey(tenant, args.session)
        earlier = await store.count(key)
        async with Agent(client, name="chatkeep", instructions=CHAT_INSTRUCTIONS, history=store) as agent:
            session = agent.create_session(session_id=key.session_id, tenant=key.tenant)
            if not args.json:
                state = f"resuming, {earlier} stored messages" if earlier else "a new conversation"
                shown = f"session {printable(key.session_id)} (tenant {printable(key.tenant)})"
                say(f"chatkeep chat: {shown} in {redact_url(url)}, {state}")
                say(f"  model: {model}")
                say("  type /quit or end the input (Ctrl-D) to leave; starting again with this --session resumes")
            while True:
                if interactive:
                    print("you> ", end="", flush=True)
                line = await asyncio.to_thread(sys.stdin.readline)
                if not line:
                    break
                prompt = line.strip()
                if prompt in QUIT:
                    break
                if not prompt:
                    continue
                if args.json:
                    response = await agent.run(prompt, session=session)
                    emit_json({"session_id": key.session_id, "user": prompt, "assistant": response.text})
                    continue
                print("assistant> ", end="", flush=True)
                async for update in agent.run_stream(prompt, session=session):
                    print(printable_lines(update.text), end="", flush=True)
                print(flush=True)
        stored = await store.count(key)
    if not args.json:
        say(f"{stored} messages stored in session {printable(key.session_id)}")
    return 0
