"""``chatkeep ui`` without a browser: every route read-only, the headers, the token, tenants, escaping, pages, export.

Starlette's test client runs the application in this process, the store opened by its lifespan as the server does.
"""

from __future__ import annotations

import html
import json
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from chatkeep.core import ChatkeepError, SessionKey, open_store
from chatkeep.core.cli import main
from chatkeep.core.cli._app import _parser
from chatkeep.core.ui import UIConfig, UnsafeBindError, create_app
from chatkeep.core.ui._command import ui_token, ui_url
from chatkeep.core.ui._guard import COOKIE, check_bind
from chatkeep.testing.services import missing_service

TENANT, OTHER_TENANT, LONG = "acme", "globex", 1000  # as conftest seeds them
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
TOKEN = "s3cret-token-for-the-tests-0123456789"


@pytest.fixture
def client(seeded: Any) -> Iterator[TestClient]:
    with TestClient(create_app(UIConfig(seeded.url, tenant=TENANT)), base_url="http://127.0.0.1:8765") as running:
        yield running


def _routes(app: Any) -> list[str]:
    return [route.path for route in app.app.routes if isinstance(route, Route)]


# A request for each route that reaches its page (not an error about a missing parameter).
EXAMPLES = {
    "/": "/?tag=travel&q=weather",
    "/session": "/session?id=tool-chat",
    "/session/export": "/session/export?id=tool-chat",
    "/store": "/store",
    "/tenants": "/tenants",
    "/static/{name}": "/static/ui.js",
}


def test_every_route_with_every_method_writes_nothing_and_only_reads(
    seeded: Any, client: TestClient, snapshot: Any
) -> None:
    before = snapshot(seeded.url)
    paths = _routes(client.app)
    assert sorted(paths) == sorted(EXAMPLES), "a new route needs its example here, so that the walk covers it"
    for path in [*EXAMPLES.values(), "/session?id=tool-chat&message=nope", "/no-such-page"]:
        for method in METHODS:
            response = client.request(method, path, follow_redirects=False)
            if method in ("GET", "HEAD"):
                assert response.status_code in (200, 302, 404), (method, path, response.text)
            else:
                assert response.status_code == 405, (method, path)
                assert response.headers["allow"] == "GET, HEAD"
    assert snapshot(seeded.url) == before


def test_a_websocket_is_refused(client: TestClient) -> None:
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/"):
        pass
    assert closed.value.code == 1008


def test_every_response_carries_the_security_headers(client: TestClient) -> None:
    for path, status in (("/", 200), ("/static/ui.css", 200), ("/session?id=nope", 404), ("/nope", 404)):
        response = client.get(path)
        assert response.status_code == status, path
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-frame-options"] == "DENY"
    assert client.post("/").headers["x-frame-options"] == "DENY"


def test_pages_hold_no_inline_script(client: TestClient) -> None:
    for path in ("/", "/session?id=tool-chat", "/store"):
        page = client.get(path).text
        assert page.count("<script") == 1
        assert '<script src="/static/ui.js" defer></script>' in page
        assert " onclick=" not in page
        assert " style=" not in page


def test_stored_text_is_escaped(seeded: Any, client: TestClient) -> None:
    page = client.get("/session", params={"id": "hostile<script>"}).text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert "&lt;b&gt;mallory&lt;/b&gt;" in page
    assert "window.__pwned = 1</script>" not in page
    assert "<img src=x" not in page
    listing = client.get("/").text
    assert "&lt;i&gt;title&lt;/i&gt;" in listing
    assert "<i>title</i>" not in listing
    assert seeded.hostile not in listing


def test_the_sessions_list_shows_title_tags_counts_tokens_and_the_fork_parent(client: TestClient) -> None:
    page = client.get("/").text
    for text in ("Planning a trip to Lisbon", "Weather tools", "long-chat", "tool-chat-fork", "1,000", ">575<"):
        assert text in page, text
    assert 'href="/?tenant=acme&amp;tag=tools"' in page
    assert "globex" not in page
    assert "secret" not in page
    tagged = client.get("/", params={"tag": "tools"}).text
    assert "Weather tools" in tagged
    assert "Planning a trip to Lisbon" not in tagged
    assert "long-chat" not in tagged


