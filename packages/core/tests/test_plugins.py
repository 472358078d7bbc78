"""The plugin registry, tested in-process: plugins are small objects registered into a fresh registry.

Real entry-point discovery is tested in a subprocess, in the repository's tests/test_discovery.py.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from chatkeep.core import (
    AgentSession,
    BackendConflictError,
    HistoryStore,
    Message,
    SessionKey,
    SessionPage,
    StoredSession,
    UnknownBackendError,
)
from chatkeep.core.backend import BackendSpec, hookimpl, redact_url
from chatkeep.core.plugins import PluginRegistry


class TinyStore(HistoryStore):
    """Just enough of a store to be opened; it remembers how it was opened."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__()
        self.url = url
        self.options = options

    async def _append(self, key: SessionKey, messages: Sequence[Message], records: Sequence[str]) -> int:
        raise AssertionError("not called: this store is only opened")

    async def _load(self, key: SessionKey, last: int | None) -> list[Message]:
        raise AssertionError("not called: this store is only opened")

    def _iter_messages(self, key: SessionKey, batch: int) -> AsyncIterator[Message]:
        raise AssertionError("not called: this store is only opened")

    async def _count(self, key: SessionKey) -> int:
        raise AssertionError("not called: this store is only opened")

    async def _delete(self, key: SessionKey) -> bool:
        raise AssertionError("not called: this store is only opened")

    async def _trim(self, key: SessionKey, keep_last: int) -> int:
        raise AssertionError("not called: this store is only opened")

    async def _list_sessions(self, tenant: str, limit: int, cursor: str | None) -> SessionPage:
        raise AssertionError("not called: this store is only opened")

    async def _save_session(
        self, key: SessionKey, session: AgentSession, expected_version: str | None, owner: str | None
    ) -> str:
        raise AssertionError("not called: this store is only opened")

    async def _load_session(self, key: SessionKey) -> StoredSession | None:
        raise AssertionError("not called: this store is only opened")

    async def _prune(self, cutoff: datetime, tenant: str | None) -> int:
        raise AssertionError("not called: this store is only opened")

    async def _delete_tenant(self, tenant: str) -> int:
        raise AssertionError("not called: this store is only opened")


class BackendPlugin:
    """A plugin object registering the given backends."""

    def __init__(self, *specs: BackendSpec) -> None:
        self.specs = specs

    @hookimpl
    def chatkeep_register_backends(self, register: Callable[[BackendSpec], None]) -> None:
        for spec in self.specs:
            register(spec)


class BrokenPlugin:
    @hookimpl
    def chatkeep_register_backends(self, register: Callable[[BackendSpec], None]) -> None:
        raise RuntimeError("boom while registering")


class MisspelledHookPlugin:
    @hookimpl
    def chatkeep_register_backend(self, register: Callable[[BackendSpec], None]) -> None:
        raise AssertionError("never called: chatkeep has no such hook")


def tiny_spec(name: str = "tiny", schemes: tuple[str, ...] = ("tiny", "tiny+driver")) -> BackendSpec:
    return BackendSpec(name=name, schemes=schemes, open=TinyStore, extra=None, description="a tiny test store")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> PluginRegistry:
    """A fresh registry that loads no entry points (only what a test registers in-process)."""
    monkeypatch.setenv("CHATKEEP_DISABLE_PLUGIN_AUTOLOAD", "1")
    return PluginRegistry(
        released_extras={"memory", "sql", "sqlite", "postgresql", "mysql", "mariadb", "redis", "openai"}
    )


# -- registering and resolving --------------------------------------------------------------------


def test_registered_backend_resolves_by_full_scheme(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec()), name="tiny-plugin")

    store = registry.open_store("tiny+driver://host/db", max_rows=5)

    assert isinstance(store, TinyStore)
    assert store.url == "tiny+driver://host/db"
    assert store.options == {"max_rows": 5}
    assert registry.resolve("tiny://") is registry.resolve("tiny+driver://")


def test_a_driver_suffix_falls_back_to_the_base_scheme(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec(schemes=("tiny",))), name="tiny-plugin")

    store = registry.open_store("tiny+asyncdriver://host")

    assert isinstance(store, TinyStore)
    assert store.url == "tiny+asyncdriver://host"


def test_schemes_are_case_insensitive(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec()), name="tiny-plugin")

    assert isinstance(registry.open_store("TINY://host"), TinyStore)


def test_backend_resolves_by_name(registry: PluginRegistry) -> None:
    spec = tiny_spec()
    registry.register_plugin(BackendPlugin(spec), name="tiny-plugin")

    assert registry.resolve("tiny") is spec


