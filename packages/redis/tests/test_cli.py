"""The ``chatkeep`` command end to end on standalone Redis and on the cluster, through the kit."""

from __future__ import annotations

import pytest

from chatkeep.testing import CLIConformance
from chatkeep.testing.faults import free_port


class TestRedisCommandLine(CLIConformance):
    multi_process = True

    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url

    @pytest.fixture
    def unreachable_url(self, redis_target: str) -> str:
        # The same kind of server (standalone or cluster) on a port where nothing listens.
        scheme = redis_target.split("://", 1)[0]
        return f"{scheme}://127.0.0.1:{free_port()}" + ("" if scheme == "redis+cluster" else "/0")
