"""Wrong values and wrong types handed to the public API answer with a ChatkeepError that says what to do.

Each case here once escaped as a foreign exception (``TypeError``, ``AttributeError`` from deep inside,
``OverflowError``) instead.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from chatkeep.core import (
    ChatkeepError,
    FunctionCallContent,
    FunctionResultContent,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Message,
    SessionKey,
    StoreConfigurationError,
    TextContent,
    Usage,
    UsageContent,
    open_store,
)


@pytest.mark.parametrize("url", [None, 3, b"memory://", ["memory://"]])
def test_open_store_with_a_url_that_is_not_a_string(url: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="pass a URL such as") as caught:
        open_store(url)
    assert isinstance(caught.value, TypeError)  # what a wrong type is, for handlers written that way


@pytest.mark.parametrize("url", ["", "   "])
def test_open_store_with_an_empty_url_says_it_is_empty(url: str) -> None:
    with pytest.raises(StoreConfigurationError, match=r"the store URL is empty \(an unset variable\?\)"):
        open_store(url)


@pytest.mark.parametrize(
    ("messages", "said"),
    [
        ("remember this", "got str"),
        (Message(role="user", text="hi"), "got Message"),
        (b"bytes", "got bytes"),
        (42, "got int"),
        (["a text"], "item 0 is a str"),
        ([Message(role="user", text="ok"), {"role": "user"}], "item 1 is a dict"),
    ],
)
async def test_append_takes_a_list_of_messages_and_says_so(messages: Any, said: str) -> None:
    key = SessionKey("t", f"s-{uuid.uuid4().hex}")
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        with pytest.raises(InvalidArgumentTypeError, match=said) as caught:
            await store.append(key, messages)
        assert "Message(role=" in str(caught.value)  # what to write instead
        assert await store.count(key) == 0  # nothing was stored


async def test_append_still_takes_any_iterable_of_messages() -> None:
    key = SessionKey("t", "s")
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        assert await store.append(key, (Message(role="user", text=str(n)) for n in range(3))) == 3


@pytest.mark.parametrize("age", [timedelta(days=999_999_999), timedelta.max, timedelta(days=800_000)])
async def test_prune_with_an_age_beyond_the_calendar(age: timedelta) -> None:
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        with pytest.raises(InvalidArgumentError, match="reaches before the year 1"):
            await store.prune(older_than=age)


async def test_prune_with_an_older_than_of_the_wrong_type() -> None:
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        with pytest.raises(InvalidArgumentTypeError, match="must be a timedelta or an aware datetime"):
            await store.prune(older_than=30)  # type: ignore[arg-type]
    assert issubclass(InvalidArgumentTypeError, ChatkeepError)


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: TextContent(text=3), r"TextContent\(text: str\)"),
        (lambda: TextContent(text=None), r"TextContent\(text: str\)"),
        (lambda: FunctionCallContent(call_id="c", name=1), r"name: str, arguments: str = '\{\}'\)"),
        (lambda: FunctionResultContent(call_id=None), r"FunctionResultContent\(call_id: str, result: JsonValue"),
        (lambda: UsageContent(usage=3), r"UsageContent\(usage: Usage, model: str \| None = None\)"),
        (lambda: Message(role="user", contents="hi"), "contents= a list of contents"),
    ],
)
def test_a_content_of_a_wrong_type_is_refused_with_invalid_argument_type_error(build: Any, said: str) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=said) as caught:
        build()
    assert isinstance(caught.value, TypeError)
    assert type(caught.value.__cause__).__name__ == "ValidationError"  # pydantic's account, kept as the cause


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: TextContent(), "Field required"),
        (lambda: TextContent("positional"), "Unexpected positional argument"),
        (lambda: TextContent(text="t", colour="red"), "Unexpected keyword argument"),
        (lambda: Usage(input_tokens="many"), "unable to parse string as an integer"),
        (lambda: FunctionCallContent(type="text", call_id="c", name="n"), "Input should be 'function_call'"),
        (lambda: Message(role="robot", text="hi"), "Pass role= one of system, user, assistant or tool"),
    ],
)
def test_a_content_with_a_wrong_value_is_refused_with_invalid_argument_error(build: Any, said: str) -> None:
    with pytest.raises(InvalidArgumentError, match=said) as caught:
        build()
    assert not isinstance(caught.value, InvalidArgumentTypeError)  # a value out of range, not a wrong type


def test_a_message_given_its_text_twice_is_refused_in_words() -> None:
    # Hypothesis found it: Message(x, text=y) was Python's "got multiple values for argument 'text'".
    with pytest.raises(InvalidArgumentError, match="Pass Message its text once"):
        Message("hi", text="hello", role="user")
    assert Message(text="hi", role="user").text == Message("hi", role="user").text == "hi"


@pytest.mark.parametrize(
    ("info", "error", "said"),
    [
        ({}, InvalidArgumentError, "pass at least one"),
        ({"title": 3}, InvalidArgumentTypeError, "title must be a string"),
        ({"title": "x" * 1_025}, InvalidArgumentError, "over the limit of 1,024"),
        ({"tags": "billing"}, InvalidArgumentTypeError, "tags must be a set of strings"),
        ({"tags": {""}}, InvalidArgumentError, "non-empty string"),
        ({"tags": {f"t{n}" for n in range(65)}}, InvalidArgumentError, "at most 64 tags"),
        ({"metadata": [1]}, InvalidArgumentTypeError, "metadata must be a dict"),
        ({"metadata": {"when": timedelta(1)}}, InvalidArgumentError, "only JSON values"),
        ({"metadata": {"big": "x" * 70_000}}, InvalidArgumentError, "over 65,536 bytes"),
    ],
)
async def test_update_info_refuses_what_it_cannot_keep_and_stores_nothing(
    info: dict[str, Any], error: type[ChatkeepError], said: str
) -> None:
    key = SessionKey("t", "s")
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        await store.append(key, [Message(role="user", text="hi")])
        with pytest.raises(error, match=said):
            await store.update_info(key, **info)
        [listed] = (await store.list_sessions("t")).items
        assert (listed.title, listed.tags, listed.metadata) == (None, frozenset(), {})


async def test_fork_and_tag_arguments_are_checked_before_the_store() -> None:
    source = SessionKey("t", "s")
    async with open_store(f"memory://args-{uuid.uuid4().hex}") as store:
        await store.append(source, [Message(role="user", text="hi")])
        with pytest.raises(InvalidArgumentError, match="onto itself"):
            await store.fork(source, source)
        with pytest.raises(InvalidArgumentError, match="through must be a message id"):
            await store.fork(source, SessionKey("t", "u"), through=3)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="non-empty string"):
            await store.list_sessions("t", tag="")
        assert await store.count(SessionKey("t", "u")) == 0