def _read(url: str, read: Any) -> Any:
    """What ``read(store)`` returns, on the store at ``url`` opened for it."""
    import asyncio

    async def run() -> Any:
        async with open_store(url) as store:
            return await read(store)

    return asyncio.run(run())


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def test_the_sessions_list_is_newest_first_with_created_and_updated_times(seeded: Any, client: TestClient) -> None:
    page = client.get("/").text
    assert "<th>Created (UTC)</th><th>Updated (UTC)</th>" in page
    rows = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0].split("<tr>")[1:]
    links = [re.search(r'class="session-link" href="[^"]*?id=([^"]+)"', row) for row in rows]
    ids = [unquote(html.unescape(link[1])) for link in links if link is not None]
    # conftest seeds these sessions in the reverse order: the newest comes first
    assert ids == ["hostile<script>", "tool-chat-fork", "long-chat", "tool-chat", "trip-lisbon"]
    listing = _read(seeded.url, lambda store: store.list_sessions(TENANT))
    infos = {info.session_id: info for info in listing.items}
    for session_id, row in zip(ids, rows, strict=True):
        info = infos[session_id]
        times = re.findall(r"<td><time>([^<]+)</time></td>", row)
        assert times == [_utc(info.created_at), _utc(info.updated_at)], session_id


def test_each_message_shows_its_time_and_a_class_of_its_role(seeded: Any, client: TestClient) -> None:
    page = client.get("/session", params={"id": "tool-chat"}).text
    messages = _read(seeded.url, lambda store: store.load(SessionKey(TENANT, "tool-chat")))
    articles = page.split('<article class="msg ')[1:]
    assert len(articles) == len(messages)
    for message, article in zip(messages, articles, strict=True):
        assert article.startswith(f'role-{message.role}" id="m-{message.message_id}"')
        moment = message.created_at.astimezone(timezone.utc)
        assert f'<time datetime="{moment.isoformat()}">{_utc(moment)}</time>' in article
    roles = ("system", "user", "assistant", "tool")
    assert {message.role for message in messages} == set(roles)
    css = client.get("/static/ui.css").text
    rules = [re.search(rf"\.role-{role} \{{([^}}]+)\}}", css) for role in roles]
    looks = {rule[1].strip() for rule in rules if rule is not None}
    assert len(looks) == len(roles), "each role needs a rule of its own, and no two alike"


def test_the_port_defaults_to_8765_on_loopback() -> None:
    args = _parser().parse_args(["ui", "--store", "sqlite:///chat.db"])  # parsed only: nothing is served
    assert (args.host, args.port) == ("127.0.0.1", 8765)


def test_the_sessions_list_is_paged_like_list_sessions(client: TestClient) -> None:
    first = client.get("/", params={"limit": 2}).text
    assert first.count('class="session-link"') == 2
    assert "Older sessions" in first
    cursor = first.split("cursor=", 1)[1].split('"', 1)[0]
    second = client.get(f"/?tenant={TENANT}&limit=2&cursor={cursor}").text
    assert second.count('class="session-link"') == 2
    assert "« Newest" in second
    assert client.get("/", params={"limit": 0}).status_code == 400
    assert client.get("/", params={"cursor": "not-a-cursor"}).status_code == 400


