"""Developer and CI sessions. Run through ./scripts/dev, which installs uv and nox first.

nox -s tests                 every backend of the matrix
nox -s "tests(backend='memory')"
nox -s lint typecheck docs
nox -s bench                 benchmarks beside the raw drivers (not in the default run)
nox -s reliability           fault, recovery and concurrency tests on every backend, 3 rounds in a row
                             (not in the default run; -- --rounds 5 for more, other arguments go to pytest)
nox -s soak                  a fault-injecting soak of every shared backend, 5 minutes each (not in the default run;
                             -- --minutes 1 --backends redis,sqlite)
nox -s interop               the framework adapters, each with its framework's real package; for the Agents SDK
                             and LangChain also the framework's own history tests (from its sdist on PyPI)
                             against the adapter, on memory, SQLite, PostgreSQL and Redis
nox -s interop_peers         only the frameworks' own history tests
nox -s interop_bench         the adapters beside each framework's own stores (not in the default run)
nox -s ui                    chatkeep ui: its routes, headers and token through Starlette's test client, and its
                             pages in Debian's headless Chromium (scripts/chromium installs it), with screenshots
nox -s failover              a master of a private replicated Redis Cluster killed under 8 writers, 3 rounds
                             with and without wait_replicas, printing the appends lost without it (not in the
                             default run, which does one: wait_replicas=1, lagging replica; -- --rounds N)
"""

from __future__ import annotations

import argparse
import os
import socket
import urllib.parse

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "interop", "ui", "lint", "typecheck", "docs"]

PYTHON = "3.11"  # the only interpreter this project's machines have; the code supports 3.10+

# Service URLs, each overridable by the environment (loopback defaults; see scripts/ for what starts them).
POSTGRES_URL = os.environ.get("CHATKEEP_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("CHATKEEP_TEST_MYSQL_URL", "mysql+asyncmy://root@127.0.0.1:3306/test")
# A PostgreSQL with pgvector (scripts/pgvector up starts it) for the search tests of the sql-postgres session.
PGVECTOR_URL = os.environ.get("CHATKEEP_TEST_PGVECTOR_URL", "postgresql+asyncpg://postgres@127.0.0.1:5433/test")
REDIS_URL = os.environ.get("CHATKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_CLUSTER_URL = os.environ.get("CHATKEEP_TEST_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7000")
# Azurite's well-known development account (scripts/azurite starts it); any other account by its connection string.
AZURITE_CONNECTION_STRING = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)
BLOB_CONNECTION_STRING = os.environ.get("CHATKEEP_TEST_BLOB_CONNECTION_STRING", AZURITE_CONNECTION_STRING)

# backend -> (test paths, extra environment). Core and cross-package tests run with the reference backend.
# CHATKEEP_TEST_SQL_URL / CHATKEEP_TEST_REDIS_URL name the one server a backend session tests against;
# CHATKEEP_TEST_BLOB_CONNECTION_STRING the blob account (each test makes and deletes its own container).
BACKENDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "memory": (
        [
            "packages/core/tests",
            "packages/memory/tests",
            "packages/testing/tests",
            "packages/interop/tests/common",  # what the adapters share; each framework has its interop session
            "tests",
        ],
        {},
    ),
    "sql-sqlite": (["packages/sql/tests"], {"CHATKEEP_TEST_SQL_URL": "sqlite://"}),
    "sql-postgres": (
        ["packages/sql/tests"],
        {"CHATKEEP_TEST_SQL_URL": POSTGRES_URL, "CHATKEEP_TEST_PGVECTOR_URL": PGVECTOR_URL},
    ),
    "sql-mysql": (["packages/sql/tests"], {"CHATKEEP_TEST_SQL_URL": MYSQL_URL}),
    "redis": (["packages/redis/tests"], {"CHATKEEP_TEST_REDIS_URL": REDIS_URL}),
    "redis-cluster": (["packages/redis/tests"], {"CHATKEEP_TEST_REDIS_URL": REDIS_CLUSTER_URL}),
    "blob": (["packages/blob/tests"], {"CHATKEEP_TEST_BLOB_CONNECTION_STRING": BLOB_CONNECTION_STRING}),
    # The example third-party plugin of docs/writing-a-plugin.md, on files in pytest's tmp_path.
    "example-jsonfiles": (["docs/examples/chatkeep-jsonfiles/tests"], {}),
}
# Backends that are not workspace members (a third party's code, not in uv.lock): backend -> folder to install.
EXAMPLES: dict[str, str] = {"example-jsonfiles": "docs/examples/chatkeep-jsonfiles"}
# The repository's pytest settings and conftest.py apply to every path, also the example, which carries its own
# settings for a checkout of its own (pytest would pick those for its tests, without this conftest's marks).
# --durations: each session's log ends with its 15 slowest tests, what to look at when CI's time grows.
PYTEST = ["pytest", "-c", "pyproject.toml", "--durations=15"]


