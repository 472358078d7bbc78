"""The table of known backends (``chatkeep.core._known_backends``) against what the workspace really registers.

The backends come from real entry-point discovery (a fresh :class:`PluginRegistry` reading the ``chatkeep``
group of the installed distributions); the extras come from chatkeep-core's installed metadata. The table
and the plugins must agree both ways, so a scheme added to a backend without the table, or a table entry
no workspace backend registers, fails here.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from chatkeep.core._known_backends import KNOWN_BACKENDS, KNOWN_SCHEMES
from chatkeep.core.plugins import ENTRY_POINT_GROUP, BackendInfo, PluginRegistry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - this project's machines run 3.11
    tomllib = pytest.importorskip("tomli")

WORKSPACE = Path(__file__).resolve().parents[1]
CORE = "chatkeep-core"


def workspace_distributions() -> set[str]:
    """The distributions under packages/, by canonical name."""
    names = set()
    for pyproject in (WORKSPACE / "packages").glob("*/pyproject.toml"):
        names.add(canonicalize_name(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]))
    return names


def core_extras() -> set[str]:
    return set(metadata.metadata(CORE).get_all("Provides-Extra") or [])


def distributions_of_extra(extra: str) -> set[str]:
    """What ``pip install "chatkeep-core[extra]"`` brings, following chatkeep-core's references to its own extras."""
    requirements = [Requirement(line) for line in metadata.requires(CORE) or []]
    found: set[str] = set()
    todo, seen = [extra], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for req in requirements:
            if req.marker is None or not req.marker.evaluate({"extra": current}):
                continue
            if canonicalize_name(req.name) == CORE:
                todo.extend(req.extras)
            else:
                found.add(canonicalize_name(req.name))
    return found


@pytest.fixture(scope="module")
def workspace_backends() -> list[BackendInfo]:
    """The backends the installed workspace distributions register, found through their entry points."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("CHATKEEP_PLUGINS", "CHATKEEP_DISABLE_PLUGIN_AUTOLOAD"):
            patch.delenv(name, raising=False)
        registry = PluginRegistry()
        backends = registry.backends()
        failures = registry.failures()
    ours = workspace_distributions()
    with_plugins = {
        canonicalize_name(ep.dist.metadata["Name"])
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and canonicalize_name(ep.dist.metadata["Name"]) in ours
    }
    found = [b for b in backends if canonicalize_name(b.distribution) in ours]
    # Every workspace plugin must load, or the comparison below would miss its schemes.
    assert {canonicalize_name(b.distribution) for b in found} == with_plugins, failures
    assert with_plugins, "no workspace distribution with a chatkeep plugin is installed"
    return found


def mismatches(
    backends: list[BackendInfo],
    schemes: dict[str, tuple[str, str, str]],
    by_name: dict[str, tuple[str, str]],
    extras: set[str],
) -> list[str]:
    """How the tables disagree with the registered backends and the core's extras (empty: they agree)."""
    problems = []
    registered = {scheme.lower(): backend for backend in backends for scheme in backend.schemes}
    for scheme, backend in sorted(registered.items()):
        if scheme not in schemes:
            problems.append(f"{scheme}:// of the {backend.name!r} backend ({backend.distribution}) is not in the table")
            continue
        name, extra, _ = schemes[scheme]
        if name != backend.name:
            problems.append(f"{scheme}:// is the {backend.name!r} backend, but the table says {name!r}")
        if extra not in extras:
            problems.append(f"{scheme}:// names the extra {extra!r}, which chatkeep-core does not declare")
        elif canonicalize_name(backend.distribution) not in distributions_of_extra(extra):
            problems.append(f"the extra {extra!r} named for {scheme}:// does not install {backend.distribution}")
    for scheme, (name, _, _) in sorted(schemes.items()):
        if scheme not in registered:
            problems.append(f"{scheme}:// ({name!r}) is in the table, but no workspace backend registers it")
    installed = {backend.name: backend for backend in backends}
    for name, backend in sorted(installed.items()):
        if name not in by_name:
            problems.append(f"the {name!r} backend ({backend.distribution}) is not in the table of backend names")
        elif by_name[name][0] != backend.spec.extra:
            problems.append(
                f"the {name!r} backend's extra is {backend.spec.extra!r}, the table says {by_name[name][0]!r}"
            )
        elif by_name[name][0] not in extras:
            problems.append(f"the {name!r} backend names the extra {by_name[name][0]!r}, which chatkeep-core lacks")
    problems.extend(
        f"the backend name {name!r} is in the table, but no workspace distribution registers it"
        for name in sorted(set(by_name) - set(installed))
    )
    return problems


def test_the_known_backends_are_exactly_what_the_workspace_registers(workspace_backends: list[BackendInfo]) -> None:
    assert mismatches(workspace_backends, KNOWN_SCHEMES, KNOWN_BACKENDS, core_extras()) == []


def test_a_scheme_missing_from_the_table_is_caught(workspace_backends: list[BackendInfo]) -> None:
    schemes = {k: v for k, v in KNOWN_SCHEMES.items() if k != "rediss"}

    assert mismatches(workspace_backends, schemes, KNOWN_BACKENDS, core_extras()) == [
        "rediss:// of the 'redis' backend (chatkeep-redis) is not in the table"
    ]


def test_a_scheme_no_workspace_backend_registers_is_caught(workspace_backends: list[BackendInfo]) -> None:
    schemes = {**KNOWN_SCHEMES, "s3": ("s3", "s3", "Amazon S3")}
    by_name = {**KNOWN_BACKENDS, "s3": ("s3", "Amazon S3")}

    assert mismatches(workspace_backends, schemes, by_name, core_extras()) == [
        "s3:// ('s3') is in the table, but no workspace backend registers it",
        "the backend name 's3' is in the table, but no workspace distribution registers it",
    ]


def test_an_extra_that_does_not_install_the_backend_is_caught(workspace_backends: list[BackendInfo]) -> None:
    schemes = {**KNOWN_SCHEMES, "sqlite": ("sql", "memory", "SQLite"), "mysql": ("sql", "mysqlclient", "MySQL")}

    assert mismatches(workspace_backends, schemes, KNOWN_BACKENDS, core_extras()) == [
        "mysql:// names the extra 'mysqlclient', which chatkeep-core does not declare",
        "the extra 'memory' named for sqlite:// does not install chatkeep-sql",
    ]
