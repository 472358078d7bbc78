"""Run a framework's own published tests against chatkeep's adapter, on each target backend.

    python -m peers openai-agents [pytest arguments...]      (nox -s "interop_peers(framework='openai-agents')")
    python -m peers langchain [pytest arguments...]

It downloads the framework's source distribution at the version :data:`SPECS` pins (the one noxfile.py's
INTEROP installs) from PyPI with ``pip download``, extracts only the test files :data:`SPECS` names into a
temporary folder, and runs them with pytest under the framework's own test settings and conftest, plus a plugin
of ours (``peer_<framework>.py``) that puts the adapter where their tests build their own history class.
Nothing of theirs is kept in this repository. One pytest process per backend (memory, SQLite, PostgreSQL,
Redis; ``CHATKEEP_TEST_INTEROP_BACKENDS`` narrows them, as for the adapter tests); the differences chatkeep
keeps on purpose are strict expected failures (``_expected.py``). Run from the repository's root, with
``packages/interop/tests`` on ``PYTHONPATH`` (the nox session sets it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Spec:
    """Where a framework's tests come from and how they run."""

    distribution: str  # the PyPI name and pinned version, as pip takes it
    tests: tuple[str, ...]  # the test files pytest runs (paths inside the sdist's top folder)
    helpers: tuple[str, ...]  # what they import beside the package: their settings, conftests, test utilities
    pytest_args: tuple[str, ...] = ()


SPECS: dict[str, Spec] = {
    "openai-agents": Spec(
        "openai-agents==0.24.0",
        tests=(
            "tests/memory/test_session.py",
            "tests/memory/test_session_limit.py",
            "tests/extensions/memory/test_encrypt_session.py",
            "tests/extensions/memory/test_advanced_sqlite_session.py",
        ),
        helpers=(
            "tests/conftest.py",
            "tests/testing_processor.py",
            "tests/test_responses.py",
            "tests/utils/hitl.py",  # the advanced session tests import it
        ),
        # Their SQLiteSession.close() is sync and their tests call it without await; ChatkeepSession's is a
        # coroutine (an expected difference), closed by the plugin after each test.
        pytest_args=("-W", "ignore:coroutine 'ChatkeepSession.close' was never awaited:RuntimeWarning"),
    ),
    "langchain": Spec(
        "langchain-core==1.8.3",
        tests=("tests/unit_tests/chat_history/test_chat_history.py", "tests/unit_tests/runnables/test_history.py"),
        helpers=(
            "tests/unit_tests/conftest.py",
            "tests/unit_tests/runnables/conftest.py",
            "tests/unit_tests/pydantic_utils.py",
        ),
        # Their addopts need syrupy (snapshots), which none of these tests uses.
        pytest_args=("-o", "addopts="),
    ),
}


def targets() -> dict[str, str]:
    """The adapter tests' backends (``packages/interop/tests/conftest.py``'s TARGETS), narrowed as they are."""
    spec = importlib.util.spec_from_file_location("_interop_conftest", HERE.parent / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    chosen: list[str] = conftest._chosen()
    return {name: conftest.TARGETS[name] for name in chosen}


def reachable(url: str) -> str | None:
    """``None`` when the URL's server accepts a connection (or it has none), else why not."""
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    try:
        socket.create_connection((parts.hostname, parts.port or 0), timeout=2).close()
    except OSError as exc:
        return f"{parts.scheme} server at {parts.hostname}:{parts.port} is not reachable ({exc})"
    return None


def extract(spec: Spec, into: Path) -> Path:
    """Download the sdist with pip into ``into`` and extract only the spec's tests and helpers, with the test
    settings (``pyproject.toml``) and the ``__init__.py`` of their folders; the folder they are in."""
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"),
            *("--no-binary", ":all:", "--dest", str(into), spec.distribution),
        ],
        check=True,
    )
    name, version = spec.distribution.split("==")
    (archive,) = into.glob(f"{name.replace('-', '_')}-{version}.tar.gz")
    top = f"{name.replace('-', '_')}-{version}"
    root = into / top
    wanted = {"pyproject.toml", *spec.tests, *spec.helpers}
    folders = {parent for path in wanted for parent in Path(path).parents if parent != Path()}
    with tarfile.open(archive) as sdist:
        names = set(sdist.getnames())
        inits = {f"{folder}/__init__.py" for folder in folders if f"{top}/{folder}/__init__.py" in names}
        members = [sdist.getmember(f"{top}/{path}") for path in sorted(wanted | inits)]
        sdist.extractall(into, members=members, filter="data")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=sorted(SPECS))
    options, pytest_args = parser.parse_known_args()
    spec = SPECS[options.framework]
    require = os.environ.get("CHATKEEP_REQUIRE_SERVICES") == "1"
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="chatkeep-peers-") as work:
        root = extract(spec, Path(work))
        plugin = f"peers.peer_{options.framework.replace('-', '_')}"
        for backend, url in targets().items():
            why = reachable(url)
            if why is not None:
                print(f"peers: {options.framework} on {backend}: {'FAILED' if require else 'skipped'}: {why}")
                if require:
                    failed.append(backend)
                continue
            print(f"peers: {spec.distribution}'s own tests, chatkeep's adapter on {backend} ({url})", flush=True)
            command = [sys.executable, "-m", "pytest", "-c", str(root / "pyproject.toml"), "--rootdir", str(root)]
            command += ["-p", plugin, "-p", "no:cacheprovider", "-o", "timeout=300", "-q", "-rfEs"]
            command += [*spec.pytest_args, *spec.tests, *pytest_args]
            env = {**os.environ, "CHATKEEP_PEER_BACKEND": backend, "CHATKEEP_PEER_STORE_URL": url}
            # pytest runs in the temporary folder: the plugin's package by its absolute path.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
            if subprocess.run(command, cwd=root, env=env, check=False).returncode != 0:
                failed.append(backend)
    if failed:
        print(f"peers: {options.framework}'s own tests failed on {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
