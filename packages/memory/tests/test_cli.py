"""The ``chatkeep`` command end to end on memory://, through the kit (in this process: memory has no server)."""

from __future__ import annotations

import uuid

import pytest

from chatkeep.testing import CLIConformance


class TestMemoryCommandLine(CLIConformance):
    multi_process = False  # the data lives in this process: the killed-copy test skips, saying so

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://cli-kit-{uuid.uuid4().hex}"
