"""The ``chatkeep`` command end to end on each database under test (see conftest.py), through the kit."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import make_url

from chatkeep.testing import CLIConformance
from chatkeep.testing.faults import free_port


class TestSQLCommandLine(CLIConformance):
    multi_process = True

    @pytest.fixture
    def store_url(self, sql_target: Any) -> str:
        return str(sql_target.url)

    @pytest.fixture
    def unreachable_url(self, sql_target: Any) -> str | None:
        if sql_target.family == "sqlite":
            return None  # a file, no server
        # The same database URL on a port where nothing listens.
        url = make_url(sql_target.server_url).set(port=free_port())
        return url.render_as_string(hide_password=False) + "?connect_timeout=5"