def test_another_tenant_is_not_shown_without_all_tenants(seeded: Any, client: TestClient) -> None:
    assert client.get("/", params={"tenant": OTHER_TENANT}).status_code == 404
    assert client.get("/session", params={"tenant": OTHER_TENANT, "id": "secret"}).status_code == 404
    assert client.get("/session/export", params={"tenant": OTHER_TENANT, "id": "secret"}).status_code == 404
    assert client.get("/session", params={"id": "secret"}).status_code == 404  # not in acme
    assert "globex" not in client.get("/tenants").text
    assert "<th>Tenants</th>" not in client.get("/store").text  # not even how many others there are
    every_tenant = create_app(UIConfig(seeded.url, tenant=TENANT, all_tenants=True))
    with TestClient(every_tenant, base_url="http://127.0.0.1") as every:
        assert "globex only" in every.get("/session", params={"tenant": OTHER_TENANT, "id": "secret"}).text
        assert "globex" in every.get("/tenants").text
        assert "<tr><th>Tenants</th><td>2</td></tr>" in every.get("/store").text


def test_a_transcript_pairs_each_tool_call_with_its_result(client: TestClient) -> None:
    page = client.get("/session", params={"id": "tool-chat"}).text
    call = page.split('id="call-call-forecast"', 1)[1].split("</article>", 1)[0]
    assert "get_forecast" in call
    assert "&#34;Lisbon&#34;" in call
    assert "← result" in call
    assert '"sky"' not in call
    assert "&#34;sky&#34;: &#34;sunny&#34;" in call  # pretty JSON, indented
    assert '<details class="long">' in call  # the long forecast starts collapsed
    time_call = page.split('id="call-call-time"', 1)[1].split('id="m-', 1)[0]
    assert "<details" not in time_call
    assert "14:05" in time_call
    assert page.count("shown with its call") == 2
    assert "120 in · 30 out · gpt-test" in page
    assert "575 (520 in, 55 out, 2 model calls)" in page


def test_a_long_session_opens_on_its_newest_page_and_pages_back(seeded: Any, client: TestClient) -> None:
    newest = client.get("/session", params={"id": "long-chat"}).text
    assert "messages 901–1,000 of 1,000" in newest
    assert f'id="m-{seeded.long_ids[-1]}"' in newest
    assert f'id="m-{seeded.long_ids[899]}"' not in newest
    older = client.get("/session", params={"id": "long-chat", "before": 900}).text
    assert "messages 801–900 of 1,000" in older
    assert "message 800" in older
    assert "message 900" not in older
    oldest = client.get("/session", params={"id": "long-chat", "before": 100}).text
    assert "messages 1–100 of 1,000" in oldest
    assert ">message 0<" in oldest
    assert "Older ›" not in oldest
    assert client.get("/session", params={"id": "long-chat", "before": "x"}).status_code == 400


def test_a_message_link_lands_on_its_page_and_anchor(seeded: Any, client: TestClient) -> None:
    target = seeded.long_ids[5]
    response = client.get("/session", params={"id": "long-chat", "message": target}, follow_redirects=False)
    assert response.status_code == 302
    assert response.headers["location"] == f"/session?tenant={TENANT}&id=long-chat&before=100#m-{target}"
    assert f'id="m-{target}"' in client.get(response.headers["location"]).text
    missing = client.get("/session", params={"id": "long-chat", "message": "nope"}, follow_redirects=False)
    assert missing.status_code == 404


def test_a_fork_links_to_where_it_left_its_parent(seeded: Any, client: TestClient) -> None:
    page = client.get("/session", params={"id": "tool-chat-fork"}).text
    assert 'id="fork-point"' in page
    parent = f"/session?tenant={TENANT}&amp;id=tool-chat&amp;message={seeded.through}"
    assert f'href="{parent}"' in page
    # The fork point comes right after the message it took last.
    assert page.index(f'id="m-{seeded.through}"') < page.index('id="fork-point"') < page.index("what about Porto")


