"""The contract is enforced once, in ``HistoryStore``: backends implement hooks and never override its checks."""

from __future__ import annotations

import inspect
import re
import uuid
from pathlib import Path

import pytest

import chatkeep.core
import chatkeep.core.backend
from chatkeep.blob import BlobHistoryStore
from chatkeep.core import HistoryStore
from chatkeep.core.encryption import EncryptedStore
from chatkeep.memory import MemoryHistoryStore
from chatkeep.redis import RedisHistoryStore
from chatkeep.sql import SQLHistoryStore

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = [MemoryHistoryStore, SQLHistoryStore, RedisHistoryStore, BlobHistoryStore, EncryptedStore]
CONTRACT = [
    name
    for name, member in vars(HistoryStore).items()
    if (not name.startswith("_") and inspect.iscoroutinefunction(member)) or inspect.isasyncgenfunction(member)
]


def test_the_contract_is_the_public_coroutine_methods() -> None:
    assert set(CONTRACT) >= {"append", "load", "iter_messages", "save_session", "prune", "delete_tenant", "close"}


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
def test_no_backend_overrides_a_contract_method(backend: type[HistoryStore]) -> None:
    overridden = [
        name
        for klass in backend.__mro__[: backend.__mro__.index(HistoryStore)]
        for name in CONTRACT
        if name in vars(klass)
    ]
    assert overridden == [], f"{backend.__name__} overrides {overridden}: implement the protected hooks instead"


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
def test_every_bundled_backend_reads_session_info_by_key(backend: type[HistoryStore]) -> None:
    # The base's default walks the tenant's listing (for plugins written before session_info): O(sessions).
    assert backend._session_info is not HistoryStore._session_info, f"{backend.__name__} walks the listing"


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
def test_every_bundled_backend_reads_a_range_natively(backend: type[HistoryStore]) -> None:
    # The base's default streams the history up to the range's end (for plugins written before ranges): O(before).
    assert backend._load_before is not HistoryStore._load_before, f"{backend.__name__} streams up to the range"


def test_no_backend_source_calls_a_check_by_hand() -> None:
    hand_checks = re.compile(r"_check_usable\(|_check_session_tenant\(|check_tenant\(|SessionKey\([^)]*\"-\"\)")
    sources = [*ROOT.glob("packages/*/src/chatkeep/*/**/*.py")]
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources
        if "core/backend/" not in path.as_posix()
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if hand_checks.search(line)
    ]
    assert len(sources) > 30
    assert offenders == []


def test_chatkeep_core_exports_only_user_facing_names() -> None:
    plumbing = {"encode_records", "decode_records", "cutoff_time", "ttl_seconds", "validate_id", "redact_url"}
    plumbing |= {"BackendSpec", "hookimpl", "StoreSettings", "TTLStoreSettings", "DEFAULT_MAX_MESSAGE_BYTES"}
    assert plumbing.isdisjoint(chatkeep.core.__all__)
    assert {"encode_records", "decode_records", "BackendSpec", "hookimpl", "StoreSettings"} <= set(
        chatkeep.core.backend.__all__
    )
    for name in chatkeep.core.__all__:
        assert getattr(chatkeep.core, name) is not None


class _StoreWithoutPop(MemoryHistoryStore):
    """A backend written before ``pop`` existed: it never overrides ``_pop``."""

    _pop = HistoryStore._pop


async def test_a_backend_without_pop_refuses_it_clearly_and_keeps_its_data() -> None:
    store = _StoreWithoutPop(f"memory://pop-legacy-{uuid.uuid4().hex}")
    key = chatkeep.core.SessionKey("t", "s")
    await store.append(key, [chatkeep.core.Message(role="user", text="kept")])
    with pytest.raises(chatkeep.core.UnsupportedOperationError, match="upgrade the plugin") as raised:
        await store.pop(key)
    assert isinstance(raised.value, NotImplementedError)
    assert "_StoreWithoutPop does not support pop()" in str(raised.value)
    assert await store.count(key) == 1
    with pytest.raises(chatkeep.core.InvalidSessionKeyError):
        await store.pop(("t", "s"))  # type: ignore[arg-type]
    await store.close()
    with pytest.raises(chatkeep.core.StoreClosedError):
        await store.pop(key)