def test_a_bare_name_opens_the_default_url_and_a_bare_scheme_opens_that_scheme(registry: PluginRegistry) -> None:
    spec = BackendSpec(name="tiny", schemes=("tinydb", "tiny+driver"), open=TinyStore, default_url="tinydb://local/0")
    registry.register_plugin(BackendPlugin(spec), name="tiny-plugin")

    by_name = registry.open_store("tiny", max_rows=5)
    by_scheme = registry.open_store("tinydb")

    assert isinstance(by_name, TinyStore)
    assert isinstance(by_scheme, TinyStore)
    assert (by_name.url, by_name.options) == ("tinydb://local/0", {"max_rows": 5})
    assert by_scheme.url == "tinydb://"
    assert registry.resolve("tinydb") is spec


def test_the_default_url_of_a_spec_without_one_is_its_first_scheme() -> None:
    assert tiny_spec().default_url == "tiny://"


def test_an_opener_named_as_module_and_attribute_is_imported_only_when_a_store_is_opened(
    registry: PluginRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "chatkeep_lazy_opener.py").write_text(
        "def open_store(url, **options):\n    return ('opened', url, options)\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "chatkeep_lazy_opener", raising=False)
    registry.register_plugin(
        BackendPlugin(BackendSpec(name="lazy", schemes=("lazy",), open="chatkeep_lazy_opener:open_store")),
        name="lazy-plugin",
    )
    registry.resolve("lazy://x")

    assert "chatkeep_lazy_opener" not in sys.modules, "finding the backend must not import its opener's module"
    opened: Any = registry.open_store("lazy", flag=True)

    assert "chatkeep_lazy_opener" in sys.modules
    assert opened == ("opened", "lazy://", {"flag": True})


@pytest.mark.parametrize("where", ["chatkeep_lazy_opener", "a:b:c", ":open", "module:"])
def test_an_opener_string_must_be_module_and_attribute(where: str) -> None:
    with pytest.raises(ValueError, match="module:attr"):
        BackendSpec(name="lazy", schemes=("lazy",), open=where)


def test_a_bare_scheme_of_a_known_backend_that_is_missing_gives_the_install_command(registry: PluginRegistry) -> None:
    with pytest.raises(UnknownBackendError, match=r'pip install "chatkeep-core\[postgresql\]"'):
        registry.open_store("postgresql")


def test_installed_backends_name_their_plugin(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec(), tiny_spec("other", ("other",))), name="tiny-plugin")

    backends = registry.backends()

    assert [b.name for b in backends] == ["other", "tiny"]
    assert backends[1].schemes == ("tiny", "tiny+driver")
    assert "tiny-plugin" in backends[1].distribution
    assert backends[1].description == "a tiny test store"


def test_a_plugin_registered_after_discovery_is_usable_at_once(registry: PluginRegistry) -> None:
    assert registry.backends() == []

    registry.register_plugin(BackendPlugin(tiny_spec()), name="late")

    assert [b.name for b in registry.backends()] == ["tiny"]
    assert isinstance(registry.open_store("tiny://"), TinyStore)


def test_unregistering_removes_the_backends(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec()), name="tiny-plugin")
    assert registry.backends()

    registry.unregister_plugin("tiny-plugin")

    assert registry.backends() == []
    with pytest.raises(UnknownBackendError):
        registry.resolve("tiny://")


def test_fresh_registries_do_not_share_plugins(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec()), name="tiny-plugin")

    assert PluginRegistry().backends() == []


# -- unknown backends -----------------------------------------------------------------------------


def test_unknown_scheme_lists_the_installed_backends(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec()), name="tiny-plugin")

    with pytest.raises(UnknownBackendError) as caught:
        registry.resolve("nosuch://host")

    message = str(caught.value)
    assert "'nosuch://host'" in message
    assert "tiny (tiny://, tiny+driver://)" in message
    assert "redis://" in message  # the schemes chatkeep knows, to spot a typo


def test_unknown_scheme_with_nothing_installed_says_none(registry: PluginRegistry) -> None:
    with pytest.raises(UnknownBackendError, match="Installed backends: none"):
        registry.resolve("nosuch://")