def test_search_links_each_match_to_its_message(client: TestClient) -> None:
    page = client.get("/", params={"q": "what is the weather in Lisbon"}).text
    assert "Matches for" in page
    assert "sunny and 24 degrees" in page
    assert "/session?tenant=acme&amp;id=trip-lisbon&amp;message=" in page or "id=tool-chat&amp;message=" in page


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_search_finds_a_message_by_meaning_with_no_word_in_common(client: TestClient) -> None:
    # conftest embeds with the offline MiniLM model (default_embedder), as the page searches: a paraphrase matches.
    fact = "In Lisbon it is sunny and 24 degrees all week, so pack light clothes."  # as conftest seeds it
    question = "Should I bring a coat, or expect warm temperatures?"
    assert not _words(question) & _words("Day one: Alfama and the castle. " + fact)  # no match by words
    page = client.get("/", params={"q": question}).text
    snippets = re.findall(r'<div class="snippet">([^<]*)</div>', page)
    assert snippets, page
    assert "sunny and 24 degrees" in snippets[0]  # the best match, ahead of the messages that merely name Lisbon


def test_no_search_box_on_a_store_that_cannot_search(tmp_path: Path) -> None:
    import asyncio

    from chatkeep.core import Message, SupportsSearch

    url = f"sqlite:///{tmp_path / 'plain.db'}"  # the default SQLite transport keeps no search index

    async def seed() -> bool:
        async with open_store(url) as store:
            await store.append(SessionKey(TENANT, "chat"), [Message(role="user", text="hello")])
            return isinstance(store, SupportsSearch)

    assert not asyncio.run(seed())
    with TestClient(create_app(UIConfig(url, tenant=TENANT)), base_url="http://127.0.0.1") as client:
        listing = client.get("/").text
        assert "chat" in listing
        assert 'class="search"' not in listing
        assert 'name="q"' not in listing
        assert "no (this store lacks the search capability)" in client.get("/store").text


def test_export_is_the_export_format_and_imports_back(seeded: Any, client: TestClient, tmp_path: Path) -> None:
    response = client.get("/session/export", params={"id": "tool-chat-fork"})
    assert response.status_code == 200
    assert response.headers["content-disposition"] == 'attachment; filename="tool-chat-fork.jsonl"'
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["type"] for line in lines] == ["info", *["message"] * 5, "end"]
    assert lines[0]["forked_from"]["session_id"] == "tool-chat"
    assert lines[0]["tags"] == ["tools", "travel"]
    assert lines[-1] == {
        "type": "end",
        "format": "chatkeep-export",
        "version": 1,
        "sessions": 1,
        "messages": 5,
        "damaged": 0,
    }
    exported = tmp_path / "fork.jsonl"
    exported.write_text(response.text, encoding="utf-8")
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    assert main(["import", "--store", target, "--input", str(exported)]) == 0
    assert _records(target, "tool-chat-fork") == _records(seeded.url, "tool-chat-fork")


def _records(url: str, session_id: str) -> list[str]:
    return [m.to_record() for m in _read(url, lambda store: store.load(SessionKey(TENANT, session_id)))]


def test_the_store_page_reports_backend_schema_counts_and_latency(seeded: Any, client: TestClient) -> None:
    page = client.get("/store").text
    revision = _read(seeded.url, lambda store: store.schema_revision())
    assert re.fullmatch(r"\d{4}", revision)
    assert f"<tr><th>Schema revision</th><td>{revision}</td></tr>" in page
    for text in ("sql, chatkeep-sql", "Schema revision", " ms", "Sessions of tenant acme", ">5<", "by meaning"):
        assert text in page, text
    assert "writes no probe" in page


def test_a_secret_in_the_store_url_is_never_on_a_page_nor_in_an_error(seeded: Any) -> None:
    url = seeded.url + "&key=hunter2-secret"  # an option the store refuses, naming the URL
    with pytest.raises(ChatkeepError) as refused, TestClient(create_app(UIConfig(url, tenant=TENANT))):
        pass
    assert "hunter2" not in str(refused.value)
    assert "key=***" in str(refused.value)


