"""The import-linter contracts cover every module they should: core's private ones, each package, each layer.

``nox -s lint`` (lint-imports) enforces the contracts of pyproject.toml; these tests check the contracts
themselves, so that a private module added to core, or a distribution added to the workspace, fails here
(named) until the contracts list it, instead of going unguarded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - this project's machines run 3.11
    tomllib = pytest.importorskip("tomli")

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter, in the dev group")

WORKSPACE = Path(__file__).resolve().parents[1]
CORE = WORKSPACE / "packages" / "core" / "src" / "chatkeep" / "core"
PUBLIC_API = "backend plugins and the testing kit use only core's public API"


def importlinter() -> dict[str, Any]:
    settings: dict[str, Any] = tomllib.loads((WORKSPACE / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: dict[str, Any] = settings["tool"]["importlinter"]
    return contracts


def contract(name: str) -> dict[str, Any]:
    return next(c for c in importlinter()["contracts"] if c["name"] == name)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def core_private_modules() -> set[str]:
    """Every module and package of chatkeep.core whose own name is private, found on disk."""
    found = set()
    for path in CORE.rglob("*.py"):
        parts = path.relative_to(CORE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and private(parts[-1]):
            found.add(".".join(("chatkeep", "core", *parts)))
    return found


def test_every_private_module_of_core_is_forbidden_to_the_other_packages() -> None:
    private_modules = core_private_modules()
    # The ones this contract once forgot, and a private module of each subpackage: the walk finds them.
    assert {"chatkeep.core.backend._damage", "chatkeep.core.backend._loops", "chatkeep.core._recall"} <= private_modules
    assert {"chatkeep.core.cli._app", "chatkeep.core.openai._base"} <= private_modules
    graph = grimp.build_graph("chatkeep.core", cache_dir=None)
    forbidden: set[str] = set()
    for expression in contract(PUBLIC_API)["forbidden_modules"]:
        matched = graph.find_matching_modules(expression) if "*" in expression else {expression}
        # Forbidden contracts treat each module as a package (as_packages): its descendants are forbidden too.
        forbidden |= matched | {d for module in matched for d in graph.find_descendants(module)}
    missing = sorted(private_modules - forbidden)
    assert not missing, f"add to forbidden_modules of {PUBLIC_API!r} in pyproject.toml: {missing}"
    public = sorted(m for m in forbidden if not any(private(part) for part in m.split(".")[2:]))
    assert not public, f"public modules are core's API, for every package: {public}"


def test_every_package_of_the_workspace_is_in_the_contracts() -> None:
    folders = WORKSPACE.glob("packages/*/src/chatkeep/*")
    packages = {f"chatkeep.{p.name}" for p in folders if p.is_dir() and not p.name.startswith(("_", "."))}
    assert "chatkeep.interop" in packages
    assert set(importlinter()["root_packages"]) == packages
    assert set(contract(PUBLIC_API)["source_modules"]) == packages - {"chatkeep.core"}


def test_every_module_of_core_has_its_layer() -> None:
    # A module left out of the layers contract could import any other: each one has its place.
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    layered = {name.strip() for layer in contract("chatkeep.core layers")["layers"] for name in layer.split("|")}
    assert {"_recall", "backend", "cli"} <= modules
    assert modules == layered