@pytest.mark.parametrize(
    ("url", "extra"),
    [
        ("postgresql://user@host/db", "postgresql"),
        ("postgresql+psycopg://user@host/db", "postgresql"),
        ("postgres://user@host/db", "postgresql"),
        ("sqlite:///tmp/x.db", "sqlite"),
        ("sqlite+aiosqlite:///tmp/x.db", "sqlite"),
        ("mysql+aiomysql://root@127.0.0.1/test", "mysql"),
        ("mariadb://root@127.0.0.1/test", "mariadb"),
        ("redis://localhost:6379/0", "redis"),
        ("rediss://localhost:6380", "redis"),
        ("redis+cluster://127.0.0.1:7000", "redis"),
        ("unix:///tmp/redis.sock", "redis"),
        ("memory://", "memory"),
        ("redis", "redis"),  # a backend name rather than a URL
        ("sql", "sql"),  # by name, the extra with every SQL driver
    ],
)
def test_known_but_missing_backend_gives_the_install_command(registry: PluginRegistry, url: str, extra: str) -> None:
    with pytest.raises(UnknownBackendError) as caught:
        registry.resolve(url)

    assert f'pip install "chatkeep-core[{extra}]"' in str(caught.value)


def test_a_backend_not_released_yet_is_not_offered_as_an_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATKEEP_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = PluginRegistry(released_extras={"memory"})  # a core older than the redis extra
    with pytest.raises(UnknownBackendError) as caught:
        registry.resolve("redis://localhost:6379/0")
    message = str(caught.value)
    assert "pip install" not in message
    assert "'redis' backend, which is not released yet" in message


def test_a_scheme_of_no_shipped_backend_is_unknown(registry: PluginRegistry) -> None:
    # chatkeep ships no S3 backend, so it does not pretend to know the scheme: it lists the ones it knows.
    with pytest.raises(UnknownBackendError) as caught:
        registry.resolve("s3://bucket/prefix")
    message = str(caught.value)
    assert "pip install" not in message
    known = message.split("Check the spelling; the schemes chatkeep knows are ", 1)[1]
    assert "redis://" in known
    assert "azblob://" in known
    assert "s3" not in known


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@host/db",
        "postgresql+psycopg://user:s3cret@host:5432/db?sslmode=require",
        "redis://:s3cret@localhost:6379/0",
        "redis+cluster://default:s3cret@127.0.0.1:7000",
        "nosuch://user:s3cret@host/db",
        "postgresql://host/db?password=s3cret",
        "mysql://host/db?user=u&password=s3cret&charset=utf8mb4",
        "azblob://account/container?sig=s3cret",
    ],
)
def test_passwords_never_appear_in_unknown_backend_errors(registry: PluginRegistry, url: str) -> None:
    with pytest.raises(UnknownBackendError) as caught:
        registry.resolve(url)

    message = str(caught.value)
    assert "s3cret" not in message
    assert "***" in message
    assert "s3cret" not in repr(caught.value)


# -- conflicts and broken plugins -----------------------------------------------------------------


def test_two_plugins_claiming_one_scheme_is_an_error_naming_both(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec("first", ("shared", "first-only"))), name="plugin-one")
    registry.register_plugin(BackendPlugin(tiny_spec("second", ("shared",))), name="plugin-two")

    with pytest.raises(BackendConflictError) as caught:
        registry.resolve("shared://host")

    message = str(caught.value)
    assert "'shared'" in message
    assert "plugin-one" in message
    assert "plugin-two" in message
    assert "CHATKEEP_PLUGINS" in message  # what to do about it
    # Schemes nobody else claims still work.
    assert registry.resolve("first-only://").name == "first"


def test_a_base_scheme_claimed_twice_is_an_error_for_driver_urls_too(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec("first", ("shared",))), name="plugin-one")
    registry.register_plugin(BackendPlugin(tiny_spec("second", ("shared",))), name="plugin-two")

    with pytest.raises(BackendConflictError, match=r"plugin-one.*plugin-two"):
        registry.resolve("shared+driver://host")


def test_two_plugins_claiming_one_backend_name_is_an_error_naming_both(registry: PluginRegistry) -> None:
    registry.register_plugin(BackendPlugin(tiny_spec("tiny", ("tiny-a",))), name="plugin-one")
    registry.register_plugin(BackendPlugin(tiny_spec("tiny", ("tiny-b",))), name="plugin-two")

    for what in ("tiny", "tiny-a://"):
        with pytest.raises(BackendConflictError) as caught:
            registry.resolve(what)
        assert "plugin-one" in str(caught.value)
        assert "plugin-two" in str(caught.value)


