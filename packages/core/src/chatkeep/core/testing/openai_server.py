"""Deprecated: moved to :mod:`chatkeep.testing.openai_server` (see :mod:`chatkeep.core.testing`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chatkeep.core.testing import _moved

if TYPE_CHECKING:
    from chatkeep.testing.openai_server import *  # noqa: F403


def __getattr__(name: str) -> Any:
    return _moved(__name__, "chatkeep.testing.openai_server", name)
