"""The ``chatkeep`` command end to end on the JSON-files backend, through chatkeep's kit."""

from __future__ import annotations

import pathlib
from urllib.parse import quote

import pytest

from chatkeep.testing import CLIConformance


class TestJsonFilesCommandLine(CLIConformance):
    multi_process = True  # a chatkeep child process opens the same folder

    @pytest.fixture
    def store_url(self, tmp_path: pathlib.Path) -> str:
        return "jsonfiles://" + quote(str(tmp_path / "store"))

    # No unreachable_url: files have no server.