# framework -> the packages its adapter's tests and benchmark install, pinned, on top of the locked workspace:
# the framework itself at the version the adapter is tested with, the client its runtime talks to the local
# OpenAI-protocol server with, and the framework's own history stores the benchmark compares against. They are
# not in uv.lock because they cannot all share one environment (llama-index-llms-openai needs openai<3).
INTEROP: dict[str, list[str]] = {
    "openai-agents": ["openai-agents[sqlalchemy,redis]==0.24.0"],  # the extras: its own sessions, for the benchmark
    # langchain-openai drives the tests' model; langchain-community and langchain-postgres hold the histories the
    # benchmark compares (langchain-redis is left out: its history needs the RedisJSON and RediSearch modules).
    "langchain": [
        "langchain-core==1.8.3",
        "langchain-openai==1.7.4",
        "langchain-community==0.4.2",
        "langchain-postgres==0.0.19",
        # LangChain's own tests run under its blocking-call guard; the adapter's tests do too (tests/langchain).
        "blockbuster==1.5.29",
    ],
    # llama-index-llms-openai drives the tests' model and needs openai<3; the Redis chat store is the benchmark's.
    "llama-index": [
        "llama-index-core==0.14.25",
        "llama-index-llms-openai==0.8.3",
        "llama-index-storage-chat-store-redis==0.8.0",
        "openai==2.54.0",
    ],
    # langgraph-checkpoint-conformance: LangGraph's checkpointer suite, which tests/langgraph runs against
    # ChatkeepSaver; langchain-openai drives the runtime test's model; -sqlite and -postgres are the benchmark's
    # checkpointers (langgraph-checkpoint-redis is left out: its RedisSaver needs the RedisJSON and RediSearch modules).
    "langgraph": [
        "langgraph==1.2.22",
        "langgraph-checkpoint==4.3.2",
        "langgraph-checkpoint-conformance==0.0.2",
        "langchain-openai==1.7.4",
        "langgraph-checkpoint-sqlite==3.1.2",
        "langgraph-checkpoint-postgres==3.2.0",
    ],
    # agent-framework-openai: the OpenAIChatClient the tests drive; -redis: its RedisHistoryProvider, for the benchmark
    # (it caps redis-py below 7.2.1, so this session runs chatkeep-redis on redis-py 7.1).
    "agent-framework": [
        "agent-framework-core==1.23.0",
        "agent-framework-openai==1.17.0",
        "agent-framework-redis==1.0.0b261022",
    ],
    # [openai]: the OpenAIChatModel the tests drive against the local server. Pydantic AI ships no stores of its own
    # beyond InMemoryConversationStore, which the tests and the benchmark run beside the adapter.
    "pydantic-ai": ["pydantic-ai-slim[openai]==2.68.0"],
    # litellm: ADK's LiteLlm model class, which the runtime tests point at the local server; aiosqlite: the
    # SQLite driver of ADK's own DatabaseSessionService, which the benchmark compares (PostgreSQL: asyncpg).
    "adk": ["google-adk==2.13.0", "litellm==1.106.2", "aiosqlite==0.22.1"],
}


RELIABILITY_ROUNDS = 3  # how many times `nox -s reliability` runs the marked tests; `-- --rounds N` changes it
FAILOVER_ROUNDS = 3  # kill-and-recover rounds of each `nox -s failover` test; `-- --rounds N` changes it


def rounds_and_pytest_args(session: nox.Session, default: int) -> tuple[int, list[str]]:
    """Split a session's arguments into ``--rounds N`` (``default`` when absent) and everything else, for pytest."""
    parser = argparse.ArgumentParser(prog=f"nox -s {session.name} --", add_help=False, allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=default)
    options, pytest_args = parser.parse_known_args(session.posargs)
    if options.rounds < 1:
        session.error(f"--rounds must be 1 or more, not {options.rounds}")
    return options.rounds, pytest_args


def sync(session: nox.Session, *groups: str) -> None:
    """Install the locked workspace (every package, every extra) into the session's virtualenv."""
    args = ["uv", "sync", "--frozen", "--all-packages", "--all-extras", "--inexact"]
    for group in groups:
        args += ["--group", group]
    session.run_install(*args, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, silent=True)


