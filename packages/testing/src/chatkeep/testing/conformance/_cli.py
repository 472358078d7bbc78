"""The ``chatkeep`` command end to end on a backend: :class:`CLIConformance`.

Every operator command runs against the backend under test, bad input included: doctor, sessions
list/show/delete, export and import (a corrupt line, a record over the target's limit), copy to and from
SQLite and memory (of named tenants, and of every tenant), tenants list, erase, prune, migrate, an unreachable
server, and a copy killed with SIGKILL midway then rerun.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import AgentSession, FunctionCallContent, FunctionResultContent, Message, open_store
from chatkeep.core.backend import HistoryStore, SessionKey, SupportsMigrate, SupportsSchemaRevision
from chatkeep.core.cli import main
from chatkeep.core.plugins import default_registry
from chatkeep.testing.conformance._base import ConformanceBase, DocumentDamager, StoreFactory, StoreKit

__all__ = ["CLIConformance", "CLIResult"]

#: How long the killed-copy test waits for the child to make progress, and for a rerun to finish.
_PATIENCE = 180.0


@dataclass(frozen=True)
class CLIResult:
    """What one ``chatkeep`` run printed: its exit status, stdout and stderr."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """The ``--json`` document on stdout of a run that succeeded."""
        assert self.code == 0, f"chatkeep exited {self.code}: {self.err}"
        return json.loads(self.out)


class _Runner:
    """Runs ``chatkeep`` in this process, on a worker thread (the command runs its own event loop)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *args: str) -> CLIResult:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, list(args))
        out, err = self.capsys.readouterr()
        return CLIResult(code, out, err)


async def _start(*args: str) -> asyncio.subprocess.Process:
    """``python ARGS...`` as a child process, its output piped, with no stdin."""
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def with_option(url: str, name: str, value: object) -> str:
    """``url`` with one more query option."""
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


def _require_backend(url: str) -> None:
    try:
        default_registry().resolve(url)
    except Exception as exc:  # not installed (UnknownBackendError) or broken: this test cannot run here
        pytest.skip(f"this test copies through {url.split(':', 1)[0]}://, which is not usable here ({exc})")


def conversation(i: int) -> list[Message]:
    """Four messages: a multi-line unicode question, a tool call, its result, an answer."""
    return [
        Message(role="user", text=f"weather in Paris? #{i}\nthanks \u2603"),
        Message(
            role="assistant",
            contents=[FunctionCallContent(call_id=f"call-{i}", name="weather", arguments='{"city": "Paris"}')],
        ),
        Message(role="tool", contents=[FunctionResultContent(call_id=f"call-{i}", result={"celsius": 21})]),
        Message(role="assistant", text="It is 21 \u00b0C in Paris."),
    ]


async def seed(store: HistoryStore, tenant: str, sessions: int = 3) -> list[SessionKey]:
    """``sessions`` conversations ``chat-0``... in ``tenant``; ``chat-1`` also gets a session document."""
    keys = []
    for i in range(sessions):
        key = SessionKey(tenant, f"chat-{i}")
        if i == 1:
            document = AgentSession(session_id=key.session_id, tenant=tenant, state={"memo": {"likes": "pasta"}})
            await store.save_session(key, document, owner="bob")
        await store.append(key, conversation(i))
        keys.append(key)
    return keys


async def snapshot(store: HistoryStore, tenant: str) -> dict[str, Any]:
    """Everything a tenant holds: each session's records in order, and its document with its owner."""
    result: dict[str, Any] = {}
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=100, cursor=cursor)
        for info in page.items:
            key = SessionKey(tenant, info.session_id)
            stored = await store.load_session(key)
            records = [m.to_record() async for m in store.iter_messages(key)]
            result[info.session_id] = (records, None if stored is None else (stored.session.to_dict(), stored.owner))
        cursor = page.next_cursor
        if cursor is None:
            return result


