"""The peers' tests chatkeep's adapters fail on purpose, each with its reason (docs/frameworks/*.md explain them).

Each entry is a test's id without its parameters (all of its parameters fail alike) and the backends it fails
on (``None``: every backend). They are marked ``xfail(strict=True)``: a test that starts passing fails the run,
so the list cannot outlive the difference it records.
"""

from __future__ import annotations

import os

import pytest

#: the backend the current peer run tests (``python -m peers`` sets it for each run).
BACKEND = os.environ.get("CHATKEEP_PEER_BACKEND", "memory")

_SQLITE_INSIDE = (
    "tests SQLiteSession's own implementation (its per-thread sqlite3 connections, file locks or tables, "
    "reached through private attributes or sqlite3), not the Session protocol; ChatkeepSession has none of them"
)
_SQLITE_ONLY_HOOK = (
    "the SDK gives this guarantee to its own SQLiteSession only (an isinstance check and private hooks, "
    "_pop_item_with_validation, _get_compaction_snapshot); every other session, ChatkeepSession included, takes "
    "the SDK's documented general path (docs/frameworks/openai-agents.md, 'The SDK's own tests')"
)
_CORRUPT_ROWS = (
    "writes corrupt rows through SQLiteSession's private connection, which SQLiteSession then skips silently; "
    "chatkeep raises MessageFormatError for a damaged record instead of dropping it (docs/frameworks/openai-agents.md)"
)
_WINDOW = (
    "the window rule: get_items(limit=n) never starts with a tool output whose call fell outside the window, "
    "where SQLiteSession returns the raw tail (docs/frameworks/openai-agents.md, 'The window rule')"
)
_CLOSE = (
    "ChatkeepSession.close() is a coroutine (it closes a store that may hold server connections), where "
    "SQLiteSession.close() is a plain method; the test calls it without await"
)
_NEGATIVE_LIMIT = (
    "a negative limit raises InvalidArgumentError, where SQLiteSession reads the whole history "
    "(docs/frameworks/openai-agents.md)"
)
_SESSION = "tests/memory/test_session.py::"
_ENCRYPT = "tests/extensions/memory/test_encrypt_session.py::"

#: framework -> test id without parameters -> (reason, the backends it fails on or None for all).
EXPECTED: dict[str, dict[str, tuple[str, frozenset[str] | None]]] = {
    "openai-agents": {
        **{
            _SESSION + name: (_SQLITE_INSIDE, None)
            for name in (
                "test_sqlite_session_close_closes_worker_thread_connections",
                "test_sqlite_session_reaps_connections_from_exited_worker_threads",
                "test_sqlite_session_closes_retired_connections_before_the_next_allocation",
                "test_sqlite_session_keeps_connections_of_live_worker_threads",
                "test_sqlite_session_file_lock_is_shared_across_instances",
                "test_sqlite_session_failed_add_items_releases_write_lock",
                "test_sqlite_session_failed_clear_session_rolls_back",
                "test_sqlite_session_failed_pop_item_releases_write_lock",
                "test_sqlite_session_rollback_failure_evicts_connection",
                "test_sqlite_session_close_retries_quarantined_connection",
                "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome",
            )
        },
        **{
            _SESSION + name: (_CORRUPT_ROWS, None)
            for name in (
                "test_sqlite_session_pop_item_skips_corrupt_most_recent",
                "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows",
                "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows",
                "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows",
            )
        },
        _SESSION + "test_sqlite_session_closed_rejects_empty_add_items": (_CLOSE, None),
        "tests/memory/test_session_limit.py::test_session_limit_drops_unmatched_history_function_call_output": (
            _WINDOW,
            None,
        ),
        **{
            _ENCRYPT + name: (_SQLITE_ONLY_HOOK, None)
            for name in (
                "test_encrypted_compaction_skips_unencrypted_stored_history",
                "test_encrypted_pop_wrong_key_preserves_recoverable_history",
                "test_encrypted_pop_rechecks_authentication_after_expired_tail",
                "test_encrypted_pop_authentication_is_atomic_with_concurrent_mutations",
                "test_encrypted_pop_wrong_key_preserves_row_identity",
                "test_encrypted_pop_cancellation_waits_for_authentication_rollback",
            )
        },
        _ENCRYPT + "test_encrypted_session_scan_budget_rejects_negative_limit_before_read": (_NEGATIVE_LIMIT, None),
    },
    # None: the exemption of asyncpg's file lookups from LangChain's guard is documented instead (peer_langchain.py).
    "langchain": {},
}


def mark_expected(framework: str, items: list[pytest.Item]) -> None:
    """Mark the items :data:`EXPECTED` lists for ``framework`` on this run's backend as strict expected failures."""
    for item in items:
        expected = EXPECTED[framework].get(item.nodeid.split("[")[0])
        if expected is not None and (expected[1] is None or BACKEND in expected[1]):
            item.add_marker(pytest.mark.xfail(reason=expected[0], strict=True))