def install_example(session: nox.Session, backend: str) -> None:
    """Install an example plugin from its folder, as its users would, after :func:`sync` (which keeps it: --inexact).

    ``--no-deps``: what it needs is the locked workspace, so nothing outside uv.lock comes in.
    """
    if backend in EXAMPLES:
        session.install("--no-deps", "-e", EXAMPLES[backend], silent=True)


@nox.session(python=PYTHON)
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """Run one backend's tests (and, for memory, the core and cross-package tests) against real services."""
    sync(session, "dev")
    install_example(session, backend)
    if backend == "sql-postgres" and "CHATKEEP_TEST_PGVECTOR_URL" not in os.environ:
        session.run("scripts/pgvector", "up", external=True)  # the search tests' PostgreSQL with pgvector
    paths, env = BACKENDS[backend]
    session.run(*PYTEST, *paths, *session.posargs, env={**env, "CHATKEEP_TEST_BACKEND": backend})


def install_framework(session: nox.Session, framework: str) -> None:
    """The locked workspace, then one framework's pinned packages (:data:`INTEROP`) over it."""
    sync(session, "dev")
    session.install(*INTEROP[framework], silent=True)


@nox.session(python=PYTHON)
@nox.parametrize("framework", list(INTEROP))
def interop(session: nox.Session, framework: str) -> None:
    """Run one framework adapter's tests with the framework's real package, on memory, SQLite, PostgreSQL, Redis."""
    install_framework(session, framework)
    migrate_shared_postgres(session)
    module = framework.replace("-", "_")
    session.run(*PYTEST, f"packages/interop/tests/{module}", *session.posargs, env={"CHATKEEP_TEST_BACKEND": framework})
    if framework in PEERS and not session.posargs:  # the framework's own tests too, in the same environment
        run_peers(session, framework, [])


# framework -> what running its own tests needs beyond its INTEROP packages (pip downloads their sdist).
PEERS: dict[str, list[str]] = {
    "openai-agents": ["pip"],
    "langchain": ["pip", "pytest-mock==3.14.0"],  # langchain-core's test conftest imports pytest_mock
}


@nox.session(python=PYTHON)
@nox.parametrize("framework", list(PEERS))
def interop_peers(session: nox.Session, framework: str) -> None:
    """Run the framework's own published history tests (its sdist's, at the pinned version) against the adapter.

    packages/interop/tests/peers downloads the sdist from PyPI, extracts only the test files it names into a
    temporary folder, and runs them on memory, SQLite, PostgreSQL and Redis with the adapter in place of the
    framework's own history class; the differences kept on purpose are strict expected failures (docs/frameworks).
    """
    install_framework(session, framework)
    migrate_shared_postgres(session)
    run_peers(session, framework, session.posargs)


def migrate_shared_postgres(session: nox.Session) -> None:
    """Bring chatkeep's tables in the shared PostgreSQL database to this checkout's schema revision.

    The adapter tests share the server's ``test`` database (a tenant per test), where an earlier chatkeep may
    have made the tables: a store refuses an older schema (SchemaVersionError) until it is migrated. An
    unreachable server (nothing accepts a connection on its port within a second) is left to the tests, which
    skip it or fail as CHATKEEP_REQUIRE_SERVICES says; a reachable one that fails to migrate fails the session.
    """
    where = urllib.parse.urlsplit(POSTGRES_URL)
    address = (where.hostname or "127.0.0.1", where.port or 5432)
    try:
        socket.create_connection(address, timeout=1.0).close()
    except OSError as exc:
        session.log(f"PostgreSQL at {address[0]}:{address[1]} is not reachable ({exc}); not migrating it")
        return
    session.run("chatkeep", "migrate", "--store", POSTGRES_URL, silent=True)


def run_peers(session: nox.Session, framework: str, args: list[str]) -> None:
    """The framework's own history tests against its adapter (``interop`` runs them after the adapter's tests)."""
    session.install(*PEERS[framework], silent=True)
    session.run("python", "-m", "peers", framework, *args, env={"PYTHONPATH": "packages/interop/tests"})


@nox.session(python=PYTHON)
@nox.parametrize("framework", list(INTEROP))
def interop_bench(session: nox.Session, framework: str) -> None:
    """Benchmark one adapter beside its framework's own history stores, measured in the same run."""
    install_framework(session, framework)
    session.run("python", "-m", "benchmarks", f"interop-{framework}", *session.posargs)