def test_a_password_in_the_store_url_is_never_on_a_page_nor_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        missing_service(f"PostgreSQL is not reachable on 127.0.0.1:5432 ({exc})")
    schema = f"ck_ui_{uuid.uuid4().hex[:10]}"
    # Trust authentication: the server takes any password, so the URL can carry one that must never show.
    url = f"postgresql+asyncpg://postgres:hunter2@127.0.0.1:5432/test?schema={schema}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            assert main(["migrate", "--store", url]) == 0
            with TestClient(create_app(UIConfig(url, tenant=TENANT)), base_url="http://127.0.0.1") as client:
                for path in ("/", "/store", "/session?id=nope", "/tenants"):
                    page = client.get(path).text
                    assert "hunter2" not in page, path
                    assert "postgres:***@127.0.0.1" in page, path
            served: list[Any] = []
            monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets: served.append(server.config))
            port = _free_port()
            assert main(["ui", "--store", url, "--tenant", TENANT, "--port", str(port)]) == 0
            [config] = served
            assert (config.access_log, config.server_header, config.ws) == (False, False, "none")
            printed = capsys.readouterr()
            assert "hunter2" not in printed.out + printed.err
            assert "serving postgresql+asyncpg://postgres:***@127.0.0.1:5432/test" in printed.out
            assert f"open http://127.0.0.1:{port}/" in printed.out
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_a_token_is_required_on_every_request_and_compared(seeded: Any) -> None:
    app = create_app(UIConfig(seeded.url, tenant=TENANT, token=TOKEN))
    with TestClient(app, base_url="http://192.0.2.10:8765") as client:
        for path in ("/", "/store", "/static/ui.js", "/session?id=tool-chat"):
            assert client.get(path).status_code == 401, path
        assert client.get("/", headers={"Authorization": "Bearer nope-nope-nope-nope"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.get("/", params={"token": "wrong"}).status_code == 401
        signed = client.get("/store", params={"token": TOKEN, "tenant": TENANT}, follow_redirects=False)
        assert signed.status_code == 303
        assert signed.headers["location"] == f"/store?tenant={TENANT}"
        assert f"{COOKIE}={TOKEN}" in signed.headers["set-cookie"]
        assert "HttpOnly" in signed.headers["set-cookie"]
        assert client.get("/store").status_code == 200  # the cookie now carries it
        assert client.post("/store").status_code == 405  # read-only with a token too


def test_without_a_token_only_a_loopback_host_is_answered(seeded: Any) -> None:
    with TestClient(create_app(UIConfig(seeded.url, tenant=TENANT)), base_url="http://rebound.example") as client:
        assert client.get("/").status_code == 421
    for host in ("localhost:8765", "[::1]:8765", "127.0.0.1"):
        with TestClient(create_app(UIConfig(seeded.url, tenant=TENANT)), base_url=f"http://{host}") as client:
            assert client.get("/").status_code == 200, host


def test_listening_beyond_loopback_needs_a_token(
    seeded: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHATKEEP_UI_TOKEN", raising=False)  # a token in the environment would let it start
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        check_bind(host, None)
    for host in ("0.0.0.0", "192.0.2.10", "::", "example.com"):
        with pytest.raises(UnsafeBindError, match="--token"):
            check_bind(host, None)
        check_bind(host, TOKEN)
    assert main(["ui", "--store", seeded.url, "--host", "0.0.0.0"]) == 1
    assert "will not listen on 0.0.0.0 without a token" in capsys.readouterr().err
    assert main(["ui", "--store", seeded.url, "--tenant", "a", "--all-tenants"]) == 2


def test_token_sources_and_the_printed_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATKEEP_UI_TOKEN", raising=False)
    assert ui_token(None) is None
    made = ui_token("")
    assert made is not None
    assert len(made) >= 32
    assert made != ui_token("")
    monkeypatch.setenv("CHATKEEP_UI_TOKEN", TOKEN)
    assert ui_token(None) == TOKEN
    with pytest.raises(ValueError, match="16 to 512"):
        ui_token("short")
    assert ui_url("0.0.0.0", 8765, TOKEN) == f"http://127.0.0.1:8765/?token={TOKEN}"
    assert ui_url("::1", 9000, None) == "http://[::1]:9000/"


def test_a_missing_store_is_refused_before_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.db"
    assert main(["ui", "--store", f"sqlite:///{missing}"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()


def test_a_long_session_is_shown_whole_in_pages(seeded: Any, client: TestClient) -> None:
    seen: list[str] = []
    path: str | None = "/session?id=long-chat"
    while path is not None:
        page = client.get(path.replace("&amp;", "&")).text
        seen = re.findall(r'<article class="msg [^"]*" id="m-([^"]+)"', page) + seen
        older = re.search(r'class="older" href="([^"]+)"', page)
        path = older[1] if older else None
    assert seen == seeded.long_ids
    assert len(seen) == LONG


def test_a_session_page_reads_its_info_by_key_never_by_walking_the_listing(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app.app.state.ui.store  # type: ignore[attr-defined]

    async def no_listing(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a session's page walked list_sessions for its title, tags and usage")

    monkeypatch.setattr(store, "list_sessions", no_listing)  # a tenant of millions of sessions costs the same
    page = client.get("/session", params={"id": "tool-chat-fork"}).text
    assert "<h1>Weather tools</h1>" in page  # the title the fork took from its parent
    assert "150 (120 in, 30 out, 1 model call)" in page
    assert 'href="/?tenant=acme&amp;tag=tools"' in page
    assert 'id="fork-point"' in page
    export = client.get("/session/export", params={"id": "tool-chat-fork"}).text
    assert json.loads(export.splitlines()[0])["title"] == "Weather tools"


def test_an_encrypted_session_is_refused_as_text_and_exported_sealed(tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason='EncryptedStore needs "chatkeep-core[encryption]"')
    import asyncio
    import os

    from chatkeep.core import Message
    from chatkeep.core.encryption import EncryptedStore

    data, keys = f"sqlite:///{tmp_path / 'data.db'}", f"sqlite:///{tmp_path / 'keys.db'}"

    async def seal() -> None:
        store = EncryptedStore(open_store(data), key_store=open_store(keys), master_keys={"k1": os.urandom(32)})
        async with store:
            await store.append(SessionKey(TENANT, "sealed"), [Message(role="user", text="my card number")])

    asyncio.run(seal())
    with TestClient(create_app(UIConfig(data, tenant=TENANT)), base_url="http://127.0.0.1") as client:
        assert "sealed" in client.get("/").text
        refused = client.get("/session", params={"id": "sealed"})
        assert refused.status_code == 409
        assert "chatkeep ui holds no keys" in refused.text
        assert "my card number" not in refused.text
        exported = client.get("/session/export", params={"id": "sealed"}).text
        assert "my card number" not in exported
        assert json.loads(exported.splitlines()[-1])["messages"] == 1  # moved as stored, sealed


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_command_serves_the_printed_url_until_interrupted(seeded: Any) -> None:
    """``chatkeep ui`` as a user runs it: a process that prints the URL, serves it, and stops on Ctrl-C."""
    import httpx

    command = [sys.executable, "-m", "chatkeep.core.cli", "ui", "--store", seeded.url, "--tenant", TENANT]
    process = subprocess.Popen(
        [*command, "--port", str(_free_port()), "--token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens
        url = line.rsplit("open ", 1)[1].strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{43}", url), line
        with httpx.Client(timeout=30) as client:
            assert client.get(url.split("?", 1)[0]).status_code == 401
            page = client.get(url, follow_redirects=True)
            assert page.status_code == 200
            assert "Planning a trip to Lisbon" in page.text
            assert client.get(url.split("?", 1)[0] + "store").status_code == 200  # the cookie
    finally:
        process.send_signal(signal.SIGINT)
        _, errors = process.communicate(timeout=60)
    assert process.returncode == 130, errors  # stopped by Ctrl-C, as every chatkeep command reports it
    assert "Traceback" not in errors


def test_a_port_in_use_is_refused_with_what_to_do(seeded: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["ui", "--store", seeded.url, "--tenant", TENANT, "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_ids_with_slashes_and_url_characters_are_reached(tmp_path: Path) -> None:
    import asyncio
    import html

    from chatkeep.core import Message

    url, odd = f"sqlite:///{tmp_path / 'odd.db'}", "a/b?c=1&d#e %2F é"

    async def store_it() -> str:
        async with open_store(url) as store:
            message = Message(role="user", text="found me")
            await store.append(SessionKey("t/1?x#y", odd), [message])
            return message.message_id

    message_id = asyncio.run(store_it())
    with TestClient(create_app(UIConfig(url, tenant="t/1?x#y")), base_url="http://127.0.0.1") as client:
        listing = client.get("/", params={"tenant": "t/1?x#y"}).text
        link = re.search(r'class="session-link" href="([^"]+)"', listing)
        assert link is not None
        href = html.unescape(link[1])
        assert "found me" in client.get(href).text
        jump = client.get(href + "&message=" + message_id, follow_redirects=False)
        assert jump.status_code == 302
        assert "found me" in client.get(jump.headers["location"]).text
        exported = client.get(href.replace("/session?", "/session/export?"))
        assert exported.headers["content-disposition"] == 'attachment; filename="a_b_c_1_d_e_2F.jsonl"'
        assert json.loads(exported.text.splitlines()[0])["session_id"] == odd


def test_a_password_in_the_store_url_never_reaches_a_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A real server, every logger of uvicorn and chatkeep at DEBUG: a page, a 404, a 400, a store error, a crash."""
    import logging

    import httpx
    import uvicorn

    from chatkeep.core import StoreUnavailableError
    from chatkeep.testing.browser import serving

    url = "memory://operator:hunter2-log-secret@localhost"  # memory:// takes (and ignores) a user and password
    names = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "starlette", "chatkeep")
    loggers = [logging.getLogger(name) for name in names]
    configure = uvicorn.Config.configure_logging

    def configure_then_capture(config: uvicorn.Config) -> None:
        configure(config)  # uvicorn's own set-up first (it replaces its loggers' handlers and levels), then ours
        for logger in loggers:
            monkeypatch.setattr(logger, "level", logging.DEBUG)
            logger.addHandler(caplog.handler)

    monkeypatch.setattr(uvicorn.Config, "configure_logging", configure_then_capture)
    app = create_app(UIConfig(url, tenant=TENANT))
    try:
        with serving(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            assert client.get("/").status_code == 200
            assert client.get("/store").status_code == 200
            assert client.get("/no-such-page").status_code == 404
            assert client.get("/session", params={"id": "nope"}).status_code == 404
            assert client.get("/", params={"cursor": "not-a-cursor"}).status_code == 400

            async def unreachable(*args: Any, **kwargs: Any) -> None:
                raise StoreUnavailableError(f"cannot reach {url}")  # a backend's error that names its URL

            monkeypatch.setattr(app.app.state.ui.store, "list_sessions", unreachable)  # type: ignore[attr-defined]
            failed = client.get("/")
            assert failed.status_code == 503
            assert "hunter2" not in failed.text
            assert "operator:***@localhost" in failed.text

            async def driver_error(*args: Any, **kwargs: Any) -> None:
                raise OSError(f"connection to {url} refused")  # not chatkeep's: uvicorn would log it whole

            monkeypatch.setattr(app.app.state.ui.store, "list_sessions", driver_error)  # type: ignore[attr-defined]
            crashed = client.get("/")
            assert crashed.status_code == 500
            assert "hunter2" not in crashed.text
    finally:
        for logger in loggers:
            logger.removeHandler(caplog.handler)
    assert caplog.records, "nothing was logged: the capture is not wired to uvicorn's loggers"
    logged = "\n".join(caplog.handler.format(record) for record in caplog.records)
    printed = capfd.readouterr()
    assert "hunter2" not in logged + printed.out + printed.err
    assert "connection to memory://operator:***@localhost refused" in logged  # logged, with the secret hidden
