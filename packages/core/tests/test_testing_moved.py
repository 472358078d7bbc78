"""The deprecated chatkeep.core.testing path: the moved names still come through it, each with a warning."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

import chatkeep.testing
import chatkeep.testing.openai_server
import chatkeep.testing.scripted

MOVED = [
    ("chatkeep.core.testing", "chatkeep.testing"),
    ("chatkeep.core.testing.openai_server", "chatkeep.testing.openai_server"),
    ("chatkeep.core.testing.scripted", "chatkeep.testing.scripted"),
]


def test_old_kit_import_warns_and_names_the_new_one() -> None:
    with pytest.deprecated_call(match=r"use 'from chatkeep\.testing import HistoryStoreConformance'") as record:
        from chatkeep.core.testing import HistoryStoreConformance
    assert HistoryStoreConformance is chatkeep.testing.HistoryStoreConformance
    assert record[0].filename == __file__  # the warning points at the import that needs changing


def test_old_server_and_scripted_client_imports_warn() -> None:
    with pytest.deprecated_call(match=r"use 'from chatkeep\.testing\.openai_server import FakeOpenAIServer'"):
        from chatkeep.core.testing.openai_server import FakeOpenAIServer
    with pytest.deprecated_call(match=r"use 'from chatkeep\.testing\.scripted import ScriptedChatClient'"):
        from chatkeep.core.testing.scripted import ScriptedChatClient
    assert FakeOpenAIServer is chatkeep.testing.openai_server.FakeOpenAIServer
    assert ScriptedChatClient is chatkeep.testing.scripted.ScriptedChatClient


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_every_moved_name_comes_through_the_old_path(old: str, new: str) -> None:
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    assert sorted(old_module.__all__) == sorted(new_module.__all__)
    for name in old_module.__all__:
        with pytest.deprecated_call(match=f"{re.escape(old)} is deprecated"):
            assert getattr(old_module, name) is getattr(new_module, name)


def test_missing_distribution_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import chatkeep.core.testing.scripted as old_scripted

    monkeypatch.setitem(sys.modules, "chatkeep.testing", None)  # as if chatkeep-testing were not installed
    monkeypatch.delitem(sys.modules, "chatkeep.testing.scripted")
    with pytest.raises(ModuleNotFoundError, match=r"pip install chatkeep-testing"):
        old_scripted.ScriptedChatClient  # noqa: B018
