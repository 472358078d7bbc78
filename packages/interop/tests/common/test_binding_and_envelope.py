"""The pieces every adapter shares: which store it writes to, and how a framework's item is kept exactly."""

from __future__ import annotations

import pytest

from chatkeep.core import InvalidSessionKeyError, Message, MessageFormatError, StoreConfigurationError, open_store
from chatkeep.interop._binding import StoreBinding
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


def test_an_item_that_is_not_json_is_refused_with_its_value_named() -> None:
    with pytest.raises(MessageFormatError, match=r"JSON values only .*not a set"):
        wrap({"nested": [{"tags": {"a", "b"}}]}, format="demo", role="user")