@nox.session(python=PYTHON)
def ui(session: nox.Session) -> None:
    """Test chatkeep ui: every route read-only, headers, token, escaping; then its pages in headless Chromium.

    The browser is Debian's (scripts/chromium installs it when missing), driven by Playwright pointed at it; no
    browser is downloaded. Screenshots go to $CHATKEEP_UI_SCREENSHOTS, by default .artifacts/ui-screenshots/ in the
    checkout (git-ignored), so that each CI run leaves them behind; docs/assets/ui holds copies.
    """
    sync(session, "dev", "ui")
    session.run("scripts/chromium", "install", external=True)
    shots = os.environ.get("CHATKEEP_UI_SCREENSHOTS") or os.path.abspath(".artifacts/ui-screenshots")
    env = {"CHATKEEP_TEST_BACKEND": "ui", "CHATKEEP_UI_SCREENSHOTS": shots}
    session.run(*PYTEST, "packages/core/tests_ui", *session.posargs, env=env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and the import-linter contracts (core's layers, plugins on public API)."""
    sync(session, "dev")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


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


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Run the benchmarks in benchmarks/: chatkeep beside the raw drivers, measured in the same run."""
    sync(session, "dev", "bench")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """Soak every shared backend under injected faults, then check its whole history (python -m soak --help).

    4 processes x 8 writers per backend append and read for 5 minutes (``-- --minutes N``) while proxy cuts,
    black holes, outages, restarts of private servers and SIGKILLs of writers are injected; the run fails
    when an acknowledged append was lost, duplicated, reordered or torn. PostgreSQL and MariaDB are the
    machine's (faulted only through a proxy); Redis and Azurite are private instances the run starts.
    """
    sync(session, "dev")
    session.run("scripts/azurite", "up", external=True)  # installs the Azurite binary the private instances run
    session.run("python", "-m", "soak", *session.posargs)


@nox.session(python=PYTHON)
def reliability(session: nox.Session) -> None:
    """Run the fault, recovery and concurrency tests (pytest -m reliability) of every backend, several rounds in a row.

    Each round runs every backend of the tests matrix the way the tests session does, so a flaky test shows up
    here before CI meets it. Every service must be up, the Redis Cluster and Azurite included: run
    scripts/redis-cluster up and scripts/azurite up first (./scripts/dev test does both before nox). An
    unreachable service is skipped, or fails the run with CHATKEEP_REQUIRE_SERVICES=1. In
    `nox -s reliability -- --rounds 10 -k outage`, --rounds (default 3) sets the number of rounds and
    everything else goes to pytest.
    """
    rounds, pytest_args = rounds_and_pytest_args(session, RELIABILITY_ROUNDS)
    sync(session, "dev")
    for backend in EXAMPLES:
        install_example(session, backend)
    # Only the backend's own target variable is set: one exported for another backend must not leak in.
    unset: dict[str, str | None] = {
        "CHATKEEP_TEST_SQL_URL": None,
        "CHATKEEP_TEST_REDIS_URL": None,
        "CHATKEEP_TEST_BLOB_CONNECTION_STRING": None,
    }
    # A -k or a path after -- may leave a backend with no test to run (pytest's exit code 5).
    success_codes = [0, 5] if pytest_args else [0]
    for round_ in range(1, rounds + 1):
        for backend, (paths, env) in BACKENDS.items():
            session.log(f"reliability round {round_} of {rounds}: {backend}")
            session.run(
                *PYTEST,
                "-m",
                "reliability",
                *paths,
                *pytest_args,
                env={**unset, **env, "CHATKEEP_TEST_BACKEND": backend},
                success_codes=success_codes,
            )


@nox.session(python=PYTHON)
def failover(session: nox.Session) -> None:
    """Kill a master of a private replicated Redis Cluster under 8 concurrent writers, several rounds per test.

    The tests (packages/redis/tests/test_failover.py) start their own cluster, 3 masters and a replica each, with
    `scripts/redis-cluster up --replicas` on free ports, and stop it at the end; the shared cluster is never
    touched, and no other service is needed. Each round SIGKILLs the master that owns the writers' sessions, with
    its replica in step or lagging, and lets the replica take over. With wait_replicas=1 every acknowledged append
    must survive; without it, the tests print how many acknowledged appends the failover lost (the figure in
    docs/backends/redis.md). The default run does one round only, wait_replicas=1 with a lagging replica. In
    `nox -s failover -- --rounds 5 -k lagging`, --rounds (default 3) sets the rounds and the rest goes to pytest.
    """
    rounds, pytest_args = rounds_and_pytest_args(session, FAILOVER_ROUNDS)
    sync(session, "dev")
    session.run(
        *PYTEST,
        "packages/redis/tests/test_failover.py",
        *pytest_args,
        env={
            "CHATKEEP_FAILOVER_ROUNDS": str(rounds),
            "CHATKEEP_TEST_REDIS_URL": None,
            "CHATKEEP_TEST_BACKEND": "redis-cluster",
        },
    )
