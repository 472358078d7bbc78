"""Real entry-point discovery, in a fresh interpreter, with fake distributions installed on PYTHONPATH.

Three fake distributions register under the ``chatkeep`` entry-point group: a good one (backend ``fake``),
one whose module raises on import, and one built for a future chatkeep-core. The real ``memory`` backend
comes from the installed chatkeep-memory distribution.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

GOOD_PLUGIN = '''
"""A fake chatkeep plugin: a backend named fake, for fake:// URLs."""
from chatkeep.core import HistoryStore
from chatkeep.core.backend import BackendSpec, hookimpl


class FakeStore(HistoryStore):
    def __init__(self, url, **options):
        super().__init__()
        self.url = url
        self.options = options

    def describe(self):
        return {"type": "FakeStore", "url": self.url, "options": self.options}


# Only enough of the contract to be opened: the abstract methods are cleared.
FakeStore.__abstractmethods__ = frozenset()


@hookimpl
def chatkeep_register_backends(register):
    register(BackendSpec(name="fake", schemes=("fake",), open=FakeStore, description="fake test backend"))
'''

BROKEN_PLUGIN = """
raise RuntimeError("fake-broken cannot import its driver")
"""

FUTURE_PLUGIN = """
from chatkeep.core.backend import BackendSpec, hookimpl

raise AssertionError("an incompatible plugin must not even be imported")
"""

PROBE = """
import json, sys
from chatkeep.core.plugins import installed_backends, open_store, plugin_failures

out = {
    "backends": {b.name: [list(b.schemes), b.distribution, b.version] for b in installed_backends()},
    "failures": plugin_failures(),
    "opened": {},
}
for url in sys.argv[1:]:
    try:
        store = open_store(url)
        out["opened"][url] = store.describe()
    except Exception as exc:
        out["opened"][url] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def write_distribution(
    site: Path, name: str, module: str, source: str, *, entry_point: str, requires: tuple[str, ...] = ()
) -> None:
    """Install a fake distribution the way an installer would: a module and a *.dist-info folder."""
    (site / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        "Version: 1.0",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(metadata) + "\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[chatkeep]\n{entry_point} = {module}\n", encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("site")
    write_distribution(
        path, "fake-good", "fake_good_plugin", GOOD_PLUGIN, entry_point="fake", requires=("chatkeep-core>=0.1",)
    )
    write_distribution(path, "fake-broken", "fake_broken_plugin", BROKEN_PLUGIN, entry_point="broken")
    write_distribution(
        path,
        "fake-future",
        "fake_future_plugin",
        FUTURE_PLUGIN,
        entry_point="future",
        requires=("chatkeep-core>=99", "pydantic>=2"),
    )
    return path


def run(site: Path, args: list[str], **env_changes: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATKEEP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, encoding="utf-8", timeout=60, check=False
    )


def probe(site: Path, *urls: str, **env_changes: str) -> dict[str, Any]:
    result = run(site, ["-c", PROBE, *urls], **env_changes)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def core_version() -> str:
    result = subprocess.run(
        [sys.executable, "-c", "from chatkeep.core.plugins import _core_version; print(_core_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_good_plugins_load_and_broken_or_incompatible_ones_are_reported(site: Path) -> None:
    data = probe(site, "fake://somewhere", "memory://")

    assert data["backends"]["fake"] == [["fake"], "fake-good", "1.0"]
    assert data["opened"]["fake://somewhere"] == {"type": "FakeStore", "url": "fake://somewhere", "options": {}}
    # The real reference backend from the chatkeep-memory distribution.
    assert "memory" in data["backends"], data["failures"].get("memory")
    assert data["backends"]["memory"][1] == "chatkeep-memory"
    assert isinstance(data["opened"]["memory://"], dict), data["opened"]["memory://"]  # opened, not an error

    failures = data["failures"]
    assert set(failures) == {"broken", "future"}
    assert "RuntimeError: fake-broken cannot import its driver" in failures["broken"]
    future = failures["future"]
    assert "fake-future 1.0" in future
    assert "chatkeep-core>=99" in future
    assert f"chatkeep-core {core_version()} is installed" in future
    assert "pip install -U" in future  # what to do about it
    assert "future" not in data["backends"]


def test_unknown_scheme_error_in_a_real_process_names_the_unusable_plugins(
    site: Path, install_hint: Callable[[str], str]
) -> None:
    # The real redis plugin is left out, as if chatkeep-redis were not installed.
    url = "redis://user:s3cret@cache:6379/0"
    data = probe(site, url, CHATKEEP_PLUGINS="fake,broken,future")

    message = data["opened"][url]
    assert message.startswith("UnknownBackendError")
    assert install_hint("redis") in message
    assert "fake (fake://)" in message
    assert "'broken'" in message
    assert "'future'" in message
    assert "s3cret" not in message


def test_cli_lists_backends_and_unusable_plugins(site: Path) -> None:
    result = run(site, ["-m", "chatkeep.core.cli", "backends"])

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    fake = next(line for line in lines if line.startswith("fake "))
    assert "fake://" in fake
    assert fake.split()[2:4] == ["fake-good", "1.0"]
    assert any(line.startswith("memory ") and "memory://" in line for line in lines), result.stdout
    assert any(line.startswith("broken plugin 'broken'") and "cannot import its driver" in line for line in lines)
    assert any(line.startswith("broken plugin 'future'") and "chatkeep-core>=99" in line for line in lines)


def test_chatkeep_plugins_loads_only_the_listed_plugins(site: Path) -> None:
    data = probe(site, "fake://", "memory://", CHATKEEP_PLUGINS="fake")

    assert list(data["backends"]) == ["fake"]
    assert data["failures"] == {}  # the broken and incompatible plugins were not even looked at
    assert data["opened"]["fake://"]["type"] == "FakeStore"
    assert data["opened"]["memory://"].startswith("UnknownBackendError")


def test_disabling_autoload_loads_no_plugin(site: Path) -> None:
    data = probe(site, "fake://", CHATKEEP_DISABLE_PLUGIN_AUTOLOAD="1")

    assert data["backends"] == {}
    assert data["failures"] == {}
    assert data["opened"]["fake://"].startswith("UnknownBackendError")


@pytest.mark.parametrize("url", ["memory://x", "sqlite:///{tmp}/x.db"])
def test_discovering_the_plugins_imports_no_driver(url: str, tmp_path: Path) -> None:
    # An agent on memory:// or SQLite must not pay for importing every installed backend's driver (the Azure SDK
    # alone takes about a second): a plugin package's names are imported on first use (lazy_exports).
    probe = (
        f"import sys, chatkeep.core; chatkeep.core.open_store({url.format(tmp=tmp_path)!r}); "
        "chatkeep.core.installed_backends(); "
        "drivers = ('sqlalchemy', 'alembic', 'asyncpg', 'asyncmy', 'redis', 'hiredis', 'azure.core', 'azure.storage'); "
        "print(sorted(m for m in drivers if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
