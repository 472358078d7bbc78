"""The ``chatkeep`` command end to end on each database under test (see conftest.py), through the kit."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import make_url

from chatkeep.core import HistoryStore, SessionKey
from chatkeep.sql._schema import key_hash
from chatkeep.testing import CLIConformance
from chatkeep.testing.faults import free_port


class TestSQLCommandLine(CLIConformance):
    multi_process = True

    @pytest.fixture
    def store_url(self, sql_target: Any) -> str:
        self.sql_target = sql_target  # for damage_session_document
        return str(sql_target.url)

    @pytest.fixture
    def unreachable_url(self, sql_target: Any) -> str | None:
        if sql_target.family == "sqlite":
            return None  # a file, no server
        # The same database URL on a port where nothing listens.
        url = make_url(sql_target.server_url).set(port=free_port())
        return url.render_as_string(hide_password=False) + "?connect_timeout=5"

    async def damage_session_document(self, store: HistoryStore, key: SessionKey) -> None:
        target = self.sql_target
        rows = target.execute_in(
            target.name,
            [
                (
                    "UPDATE chatkeep_sessions SET document = ? WHERE key_hash = ?",
                    ('{"type": "sess', key_hash(key.tenant, key.session_id)),
                ),
                ("SELECT document FROM chatkeep_sessions WHERE key_hash = ?", (key_hash(key.tenant, key.session_id),)),
            ],
        )
        assert rows == [('{"type": "sess',)]
