"""The pieces every adapter shares: which store it writes to, and how a framework's item is kept exactly."""

from __future__ import annotations

import datetime

import pytest

from chatkeep.core import InvalidSessionKeyError, Message, MessageFormatError, StoreConfigurationError, open_store
from chatkeep.interop import _binding
from chatkeep.interop._binding import StoreBinding, SyncStoreBinding
from chatkeep.interop._envelope import ENVELOPE_KEY, unwrap, wrap


async def test_a_url_opens_a_store_the_binding_closes() -> None:
    binding = StoreBinding("memory://")
    assert binding.owns_store
    await binding.aclose()
    assert binding.store.closed


async def test_a_store_object_stays_open_for_its_owner() -> None:
    store = open_store("memory://")
    binding = StoreBinding(store)
    await binding.aclose()
    assert not store.closed
    await store.close()


def test_store_options_with_a_store_object_are_refused() -> None:
    with pytest.raises(StoreConfigurationError, match="only apply to a store opened from a URL"):
        StoreBinding(open_store("memory://"), store_options={"ttl": 60})


def test_a_store_of_the_wrong_type_says_what_is_accepted() -> None:
    with pytest.raises(StoreConfigurationError, match="HistoryStore, a store URL"):
        StoreBinding(42)  # type: ignore[arg-type]


def test_a_bad_session_id_is_refused() -> None:
    with pytest.raises(InvalidSessionKeyError):
        StoreBinding.key("")


async def test_an_item_round_trips_through_a_store_field_for_field() -> None:
    item = {"type": "message", "role": "user", "content": "héllo 🌍", "future_field": {"nested": [1, None, 2.5]}}
    message = wrap(item, format="demo", role="user", text="héllo 🌍")
    async with open_store("memory://") as store:
        key = StoreBinding.key("s1")
        await store.append(key, [message])
        (loaded,) = await store.load(key)
    assert unwrap(loaded, format="demo") == item
    assert loaded.text == "héllo 🌍"


def test_a_plain_chatkeep_message_holds_no_item() -> None:
    assert unwrap(Message(role="user", text="hi"), format="demo") is None


def test_an_item_of_another_framework_is_named() -> None:
    message = wrap({"a": 1}, format="langchain", role="user")
    with pytest.raises(MessageFormatError, match="'langchain' item, not 'demo'"):
        unwrap(message, format="demo")


def test_a_malformed_envelope_is_reported() -> None:
    message = Message(role="user", additional_properties={ENVELOPE_KEY: "oops"})
    with pytest.raises(MessageFormatError, match="malformed"):
        unwrap(message, format="demo")


def test_an_item_holding_a_set_is_refused_with_where_it_is() -> None:
    with pytest.raises(MessageFormatError, match=r"not JSON at item\['nested'\]\[0\]\['tags'\]"):
        wrap({"nested": [{"tags": {"a", "b"}}]}, format="demo", role="user")


def test_a_value_that_is_not_json_is_refused_with_where_it_is() -> None:
    item = {"content": [{"type": "text", "text": "ok"}, {"when": datetime.datetime(2026, 1, 1)}], "raw": b"x"}
    with pytest.raises(MessageFormatError, match=r"not JSON at item\['content'\]\[1\]\['when'\], item\['raw'\]"):
        wrap(item, format="demo", role="user")


def test_a_sync_binding_opens_a_view_of_a_url_and_closes_it() -> None:
    binding = SyncStoreBinding("memory://")
    assert binding.owns_view
    key = binding.key("s1", "t1")
    binding.view.append(key, [Message(role="user", text="hi")])
    assert binding.view.count(key) == 1
    binding.close()
    assert binding.view.closed


async def test_a_sync_binding_keeps_the_callers_view_open() -> None:
    view = open_store("memory://").sync()
    binding = SyncStoreBinding(view)
    assert not binding.owns_view
    await binding.aclose()
    assert not view.closed
    view.close()


def test_a_sync_binding_refuses_an_async_store_and_says_to_pass_its_view() -> None:
    with pytest.raises(StoreConfigurationError, match=r"store\.sync\(\)"):
        SyncStoreBinding(open_store("memory://"))  # type: ignore[arg-type]


async def test_a_sync_bindings_store_serves_the_callers_loop_beside_the_views_own() -> None:
    """What the adapters' docs say: the binding runs its calls on the view's loop, and the store serves others too."""
    binding = SyncStoreBinding("memory://")
    key = binding.key("s-loops", "t1")
    assert binding.view.store.serves_any_loop
    await binding.view.arun(binding.view.store.append(key, [Message(role="user", text="on the view's loop")]))
    await binding.view.store.append(key, [Message(role="user", text="on the caller's loop")])
    assert [m.text for m in binding.view.load(key)] == ["on the view's loop", "on the caller's loop"]
    await binding.aclose()
    for doc in (SyncStoreBinding.__doc__ or "", _binding.__doc__ or ""):
        assert "bound to one event loop" not in doc


def test_a_sync_binding_refuses_options_with_a_view_and_objects_of_other_types() -> None:
    view = open_store("memory://").sync()
    with pytest.raises(StoreConfigurationError, match="only apply to a store opened from a URL"):
        SyncStoreBinding(view, store_options={"ttl": 60})
    view.close()
    with pytest.raises(StoreConfigurationError, match="sync view such as"):
        SyncStoreBinding(42)  # type: ignore[arg-type]