def test_a_plugin_whose_hook_raises_does_not_stop_the_others(registry: PluginRegistry) -> None:
    registry.register_plugin(BrokenPlugin(), name="broken")
    registry.register_plugin(BackendPlugin(tiny_spec()), name="good")

    assert isinstance(registry.open_store("tiny://"), TinyStore)
    assert "boom while registering" in registry.failures()["broken"]
    # A user asking for a missing backend learns about the broken plugin.
    with pytest.raises(UnknownBackendError, match=r"'broken'.*RuntimeError: boom while registering"):
        registry.resolve("brokenscheme://")


def test_a_plugin_with_a_misspelled_hook_does_not_stop_the_others(registry: PluginRegistry) -> None:
    # Registered before discovery, as entry-point plugins are.
    registry.register_plugin(BackendPlugin(tiny_spec()), name="good")
    registry.register_plugin(MisspelledHookPlugin(), name="typo")

    assert [b.name for b in registry.backends()] == ["tiny"]
    failures = registry.failures()
    assert list(failures) == ["typo"]
    assert "chatkeep_register_backend" in failures["typo"]


def test_registering_something_else_than_a_backend_spec_is_reported(registry: PluginRegistry) -> None:
    class WrongPlugin:
        @hookimpl
        def chatkeep_register_backends(self, register: Callable[[Any], None]) -> None:
            register({"name": "dict-backend"})

    registry.register_plugin(WrongPlugin(), name="wrong")
    registry.register_plugin(BackendPlugin(tiny_spec()), name="good")

    assert [b.name for b in registry.backends()] == ["tiny"]
    assert "takes a BackendSpec, got dict" in registry.failures()["wrong"]


# -- redact_url -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://user:s3cret@host/db", "postgresql://user:***@host/db"),
        ("postgresql+psycopg://user:s3cret@host:5432/db", "postgresql+psycopg://user:***@host:5432/db"),
        ("redis://:s3cret@localhost:6379/0", "redis://:***@localhost:6379/0"),
        ("rediss://default:s3cret@cache.example.com", "rediss://default:***@cache.example.com"),
        ("mysql://u:s3cret@h/db?password=other&charset=utf8", "mysql://u:***@h/db?password=***&charset=utf8"),
        ("postgresql://h/db?sslmode=require&PASSWORD=s3cret", "postgresql://h/db?sslmode=require&PASSWORD=***"),
        ("azblob://acct/c?sv=2022-11-02&sig=abc%2Fdef", "azblob://acct/c?sv=2022-11-02&sig=***"),
        (
            "could not reach redis://:a1@h1:6379 nor postgresql://u:b2@h2/db",
            "could not reach redis://:***@h1:6379 nor postgresql://u:***@h2/db",
        ),
    ],
)
def test_redact_url_hides_secrets(text: str, expected: str) -> None:
    assert redact_url(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "redis://localhost:6379/0",
        "postgresql://user@host:5432/db",
        "sqlite:///tmp/chat.db",
        "memory://",
        "azblob://account/container",
        "no url here, just text: a:b@c",
        "https://example.com/search?q=password",
    ],
)
def test_redact_url_leaves_urls_without_secrets_alone(text: str) -> None:
    assert redact_url(text) == text


def test_redact_url_hides_a_password_holding_an_at_sign() -> None:
    assert redact_url("redis://user:p@ss@host:6379/0") == "redis://user:***@host:6379/0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("azblob://c?api_key=k1&access_token=t1&x=1", "azblob://c?api_key=***&access_token=***&x=1"),
        (
            "AccountName=a;AccountKey=SECRET==;BlobEndpoint=http://h",
            "AccountName=a;AccountKey=***;BlobEndpoint=http://h",
        ),
    ],
)
def test_redact_url_hides_named_secrets(text: str, expected: str) -> None:
    assert redact_url(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # URL parsers decode parameter names, so these reach the driver as ``password`` and ``sig``.
        ("redis://h:6379/0?pass%77ord=s3cret", "redis://h:6379/0?pass%77ord=***"),
        ("postgresql://u@h/db?sslmode=require&%70assword=s3cret", "postgresql://u@h/db?sslmode=require&%70assword=***"),
        ("azblob://acct/c?sv=1&si%67=abc", "azblob://acct/c?sv=1&si%67=***"),
    ],
)
def test_redact_url_hides_secrets_whose_names_are_percent_encoded(text: str, expected: str) -> None:
    assert redact_url(text) == expected


def test_an_open_error_never_shows_a_password_given_under_an_encoded_name() -> None:
    from chatkeep.core import ChatkeepError, open_store

    url = "memory://?pass%77ord=s3cret"
    with pytest.raises(ChatkeepError) as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value)
