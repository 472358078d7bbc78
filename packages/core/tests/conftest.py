"""Shared fixtures for chatkeep-core's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chatkeep.testing.openai_server import FakeOpenAIServer


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """A running FakeOpenAIServer on loopback, stopped after the test."""
    with FakeOpenAIServer() as server:
        yield server
