"""``chatkeep sessions fork``, ``sessions tag`` and ``sessions list`` showing titles, tags, tokens and forks; ``copy``
keeping forks and info."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import Message, SessionKey, TextContent, Usage, UsageContent, open_store
from chatkeep.core.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def answer(text: str, tokens: int) -> Message:
    used = Usage(input_tokens=tokens, output_tokens=tokens, total_tokens=2 * tokens)
    return Message(role="assistant", contents=[TextContent(text=text), UsageContent(usage=used, model="m")])


async def seed(url: str) -> list[Message]:
    messages = [Message(role="user", text="hi"), answer("hello", 5), Message(role="user", text="more"), answer("ok", 7)]
    async with open_store(url) as store:
        await store.append(SessionKey("acme", "chat"), messages)
    return messages


def test_fork_tag_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"memory://cli-forks-{uuid.uuid4().hex}"
    messages = asyncio.run(seed(url))
    common = ("--store", url, "--tenant", "acme")
    through = messages[1].message_id
    code, out, _ = cli(capsys, "sessions", "fork", "chat", "--through", through, "--as", "retry", *common)
    assert code == 0
    assert out.strip() == (
        f"forked session chat through message {through} into retry (tenant acme, 2 messages); nothing was copied"
    )
    code, out, _ = cli(capsys, "sessions", "tag", "retry", "billing", "vip", "--title", "Second try", *common)
    assert (code, out.strip()) == (0, "session retry (tenant acme): tags billing, vip, title 'Second try'")

    code, out, _ = cli(capsys, "sessions", "list", *common)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split("  ")[0] == "SESSION"
    assert [h.strip() for h in header.split("  ") if h.strip()][-4:] == ["TITLE", "TAGS", "TOKENS", "FORKED FROM"]
    assert rows[0].split()[0] == "retry"
    assert rows[0].endswith(f"Second try  billing,vip      10  chat@{through}")
    assert rows[1].split()[0] == "chat"
    assert rows[1].rstrip().endswith("24")

    code, out, _ = cli(capsys, "sessions", "list", "--tag", "vip", "--json", *common)
    listed = json.loads(out)["sessions"]
    assert [s["session_id"] for s in listed] == ["retry"]
    assert listed[0]["forked_from"] == {"session_id": "chat", "through": through}
    assert listed[0]["usage"]["total_tokens"] == 10
    assert listed[0]["usage"]["models"] == {"m": [1, 5, 5, 10]}
    assert (listed[0]["title"], listed[0]["tags"]) == ("Second try", ["billing", "vip"])

    code, _, err = cli(capsys, "sessions", "fork", "chat", "--through", "nope", *common)
    assert code == 1
    assert "not in session 'chat'" in err
    code, _, err = cli(capsys, "sessions", "fork", "chat", "--as", "retry", *common)
    assert code == 1
    assert "already exists" in err
    code, _, err = cli(capsys, "sessions", "tag", "missing", "x", *common)
    assert code == 1
    assert "no session 'missing'" in err
    code, out, _ = cli(capsys, "sessions", "tag", "retry", "--clear", *common)
    assert (code, out.strip()) == (0, "session retry (tenant acme): tags none")


async def snapshot(url: str) -> dict[str, Any]:
    async with open_store(url) as store:
        page = await store.list_sessions("acme", limit=100)
        return {
            info.session_id: (
                [m.to_record() for m in await store.load(SessionKey("acme", info.session_id))],
                info.forked_from,
                info.title,
                info.tags,
                info.usage,
            )
            for info in page.items
        }


def test_copy_keeps_a_fork_a_fork_when_its_parent_is_copied(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source, target = f"memory://copy-src-{uuid.uuid4().hex}", f"memory://copy-dst-{uuid.uuid4().hex}"
    messages = asyncio.run(seed(source))

    async def shape() -> None:
        async with open_store(source) as store:
            chat = SessionKey("acme", "chat")
            await store.fork(chat, SessionKey("acme", "b1"), through=messages[1].message_id)
            await store.append(SessionKey("acme", "b1"), [answer("b1 own", 3)])
            await store.fork(SessionKey("acme", "b1"), SessionKey("acme", "b2"))
            await store.fork(chat, SessionKey("acme", "trimmed"))
            await store.trim(SessionKey("acme", "trimmed"), 2)  # no longer its parent's prefix: an equal copy
            await store.update_info(SessionKey("acme", "b2"), title="deep", tags={"x"}, metadata={"k": [1]})

    asyncio.run(shape())
    code, out, err = cli(capsys, "copy", "--from", source, "--to", target, "--tenant", "acme", "--json")
    assert code == 0, err
    assert json.loads(out)["ok"]
    copied, original = asyncio.run(snapshot(target)), asyncio.run(snapshot(source))
    assert {k: v[0] for k, v in copied.items()} == {k: v[0] for k, v in original.items()}
    assert {k: v[2:] for k, v in copied.items()} == {k: v[2:] for k, v in original.items()}
    assert copied["b1"][1] == original["b1"][1]
    assert copied["b2"][1] == original["b2"][1]
    assert copied["trimmed"][1] is None, "a fork trimmed into what it took was copied as a fork"
    # A rerun copies nothing again.
    code, out, _ = cli(capsys, "copy", "--from", source, "--to", target, "--tenant", "acme", "--json")
    assert (code, json.loads(out)["new_messages"]) == (0, 0)


def test_export_and_import_carry_title_tags_and_metadata(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source, target = f"memory://exp-src-{uuid.uuid4().hex}", f"memory://exp-dst-{uuid.uuid4().hex}"
    messages = asyncio.run(seed(source))

    async def shape() -> None:
        async with open_store(source) as store:
            await store.fork(SessionKey("acme", "chat"), SessionKey("acme", "b1"), through=messages[1].message_id)
            await store.update_info(SessionKey("acme", "b1"), title="branch", tags={"x", "y"}, metadata={"k": 1})

    asyncio.run(shape())
    exported = tmp_path / "acme.jsonl"
    assert cli(capsys, "export", "--store", source, "--tenant", "acme", "-o", str(exported))[0] == 0
    kinds = [json.loads(line)["type"] for line in exported.read_text(encoding="utf-8").splitlines()]
    assert kinds.count("info") == 1
    code, _, err = cli(capsys, "import", "--store", target, "-i", str(exported))
    assert code == 0, err
    copied, original = asyncio.run(snapshot(target)), asyncio.run(snapshot(source))
    assert {k: v[0] for k, v in copied.items()} == {k: v[0] for k, v in original.items()}
    assert {k: v[2:] for k, v in copied.items()} == {k: v[2:] for k, v in original.items()}
    assert copied["b1"][1] is None, "an imported fork is an equal copy (the file is read as a stream)"


def test_export_of_one_session_keeps_its_title_tags_and_fork_parent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source, target = f"memory://one-src-{uuid.uuid4().hex}", f"memory://one-dst-{uuid.uuid4().hex}"
    messages = asyncio.run(seed(source))

    async def shape() -> None:
        async with open_store(source) as store:
            await store.fork(SessionKey("acme", "chat"), SessionKey("acme", "b1"), through=messages[1].message_id)
            await store.append(SessionKey("acme", "b1"), [answer("b1 own", 3)])
            await store.update_info(SessionKey("acme", "b1"), title="branch", tags={"x", "y"}, metadata={"k": 1})

    asyncio.run(shape())
    exported = tmp_path / "b1.jsonl"
    code, _, err = cli(capsys, "export", "--store", source, "--tenant", "acme", "--session", "b1", "-o", str(exported))
    assert code == 0, err
    lines = [json.loads(line) for line in exported.read_text(encoding="utf-8").splitlines()]
    assert [line["type"] for line in lines] == ["info", "message", "message", "message", "end"]
    assert (lines[0]["title"], lines[0]["tags"], lines[0]["metadata"]) == ("branch", ["x", "y"], {"k": 1})
    assert lines[0]["forked_from"] == {"session_id": "chat", "through": messages[1].message_id}
    code, _, err = cli(capsys, "import", "--store", target, "-i", str(exported))
    assert code == 0, err
    copied, original = asyncio.run(snapshot(target)), asyncio.run(snapshot(source))
    assert list(copied) == ["b1"]
    assert copied["b1"][0] == original["b1"][0]
    assert copied["b1"][2:] == original["b1"][2:] == ("branch", frozenset({"x", "y"}), original["b1"][4])
    assert copied["b1"][1] is None, "an imported fork is an equal copy, as from a whole-tenant export"
