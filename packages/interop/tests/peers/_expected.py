"""The peers' tests chatkeep's adapters fail on purpose, each with its reason (docs/frameworks/*.md explain them).

Each entry is a test's id, without its parameters when all of them fail alike or with them (``name[param]``)
when only some do, and the backends it fails on (``None``: every backend). They are marked ``xfail(strict=True)``:
a test that starts passing fails the run, so the list cannot outlive the difference it records. The tests in
:data:`NOT_RUN` are skipped with their reason: run against an adapter, they would wait forever. Those failing for
a reason in :data:`STORE_INDEPENDENT` fail alike on every store, so they run on memory only (skipped elsewhere).
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
_ADVANCED_INSIDE = (
    "tests AdvancedSQLiteSession's own SQLite implementation (its message_structure, turn_usage, "
    "branch_reservations and clear-generation tables, their ownership, custom table names, rollbacks and "
    "connections), read or changed through sqlite3 or private attributes; ChatkeepSession keeps none of them: a "
    "branch is a chatkeep fork and a turn's usage a record in its history (docs/frameworks/openai-agents.md)"
)
_ADVANCED_LOGGER = (
    "checks what AdvancedSQLiteSession logs through its logger= argument (a Mock logger, or a private method patched "
    "to fail); ChatkeepSession takes no logger: chatkeep reports through OpenTelemetry and raises its errors"
)
_RESERVED_NAMES = (
    "a deleted branch's name can be used again, its chatkeep session being gone; AdvancedSQLiteSession reserves "
    "every name a session ever used (docs/frameworks/openai-agents.md, 'Branches and usage per turn')"
)
_EXTERNAL_CLEAR = (
    "the current branch is kept by each session object, so one object does not see another's clear_session until "
    "it switches branches; AdvancedSQLiteSession keeps a clear generation in its SQLite file for that "
    "(docs/frameworks/openai-agents.md, 'Branches and usage per turn')"
)
_ADVANCED_WORKERS = (
    "synchronizes with AdvancedSQLiteSession's private worker functions (asyncio.to_thread patched in its module, "
    "then gates and barriers) or with its own SQLite session in other processes; ChatkeepSession never calls them, "
    "so the test would wait forever"
)
_SESSION = "tests/memory/test_session.py::"
_ENCRYPT = "tests/extensions/memory/test_encrypt_session.py::"
_ADVANCED = "tests/extensions/memory/test_advanced_sqlite_session.py::"

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
        **{
            _ADVANCED + name: (_ADVANCED_INSIDE, None)
            for name in (
                "test_advanced_session_respects_custom_table_names",
                "test_add_items_rollback_failure_invalidates_connection",
                "test_structure_initialization_failure_invalidates_connection",
                "test_tool_usage_reads_legacy_shell_and_patch_names",
                "test_failed_branch_reservation_rolls_back_and_allows_retry",
                "test_branch_reservations_migrate_existing_populated_branches",
                "test_legacy_branch_ids_are_backfilled_before_destructive_operations",
                "test_legacy_destructive_noops_leave_database_unlocked",
                "test_delete_branch_removes_branch_only_messages",
                "test_delete_branch_keeps_messages_still_referenced_by_another_branch",
                "test_orphan_cleanup_uses_set_based_delete_for_many_messages",
                "test_failed_usage_write_rolls_back_cached_connection",
                "test_concurrent_add_items_preserves_message_structure_for_file_db",
                "test_clear_session_removes_structure_and_usage_metadata",
                "test_pop_item_removes_its_structure_row",
                "test_pop_item_removes_turn_usage_only_when_turn_emptied",
                "test_pop_item_respects_current_branch_and_keeps_shared_messages",
                "test_pop_item_deletes_shared_copied_message_only_when_unreferenced",
                "test_store_run_usage_skips_when_current_branch_has_no_turn",
                "test_clear_session_resets_current_branch_to_main",
                "test_default_read_does_not_initialize_clear_generation_table",
                "test_pop_item_rolls_back_on_failure_after_earlier_delete",
                "test_clear_session_rolls_back_on_failure_after_earlier_delete",
                "test_structure_tables_reject_a_second_base_table_pair",
                "test_structure_tables_reject_changed_sessions_with_shared_messages",
                "test_structure_tables_reject_changed_messages_with_shared_sessions",
                "test_identifier_resolution_leaves_connection_authorized",
                "test_structure_tables_reject_distinct_non_ascii_identifiers",
                "test_no_create_session_rejects_a_database_without_an_owner",
                "test_no_create_session_rejects_owner_metadata_without_base_tables",
                "test_structure_tables_reject_an_ownerless_layout",
                "test_structure_tables_reject_malformed_owner_layouts",
            )
        },
        _ADVANCED + "test_create_branch_logging_respects_model_data_policy[False]": (_ADVANCED_LOGGER, None),
        _ADVANCED + "test_usage_tracking_failure_identity_follows_model_data_policy": (_ADVANCED_LOGGER, None),
        _ADVANCED + "test_branch_ids_remain_reserved_after_delete_and_clear": (_RESERVED_NAMES, None),
        _ADVANCED + "test_get_items_limit_skips_corrupt_newest_rows": (_CORRUPT_ROWS, None),
        _ADVANCED + "test_advanced_sqlite_session_closed_rejects_empty_add_items": (_CLOSE, None),
        **{
            _ADVANCED + name: (_EXTERNAL_CLEAR, None)
            for name in (
                "test_external_clear_resets_stale_branch_before_next_write",
                "test_external_clear_resets_stale_branch_before_pop",
                "test_external_clear_resets_stale_branch_before_default_reads",
            )
        },
    },
    # None: the exemption of asyncpg's file lookups from LangChain's guard is documented instead (peer_langchain.py).
    "langchain": {},
}


#: Reasons that hold whatever the store: a test failing for one runs on memory only (where it is a strict expected
#: failure) and is skipped on the other backends, which it would only slow down.
STORE_INDEPENDENT = frozenset({_ADVANCED_INSIDE, _ADVANCED_LOGGER})

#: framework -> test id without parameters -> why it is skipped (it would wait forever against an adapter).
NOT_RUN: dict[str, dict[str, str]] = {
    "openai-agents": {
        _ADVANCED + name: _ADVANCED_WORKERS
        for name in (
            "test_post_commit_cancellation_propagates_after_known_mutation_outcome",
            "test_auxiliary_mutation_cancellation_waits_for_commit",
            "test_branch_allocation_is_serialized_across_processes",
            "test_pop_item_uses_branch_snapshot_when_branch_switches_concurrently",
            "test_pop_item_claim_is_unique_across_processes",
            "test_stale_switch_after_clear_does_not_repoint_to_deleted_branch",
            "test_stale_create_branch_after_clear_does_not_repoint",
            "test_clear_before_branch_transaction_prevents_stale_reservation",
            "test_store_run_usage_waits_for_database_lock_off_event_loop",
            "test_store_run_usage_cancellation_during_capture_waits_for_commit",
            "test_store_run_usage_keeps_target_while_capture_is_waiting",
            "test_store_run_usage_keeps_turn_when_history_changes_during_capture",
            "test_add_captures_coherent_branch_after_clear_publication",
            "test_queued_add_keeps_selected_branch",
            "test_queued_append_cannot_resurrect_deleted_branch",
            "test_queued_turn_mutation_releases_later_usage_capture",
            "test_turn_ordering_survives_reuse_on_another_event_loop",
            "test_stale_store_run_usage_skipped_when_turn_removed_by_pop",
            "test_stale_store_run_usage_not_recorded_against_reused_turn_number",
            "test_store_run_usage_survives_unrelated_branch_deletion",
            "test_switch_validation_cancellation_waits_for_generation_commit",
            "test_concurrent_structure_table_claims_leave_one_coherent_owner",
        )
    },
    "langchain": {},
}


def mark_expected(framework: str, items: list[pytest.Item]) -> None:
    """Mark the items :data:`EXPECTED` lists for ``framework`` on this run's backend as strict expected failures
    (an entry with parameters first, then the test's), and skip those :data:`NOT_RUN` lists."""
    for item in items:
        name = item.nodeid.split("[")[0]
        not_run = NOT_RUN[framework].get(name)
        if not_run is not None:
            item.add_marker(pytest.mark.skip(reason=not_run))
            continue
        expected = EXPECTED[framework].get(item.nodeid, EXPECTED[framework].get(name))
        if expected is not None and expected[0] in STORE_INDEPENDENT and BACKEND != "memory":
            item.add_marker(pytest.mark.skip(reason=f"{expected[0]}; it fails alike on every store: runs on memory"))
        elif expected is not None and (expected[1] is None or BACKEND in expected[1]):
            item.add_marker(pytest.mark.xfail(reason=expected[0], strict=True))