async def session_ids(store: HistoryStore, tenant: str) -> list[str]:
    """Every session id of a tenant, as listed."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_sessions(tenant, limit=100, cursor=cursor)
        ids += [info.session_id for info in page.items]
        cursor = page.next_cursor
        if cursor is None:
            return ids


class CLIConformance(ConformanceBase):
    """The ``chatkeep`` command end to end on a backend: subclass it once per backend (or engine).

    The subclass provides:

    * the ``store_url`` fixture: a URL that ``chatkeep.core.open_store`` opens on the test's backing data
      (a key prefix, schema, container or folder of its own, as for the conformance kit). The tests work
      in tenants of their own there and delete them afterwards;
    * the ``unreachable_url`` fixture: a URL of this backend that reaches nothing, such as a free port of
      ``chatkeep.testing.faults.free_port`` where no server listens; ``None`` (the default) for a backend
      without a server, and the unreachable-server test skips, saying so;
    * ``multi_process``: true when a ``chatkeep`` child process reaches the data through ``store_url``
      (the killed-copy test runs only then).

    The stores the tests open themselves come from ``store_url`` through ``open_store``; override
    ``make_store`` for a backend that needs more. The rules of :class:`ConformanceBase` apply: a standard
    test may only be overridden as a strict ``xfail`` with a reason.
    """

    @pytest.fixture
    def make_store(self, store_url: str) -> StoreFactory:
        """Stores on ``store_url``, opened with ``chatkeep.core.open_store``."""

        def make(**options: Any) -> HistoryStore:
            return open_store(store_url, **options)

        return make

    @pytest.fixture
    def unreachable_url(self) -> str | None:
        """Override for a backend with a server: a URL of this backend where no server answers."""
        return None

    @pytest.fixture
    def cli(self, capsys: pytest.CaptureFixture[str]) -> _Runner:
        """Runs ``chatkeep ARGS...`` in this process: ``await cli("sessions", "list", ...)``."""
        return _Runner(capsys)

    async def test_doctor_checks_the_store_and_leaves_nothing_behind(
        self, cli: _Runner, store_url: str, store: HistoryStore
    ) -> None:
        report = (await cli("doctor", "--store", store_url, "--json")).json()
        assert report["ok"] is True, report
        names = [check["name"] for check in report["checks"]]
        if isinstance(store, SupportsSchemaRevision):
            assert names == ["connect", "schema", "write", "read back", "clean up", "sessions"]
            assert report["schema_revision"] == await store.schema_revision()
        else:
            assert names == ["connect", "write", "read back", "clean up", "sessions"]
            assert report["schema_revision"] is None
        assert all(check["ok"] for check in report["checks"])
        assert await store.count(SessionKey(report["probe_tenant"], "probe")) == 0
        text = await cli("doctor", "--store", store_url)
        assert text.code == 0, text.err
        assert text.out.splitlines()[-1] == "the store works"

    async def test_sessions_list_show_and_delete(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore
    ) -> None:
        tenant = kit.tenant("sessions")
        keys = await seed(store, tenant)
        common = ("--store", store_url, "--tenant", tenant)
        first = (await cli("sessions", "list", *common, "--limit", "2", "--json")).json()
        assert len(first["sessions"]) == 2
        assert {s["message_count"] for s in first["sessions"]} == {4}
        second = (await cli("sessions", "list", *common, "--cursor", first["next_cursor"], "--json")).json()
        listed = [s["session_id"] for s in first["sessions"] + second["sessions"]]
        assert sorted(listed) == ["chat-0", "chat-1", "chat-2"]
        assert second["next_cursor"] is None

        shown = (await cli("sessions", "show", "chat-1", *common, "--json")).json()
        expected = [m.to_record() async for m in store.iter_messages(keys[1])]
        assert [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in shown["messages"]] == expected
        text = await cli("sessions", "show", "chat-1", *common)
        assert text.code == 0, text.err
        lines = text.out.splitlines()
        assert lines[0] == f"session chat-1 (tenant {tenant}): 4 messages"
        assert lines[3].endswith('assistant: -> calls weather({"city": "Paris"}) [call-1]')

        deleted = (await cli("sessions", "delete", "chat-1", *common, "--yes", "--json")).json()
        assert deleted == {"tenant": tenant, "session_id": "chat-1", "deleted": True, "messages": 4}
        assert await store.count(keys[1]) == 0
        assert await store.load_session(keys[1]) is None
        again = await cli("sessions", "delete", "chat-1", *common, "--yes")
        assert again.code == 1
        assert "no session 'chat-1'" in again.err
        missing = await cli("sessions", "show", "nope", *common)
        assert missing.code == 1
        assert "Traceback" not in missing.out + missing.err

    async def test_export_then_import_into_another_tenant_is_exact_and_idempotent(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore, tmp_path: Path
    ) -> None:
        source, target = kit.tenant("export"), kit.tenant("import")
        await seed(store, source)
        exported = tmp_path / "export.jsonl"
        summary = (await cli("export", "--store", store_url, "--tenant", source, "-o", str(exported), "--json")).json()
        assert (summary["sessions"], summary["messages"], summary["session_documents"]) == (3, 12, 1)
        args = ("import", "--store", store_url, "--tenant", target, "-i", str(exported), "--json")
        counts = (await cli(*args)).json()
        written = ("sessions", "messages", "new_messages", "session_documents")
        assert [counts[name] for name in written] == [3, 12, 12, 1]
        assert (counts["complete"], counts["damaged_in_export"]) == (True, [])
        original, moved = await snapshot(store, source), await snapshot(store, target)
        assert {sid: records for sid, (records, _) in moved.items()} == {
            sid: records for sid, (records, _) in original.items()
        }
        document, owner = moved["chat-1"][1]
        assert (document["tenant"], document["state"], owner) == (target, {"memo": {"likes": "pasta"}}, "bob")
        assert (await cli(*args)).json()["new_messages"] == 0
        assert await snapshot(store, target) == moved

    async def test_a_damaged_session_is_named_and_skipped_only_when_told(
        self,
        cli: _Runner,
        store_url: str,
        kit: StoreKit,
        store: HistoryStore,
        tmp_path: Path,
        damage_session_document: DocumentDamager,
    ) -> None:
        tenant, moved = kit.tenant("damaged"), kit.tenant("moved")
        keys = await seed(store, tenant)
        await damage_session_document(store, keys[1])  # chat-1 has the document
        common = ("--store", store_url, "--tenant", tenant)

        listed = await cli("sessions", "list", *common)
        assert listed.code == 1, listed.err
        assert "chat-1" in listed.out, listed.out
        assert "DAMAGED" in listed.out, listed.out
        assert f"session 'chat-1' of tenant '{tenant}' is damaged" in listed.err, listed.err
        skipped = await cli("sessions", "list", *common, "--skip-damaged", "--json")
        assert skipped.code == 3, skipped.err
        assert sorted(s["session_id"] for s in json.loads(skipped.out)["sessions"]) == ["chat-0", "chat-2"]
        assert "skipped damaged session 'chat-1'" in skipped.err

        exported = tmp_path / "damaged.jsonl"
        stopped = await cli("export", *common, "-o", str(exported))
        assert stopped.code == 1
        assert f"export stopped at session 'chat-1' of tenant '{tenant}', which is damaged" in stopped.err
        assert "--skip-damaged" in stopped.err
        assert "Traceback" not in stopped.err
        assert not exported.exists()
        assert not tmp_path.joinpath("damaged.jsonl.partial").exists()
        done = await cli("export", *common, "-o", str(exported), "--skip-damaged", "--json")
        assert done.code == 3, done.err
        assert [s["session_id"] for s in json.loads(done.out)["skipped"]] == ["chat-1"]
        assert "skipped damaged session 'chat-1'" in done.err
        counts = (await cli("import", "--store", store_url, "--tenant", moved, "-i", str(exported), "--json")).json()
        assert (counts["sessions"], counts["messages"], counts["complete"]) == (2, 8, True)
        assert [d["session_id"] for d in counts["damaged_in_export"]] == ["chat-1"]
        assert sorted(await session_ids(store, moved)) == ["chat-0", "chat-2"]

        memory_url = f"memory://cli-kit-{uuid.uuid4().hex}"
        _require_backend(memory_url)
        copy = ("copy", "--from", store_url, "--to", memory_url, "--tenant", tenant)
        halted = await cli(*copy)
        assert halted.code == 1
        assert f"copy stopped at session 'chat-1' of tenant '{tenant}', which is damaged" in halted.err
        assert "a rerun resumes where it stopped" in halted.err
        report = await cli(*copy, "--skip-damaged", "--json")
        assert report.code == 3, report.err
        result = json.loads(report.out)
        assert (result["ok"], result["sessions"], [s["session_id"] for s in result["skipped"]]) == (
            False,
            2,
            ["chat-1"],
        )
        text = await cli(*copy, "--skip-damaged")
        assert "verified the sessions copied; skipped 1 damaged session" in text.out, text.out

    async def test_import_of_a_corrupt_line_names_it_and_writes_nothing(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore, tmp_path: Path
    ) -> None:
        source, target = kit.tenant("good"), kit.tenant("corrupt")
        await seed(store, source)
        exported = tmp_path / "corrupt.jsonl"
        await cli("export", "--store", store_url, "--tenant", source, "-o", str(exported))
        lines = exported.read_text(encoding="utf-8").splitlines()
        lines.insert(9, '{"type":"message","tenant":"x","session_id":"s","record":{"v":1,"role":"robot"}}')
        exported.write_text("\n".join(lines) + "\n", encoding="utf-8")
        result = await cli("import", "--store", store_url, "--tenant", target, "-i", str(exported))
        assert (result.code, result.out) == (1, "")
        assert f"line 10 of {exported}" in result.err
        assert "Nothing was imported" in result.err
        assert "Traceback" not in result.err
        assert await session_ids(store, target) == []

    async def test_import_refuses_a_record_over_the_targets_limit_before_writing_anything(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore, tmp_path: Path
    ) -> None:
        source, target = kit.tenant("big"), kit.tenant("small")
        keys = await seed(store, source, sessions=2)
        big = Message(role="tool", text="\u00e9" * 3000)  # two bytes each in UTF-8: the limit counts bytes
        await store.append(keys[1], [big])
        # chat-0, updated last, is exported first: an import that wrote as it read would store it.
        await store.append(keys[0], [Message(role="user", text="chat-0 again")])
        size = len(big.to_record().encode())
        exported = tmp_path / "big.jsonl"
        await cli("export", "--store", store_url, "--tenant", source, "-o", str(exported))
        number = next(
            n for n, line in enumerate(exported.read_text(encoding="utf-8").splitlines(), 1) if big.message_id in line
        )
        limited = with_option(store_url, "max_message_bytes", 4096)
        result = await cli("import", "--store", limited, "--tenant", target, "-i", str(exported))
        assert (result.code, result.out) == (1, "")
        assert f"line {number} of {exported}: the message record is {size:,} bytes" in result.err
        assert f"max_message_bytes of 4,096. Nothing was imported: add max_message_bytes={size}" in result.err
        assert await session_ids(store, target) == []
        raised = with_option(store_url, "max_message_bytes", size)
        counts = (await cli("import", "--store", raised, "--tenant", target, "-i", str(exported), "--json")).json()
        assert counts["new_messages"] == 10

    async def test_copy_to_sqlite_and_memory_and_back_is_verified(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore, tmp_path: Path
    ) -> None:
        sqlite_url, memory_url = f"sqlite:///{tmp_path / 'copy.db'}", f"memory://cli-kit-{uuid.uuid4().hex}"
        _require_backend(sqlite_url)
        _require_backend(memory_url)
        tenant = kit.tenant("copy")
        await seed(store, tenant)
        original = await snapshot(store, tenant)
        for source, target in ((store_url, memory_url), (memory_url, sqlite_url)):
            report = (await cli("copy", "--from", source, "--to", target, "--tenant", tenant, "--json")).json()
            assert (report["ok"], report["sessions"], report["new_messages"]) == (True, 3, 12), report
        await store.delete_tenant(tenant)
        back = (await cli("copy", "--from", sqlite_url, "--to", store_url, "--tenant", tenant, "--json")).json()
        assert (back["ok"], back["new_messages"], back["mismatches"]) == (True, 12, [])
        assert await snapshot(store, tenant) == original
        text = await cli("copy", "--from", sqlite_url, "--to", store_url, "--tenant", tenant)
        assert text.code == 0, text.err
        assert "copied 3 sessions (12 messages, 0 new)" in text.out
        assert "verified:" in text.out

    async def test_copy_of_every_tenant_into_the_store_resumes_and_is_verified(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore
    ) -> None:
        source_url = f"memory://cli-kit-{uuid.uuid4().hex}"
        _require_backend(source_url)
        tenants = sorted([kit.tenant("all-a"), kit.tenant("all-b \u00fc")])
        async with open_store(source_url) as source:
            for n, tenant in enumerate(tenants):
                await seed(source, tenant, sessions=n + 1)
            expected = {tenant: await snapshot(source, tenant) for tenant in tenants}
            # As if a copy died midway: two messages of one session reached the target.
            started = SessionKey(tenants[1], "chat-0")
            await store.append(started, (await source.load(started))[:2])
        argv = ("copy", "--from", source_url, "--to", store_url, "--all-tenants")
        report = (await cli(*argv, "--json")).json()
        assert (report["ok"], report["tenants"], report["mismatches"]) == (True, tenants, []), report
        assert (report["sessions"], report["messages"], report["new_messages"]) == (3, 12, 10)
        for tenant in tenants:
            assert await snapshot(store, tenant) == expected[tenant]
        again = await cli(*argv)
        assert again.code == 0, again.err
        assert "copied 3 sessions (12 messages, 0 new) of every tenant (2: " in again.out
        assert "verified:" in again.out

    async def test_tenants_list_and_erase_of_a_session_then_of_the_tenant(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore
    ) -> None:
        doomed, kept = kit.tenant("erase \u00fc"), kit.tenant("kept")
        keys = await seed(store, doomed)
        await seed(store, kept, sessions=1)
        listed = (await cli("tenants", "list", "--store", store_url, "--json")).json()["tenants"]
        assert listed == sorted(listed)
        assert {doomed, kept} <= set(listed)
        assert doomed in (await cli("tenants", "list", "--store", store_url)).out.splitlines()

        erase = ("erase", "--store", store_url, "--tenant", doomed)
        dry = (await cli(*erase, "--dry-run", "--json")).json()
        assert (dry["dry_run"], dry["sessions"], dry["messages"]) == (True, 3, 12)
        assert sorted(s["session_id"] for s in dry["would_erase"]) == ["chat-0", "chat-1", "chat-2"]
        assert await store.count(keys[1]) == 4
        one = (await cli(*erase, "--session", "chat-1", "--yes", "--json")).json()
        assert (one["sessions"], one["messages"], one["remaining_sessions"]) == (1, 4, 0)
        assert (await store.count(keys[1]), await store.load_session(keys[1])) == (0, None)
        assert await store.count(keys[0]) == 4
        erased = await cli(*erase, "--yes")
        assert erased.code == 0, erased.err
        assert f"erased tenant '{doomed}' from " in erased.out
        assert erased.out.endswith(": 2 sessions with 8 messages (and their session documents)\n")

        fresh = await kit.open()
        assert await session_ids(fresh, doomed) == []
        tenants = await fresh.list_tenants()
        assert doomed not in tenants
        assert kept in tenants
        assert await fresh.count(SessionKey(kept, "chat-0")) == 4
        again = await cli(*erase, "--yes")
        assert again.code == 0, again.err
        assert again.out.startswith(f"nothing to erase: no tenant '{doomed}' in ")

    async def test_prune_deletes_only_the_tenants_idle_sessions(
        self, cli: _Runner, store_url: str, kit: StoreKit, store: HistoryStore
    ) -> None:
        tenant, other = kit.tenant("prune"), kit.tenant("kept")
        keys = await seed(store, tenant, sessions=2)
        await seed(store, other, sessions=1)
        common = ("prune", "--store", store_url, "--tenant", tenant, "--yes")
        assert (await cli(*common, "--older-than", "1d", "--json")).json()["deleted"] == 0
        await asyncio.sleep(3)  # ages, not timings: the sessions must be older than the 2s given below
        await store.append(keys[0], [Message(role="user", text="chat-0 is active again")])
        report = (await cli(*common, "--older-than", "2s", "--json")).json()
        assert (report["deleted"], report["tenant"]) == (1, tenant)
        assert await store.count(keys[0]) == 5
        assert await store.count(keys[1]) == 0
        assert await store.count(SessionKey(other, "chat-0")) == 4

    async def test_migrate_reports_the_schema_revision_or_that_there_is_none(
        self, cli: _Runner, store_url: str, store: HistoryStore
    ) -> None:
        report = (await cli("migrate", "--store", store_url, "--json")).json()
        assert report["has_schema"] is isinstance(store, SupportsMigrate)
        if isinstance(store, SupportsSchemaRevision):
            assert report["revision"] == await store.schema_revision()
        if not report["has_schema"]:
            assert report["revision"] is None
        again = await cli("migrate", "--store", store_url)
        assert again.code == 0, again.err

    async def test_an_unreachable_server_is_an_error_that_says_what_to_fix(
        self, cli: _Runner, store_url: str, unreachable_url: str | None, kit: StoreKit, store: HistoryStore
    ) -> None:
        if unreachable_url is None:
            pytest.skip(f"{type(self).__name__} declares no unreachable_url: the backend has no server")
        doctor = await cli("doctor", "--store", unreachable_url, "--json")
        assert doctor.code == 1
        report = json.loads(doctor.out)
        assert (report["ok"], report["error"]["type"]) == (False, "StoreUnavailableError"), report
        assert report["fix"].startswith("start the server")
        assert "SQL databases" not in report["fix"], "the hint named another backend's option"
        listing = await cli("sessions", "list", "--store", unreachable_url, "--tenant", "t")
        tenant = kit.tenant("unreachable")
        await seed(store, tenant, sessions=1)
        copy = await cli("copy", "--from", store_url, "--to", unreachable_url, "--tenant", tenant)
        for result in listing, copy:
            assert (result.code, result.out) == (1, "")
            assert result.err.startswith("chatkeep: ")
            assert "running and reachable" in result.err  # what to check
            assert "Traceback" not in result.err

    async def test_a_copy_killed_midway_resumes_with_every_session_once(
        self, store_url: str, kit: StoreKit, store: HistoryStore, tmp_path: Path
    ) -> None:
        if not self.multi_process:
            pytest.skip(f"{type(self).__name__} sets multi_process = False: a child process cannot reach the data")
        source_url = f"sqlite:///{tmp_path / 'source.db'}"
        _require_backend(source_url)
        tenant = kit.tenant("killed")
        sessions, per_session = 100, 10
        async with open_store(source_url) as source:
            for i in range(sessions):
                texts = [f"session {i} message {n} \u2603" for n in range(per_session)]
                await source.append(SessionKey(tenant, f"s-{i:03d}"), [Message(role="user", text=t) for t in texts])
            expected = await snapshot(source, tenant)
        argv = ["-m", "chatkeep.core.cli", "copy", "--from", source_url, "--to", store_url, "--tenant", tenant]
        child = await _start(*argv)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _PATIENCE
            while len(await session_ids(store, tenant)) < 3:  # progress is what the target holds, not elapsed time
                assert child.returncode is None, f"the copy ended before the kill: {await child.communicate()}"
                assert loop.time() < deadline, "the copy made no progress"
                await asyncio.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            await child.communicate()
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        assert child.returncode == -signal.SIGKILL, "the copy finished before the kill: give it more to copy"
        # A server may still commit a statement the killed process had sent: read the target until it holds still.
        held: tuple[list[str], int] | None = None
        while True:
            copied = await session_ids(store, tenant)
            now = (copied, sum([await store.count(SessionKey(tenant, sid)) for sid in copied]))
            if now == held:
                break
            held = now
            await asyncio.sleep(0.2)
        before = now[1]
        assert 3 <= len(copied) < sessions, f"killed midway, yet the target holds {len(copied)} sessions"

        rerun = await _start(*argv, "--json")
        out, err = await asyncio.wait_for(rerun.communicate(), _PATIENCE)
        assert rerun.returncode == 0, err.decode()
        report = json.loads(out)
        assert (report["ok"], report["sessions"], report["mismatches"]) == (True, sessions, [])
        assert report["new_messages"] == sessions * per_session - before
        assert await snapshot(store, tenant) == expected  # every session, every message once, in order
