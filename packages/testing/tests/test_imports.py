"""What importing chatkeep.testing costs: the server and the scripted client without pytest, the kit on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import chatkeep.testing
import chatkeep.testing.conformance


def test_server_and_scripted_client_do_not_import_pytest() -> None:
    code = (
        "import sys, chatkeep.testing, chatkeep.testing.openai_server, chatkeep.testing.scripted; "
        "assert 'pytest' not in sys.modules, 'pytest was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_kit_names_are_re_exported_from_chatkeep_testing() -> None:
    assert sorted(chatkeep.testing.__all__) == sorted(chatkeep.testing.conformance.__all__)
    for name in chatkeep.testing.__all__:
        assert getattr(chatkeep.testing, name) is getattr(chatkeep.testing.conformance, name)
    from chatkeep.testing import HistoryStoreConformance

    assert HistoryStoreConformance is chatkeep.testing.conformance.HistoryStoreConformance


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"'chatkeep\.testing' has no attribute 'HistoryStoreConformanse'"):
        chatkeep.testing.HistoryStoreConformanse  # noqa: B018
