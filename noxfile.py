"""Developer and CI sessions. Run through ./scripts/dev, which installs uv and nox first.

nox -s tests                 every backend of the matrix
nox -s "tests(backend='memory')"
nox -s lint typecheck docs
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "lint", "typecheck", "docs"]

PYTHON = "3.11"  # the only interpreter this project's machines have; the code supports 3.10+

# backend -> (test paths, extra environment). Core and cross-package tests run with the reference backend.
BACKENDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "memory": (["packages/core/tests", "packages/memory/tests", "tests"], {}),
}


def sync(session: nox.Session, *groups: str) -> None:
    """Install the locked workspace (every package, every extra) into the session's virtualenv."""
    args = ["uv", "sync", "--frozen", "--all-packages", "--all-extras", "--inexact"]
    for group in groups:
        args += ["--group", group]
    session.run_install(*args, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, silent=True)


@nox.session(python=PYTHON)
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """Run one backend's tests (and, for memory, the core and cross-package tests) against real services."""
    sync(session, "dev")
    paths, env = BACKENDS[backend]
    session.run("pytest", *paths, *session.posargs, env={**env, "CHATKEEP_TEST_BACKEND": backend})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    sync(session, "dev")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's src/."""
    sync(session, "dev")
    session.run("mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the user guide with mkdocs --strict."""
    sync(session, "docs")
    session.run("mkdocs", "build", "--strict", "--site-dir", os.path.join(session.create_tmp(), "site"))
