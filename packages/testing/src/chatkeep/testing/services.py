"""The one rule for a test whose service is missing: skip with the reason, or fail when CI requires services.

``CHATKEEP_REQUIRE_SERVICES=1`` (set by ``.ci/run``) turns every such skip into a failure, so a service that
CI forgot to start cannot hide as skipped tests. This module imports pytest.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["missing_service", "services_required"]


def services_required() -> bool:
    """Whether ``CHATKEEP_REQUIRE_SERVICES`` asks for every service to be there."""
    return os.environ.get("CHATKEEP_REQUIRE_SERVICES", "").strip().lower() in ("1", "true", "yes")


def missing_service(problem: str) -> NoReturn:
    """Skip the test because of ``problem`` (what is missing and how to start it), or fail it in CI."""
    if services_required():
        pytest.fail(f"{problem}; CHATKEEP_REQUIRE_SERVICES is set, so this fails instead of skipping")
    pytest.skip(problem)
