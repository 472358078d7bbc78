"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

import pytest


@pytest.fixture
def install_hint() -> Callable[[str], str]:
    """What an error offers for a known backend: the pip command once its extra is released, else a plain note."""
    released = set(metadata.metadata("chatkeep-core").get_all("Provides-Extra") or [])

    def hint(extra: str) -> str:
        return f'pip install "chatkeep-core[{extra}]"' if extra in released else "which is not released yet"

    return hint
