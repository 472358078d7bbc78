"""Messages: construction, contents, time-ordered ids, and the versioned record every store keeps."""

from __future__ import annotations

import json
import threading
import unicodedata
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from chatkeep.core import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    MessageFormatError,
    MessageTooLargeError,
    TextContent,
    UriContent,
    Usage,
    UsageContent,
    new_message_id,
)
from chatkeep.core.backend import decode_records, encode_records

GOLDEN = Path(__file__).parent / "golden"
T0 = datetime(2024, 7, 1, 12, 0, 0, tzinfo=timezone.utc)


def golden_messages() -> list[Message]:
    """The messages ``golden/messages_v1.jsonl`` holds, written out by hand (ids and times fixed)."""

    def at(seconds: int, micros: int = 0) -> datetime:
        return T0 + timedelta(seconds=seconds, microseconds=micros)

    return [
        Message(
            message_id="01907000-0000-7000-8000-000000000001",
            role="system",
            text="You are a helpful assistant.",
            created_at=at(0),
        ),
        Message(
            message_id="01907000-0000-7000-8000-000000000002",
            role="user",
            author_name="Zoë",
            created_at=at(1, 250_000),
            contents=[
                TextContent(text='Héllo, 世界! 👋🏽 NUL:\u0000 tab:\t newline:\n quote:" backslash:\\ '),
                TextContent(text="line sep:\u2028 para sep:\u2029 bom:\ufeff nfd:e\u0301"),
                UriContent(uri="https://example.com/cat.png?size=large&q=ü", media_type="image/png"),
                UriContent(uri="file-abc123"),
                DataContent(data="iVBORw0KGgo=", media_type="image/png"),
            ],
            additional_properties={"channel": "web", "tags": ["a", "b"], "score": 0.5, "nested": {"ok": True}},
        ),
        Message(
            message_id="01907000-0000-7000-8000-000000000003",
            role="assistant",
            author_name="StorageAgent",
            created_at=at(2, 999_999),
            contents=[
                TextContent(text="Let me check."),
                FunctionCallContent(call_id="call_1", name="get_weather", arguments='{"city": "São Paulo"}'),
                FunctionCallContent(call_id="call_2", name="now"),
                UsageContent(usage=Usage(input_tokens=12, output_tokens=7, total_tokens=19)),
            ],
        ),
        Message(
            message_id="01907000-0000-7000-8000-000000000004",
            role="tool",
            created_at=at(3),
            contents=[
                FunctionResultContent(
                    call_id="call_1",
                    result={
                        "temp_c": 21.5,
                        "conditions": ["sunny", None, True, False, 0, -3],
                        "station": {"id": 9007199254740993, "name": "Mirante ☀"},
                        "empty": {},
                    },
                ),
                FunctionResultContent(call_id="call_2", result="boom: clock unavailable", is_error=True),
            ],
        ),
        Message(
            message_id="01907000-0000-7000-8000-000000000005",
            role="assistant",
            created_at=at(4),
            contents=[],
        ),
    ]


def golden_lines() -> list[bytes]:
    data = (GOLDEN / "messages_v1.jsonl").read_bytes()
    assert data.endswith(b"\n")
    # Split on "\n" only: records may hold U+2028, which str.splitlines() would treat as a line break.
    return data[:-1].split(b"\n")


# -- construction ---------------------------------------------------------------------------------


def test_text_shorthand_makes_one_text_content() -> None:
    message = Message(role="user", text="hi")

    assert message.role == "user"
    assert message.text == "hi"
    assert message.contents == [TextContent(text="hi")]
    assert message.author_name is None
    assert message.additional_properties == {}


def test_text_joins_only_the_text_contents() -> None:
    message = Message(
        role="assistant",
        contents=[
            TextContent(text="Hello, "),
            FunctionCallContent(call_id="c", name="f"),
            TextContent(text="world"),
            UsageContent(usage=Usage(total_tokens=3)),
        ],
    )

    assert message.text == "Hello, world"
    assert Message(role="assistant").text == ""


def test_text_and_contents_together_are_refused() -> None:
    with pytest.raises(ValueError, match="either text= or contents="):
        Message(role="user", text="hi", contents=[TextContent(text="ho")])


def test_unknown_role_and_unknown_field_are_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        Message(role="robot", text="hi")
    with pytest.raises(ValueError, match="colour"):
        Message(role="user", text="hi", colour="red")


def test_function_calls_and_results_are_exposed() -> None:
    call = FunctionCallContent(call_id="c1", name="add", arguments='{"a": 1, "b": 2}')
    result = FunctionResultContent(call_id="c1", result={"sum": 3})

    assert Message(role="assistant", contents=[TextContent(text="x"), call]).function_calls == [call]
    assert Message(role="tool", contents=[result]).function_results == [result]
    assert call.parse_arguments() == {"a": 1, "b": 2}
    assert FunctionCallContent(call_id="c2", name="f", arguments="  ").parse_arguments() == {}
    with pytest.raises(ValueError, match="JSON object"):
        FunctionCallContent(call_id="c3", name="f", arguments="[1]").parse_arguments()


def test_created_at_defaults_to_now_in_utc() -> None:
    before = datetime.now(timezone.utc)
    message = Message(role="user", text="hi")
    after = datetime.now(timezone.utc)

    assert message.created_at.utcoffset() == timedelta(0)
    assert before <= message.created_at <= after


def test_usage_adds_up() -> None:
    total = Usage(input_tokens=1, output_tokens=2, total_tokens=3) + Usage(input_tokens=10, output_tokens=20)

    assert total == Usage(input_tokens=11, output_tokens=22, total_tokens=3)


# -- ids ------------------------------------------------------------------------------------------


def test_message_ids_are_uuid7_strings() -> None:
    value = uuid.UUID(Message(role="user", text="hi").message_id)

    assert value.version == 7
    assert value.variant == uuid.RFC_4122


def test_ids_made_in_sequence_sort_in_creation_order() -> None:
    messages = [Message(role="user", text=str(i)) for i in range(50)]

    assert sorted(m.message_id for m in messages) == [m.message_id for m in messages]


def test_ten_thousand_ids_in_a_tight_loop_are_unique_and_ordered() -> None:
    ids = [new_message_id() for _ in range(10_000)]

    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids


@pytest.mark.reliability
def test_ids_made_by_concurrent_threads_are_unique() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        out.extend(new_message_id() for _ in range(2_000))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [i for out in results for i in out]
    assert len(set(every)) == len(every) == 16_000
    for out in results:
        assert sorted(out) == out


# -- record format --------------------------------------------------------------------------------


def test_record_is_versioned_json_with_no_module_paths() -> None:
    message = golden_messages()[3]
    record = message.to_record()

    assert record.startswith('{"v":1,')
    data = json.loads(record)
    assert data["v"] == 1
    assert data["message_id"] == message.message_id
    assert data["contents"][0]["type"] == "function_result"
    for marker in ("chatkeep", "__", "py/object", "pydantic", "Content"):
        assert marker not in record


def test_every_content_type_has_a_plain_type_tag() -> None:
    records = [json.loads(line) for line in golden_lines()]

    types = {c["type"] for r in records for c in r["contents"]}
    assert types == {"text", "function_call", "function_result", "data", "uri", "usage"}


def test_golden_records_decode_to_the_expected_messages() -> None:
    expected = golden_messages()

    assert decode_records(golden_lines()) == expected
    assert decode_records([line.decode("utf-8") for line in golden_lines()]) == expected
    assert [Message.from_record(line) for line in golden_lines()] == expected


def test_golden_records_decode_the_expected_details() -> None:
    user, assistant, tool = decode_records(golden_lines())[1:4]

    assert "\u0000" in user.text
    assert "👋🏽" in user.text
    assert "e\u0301" in user.text  # NFD kept, not normalized
    assert user.author_name == "Zoë"
    assert user.created_at == datetime(2024, 7, 1, 12, 0, 1, 250_000, tzinfo=timezone.utc)
    assert user.additional_properties["nested"] == {"ok": True}
    assert assistant.function_calls[0].parse_arguments() == {"city": "São Paulo"}
    assert assistant.function_calls[1].arguments == "{}"
    assert tool.function_results[0].result["station"]["id"] == 9007199254740993  # type: ignore[index,call-overload]
    assert tool.function_results[1].is_error is True


def test_encoding_the_golden_messages_gives_exactly_the_golden_bytes() -> None:
    records = encode_records(golden_messages())

    assert [r.encode("utf-8") for r in records] == golden_lines()


def test_records_written_by_another_tool_decode_the_same() -> None:
    # Same JSON with another key order and whitespace: a reader must not depend on our exact bytes.
    expected = golden_messages()
    rewritten = []
    for line in golden_lines():
        data = json.loads(line)
        rewritten.append(json.dumps(dict(reversed(list(data.items()))), indent=1, ensure_ascii=True))

    assert decode_records(rewritten) == expected


def test_optional_fields_may_be_absent_from_a_record() -> None:
    record = '{"v":1,"message_id":"m1","role":"user","created_at":"2024-07-01T12:00:00Z"}'

    (message,) = decode_records([record])
    assert message.message_id == "m1"
    assert message.contents == []
    assert message.author_name is None
    assert message.additional_properties == {}
    assert message.created_at == T0


def test_decode_accepts_str_bytes_and_a_mix_in_order() -> None:
    messages = [Message(role="user", text=f"m{i} ☃") for i in range(4)]
    records = encode_records(messages)

    assert decode_records(records) == messages
    assert decode_records([r.encode() for r in records]) == messages
    mixed = [r.encode() if i % 2 else r for i, r in enumerate(records)]
    assert decode_records(mixed) == messages
    assert decode_records([]) == []


def test_newer_record_version_asks_for_an_upgrade() -> None:
    record = Message(role="user", text="hi").to_record().replace('{"v":1,', '{"v":2,', 1)

    with pytest.raises(MessageFormatError, match=r"version 2.*upgrade chatkeep-core"):
        decode_records([record])
    with pytest.raises(MessageFormatError, match="upgrade chatkeep-core"):
        decode_records([Message(role="user", text="ok").to_record(), record])


def test_record_without_version_is_refused() -> None:
    record = '{"message_id":"m1","role":"user","created_at":"2024-07-01T12:00:00Z"}'

    with pytest.raises(MessageFormatError, match="version None"):
        decode_records([record])


@pytest.mark.parametrize(
    ("record", "says"),
    [
        pytest.param("not json at all", "not valid JSON", id="garbage"),
        pytest.param(b"\xff\xfe\x00", "not valid JSON", id="binary"),
        pytest.param('{"v":1,"message_id":"m1","role":"us', "not valid JSON", id="truncated"),
        pytest.param("[1, 2]", "not a JSON object", id="array"),
        pytest.param('{"v":1,"message_id":"m1","role":"robot"}', "malformed", id="bad-role"),
        pytest.param(
            '{"v":1,"message_id":"m","role":"user","contents":[{"type":"hologram"}]}', "malformed", id="bad-content"
        ),
    ],
)
def test_corrupt_records_raise_message_format_error(record: str | bytes, says: str) -> None:
    good = Message(role="user", text="fine").to_record()

    with pytest.raises(MessageFormatError, match=says):
        decode_records([good, record])


def test_a_corrupt_record_in_a_batch_is_named_by_place_and_message_id() -> None:
    records = encode_records([Message(role="user", text=f"m{i}") for i in range(5)])
    bad_role = '{"v":1,"message_id":"m-bad","role":"robot","created_at":"2024-07-01T12:00:00Z"}'

    with pytest.raises(MessageFormatError, match=r"record 4 of 6 \(message 'm-bad'\) is malformed"):
        decode_records([*records[:3], bad_role, *records[3:]])
    with pytest.raises(MessageFormatError, match=r"record 2 of 5 is not valid JSON"):
        decode_records([records[0], records[1][:-1], *records[2:]])


@pytest.mark.parametrize("others", [pytest.param(str, id="beside-str"), pytest.param(bytes, id="beside-bytes")])
def test_a_record_of_bytes_that_are_not_utf8_raises_message_format_error(others: type) -> None:
    good = Message(role="user", text="fine").to_record()
    bad = Message(role="user", text="x").to_record().encode().replace(b'"x"', b'"\xff"')
    batch = [good if others is str else good.encode(), bad]

    with pytest.raises(MessageFormatError, match=r"record 2 of 2 is not valid JSON \('utf-8' codec"):
        decode_records(batch)


def test_one_corrupt_record_never_decodes_as_two_messages() -> None:
    # Two message objects glued into one record are corruption, not two messages.
    glued = (
        '{"v":1,"message_id":"a","role":"user","created_at":"2024-07-01T12:00:00Z"},'
        '{"message_id":"b","role":"user","created_at":"2024-07-01T12:00:00Z"}'
    )

    with pytest.raises(MessageFormatError, match="not valid JSON"):
        decode_records([glued])


def test_encode_refuses_a_record_over_max_bytes_naming_the_limit() -> None:
    message = Message(role="user", text="😀" * 1_000)  # 4 bytes a character in UTF-8
    size = len(message.to_record().encode("utf-8"))

    assert encode_records([message], max_bytes=size) == [message.to_record()]
    with pytest.raises(MessageTooLargeError, match=rf"{message.message_id}.*limit of {size - 1:,} bytes"):
        encode_records([Message(role="user", text="small"), message], max_bytes=size - 1)


def test_encode_without_limit_keeps_everything() -> None:
    messages = [Message(role="user", text="x" * 5_000_000)]

    assert decode_records(encode_records(messages)) == messages


# -- lossless round trip --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("NUL \u0000 in the middle and at the end \u0000", id="nul"),
        pytest.param("emoji 🧑‍🚀 flags 🇧🇷 skin 👍🏿", id="emoji"),
        pytest.param("RTL שלום, CJK 漢字, combining a\u0308", id="scripts"),
        pytest.param("controls \x01\x1f\x7f and \r\n and \u2028", id="controls"),
        pytest.param('JSON-looking {"v":2} "\\u0000"', id="json-like"),
    ],
)
def test_text_round_trips_exactly(text: str) -> None:
    message = Message(role="user", text=text, author_name=text or None, additional_properties={"k": text})

    (back,) = decode_records([message.to_record()])
    assert back == message
    assert back.text == text


def test_one_megabyte_text_round_trips() -> None:
    text = ("0123456789abcdé€😀\u0000" * 70_000)[:1_048_576]
    message = Message(role="assistant", text=text)

    (back,) = decode_records([message.to_record().encode("utf-8")])
    assert back.text == text


def test_nfc_and_nfd_texts_stay_distinct() -> None:
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd

    back = decode_records(encode_records([Message(role="user", text=nfc), Message(role="user", text=nfd)]))
    assert [m.text for m in back] == [nfc, nfd]


def test_tool_call_and_nested_result_round_trip() -> None:
    call = Message(
        role="assistant", contents=[FunctionCallContent(call_id="c1", name="lookup", arguments='{"q": "x"}')]
    )
    result = Message(
        role="tool",
        contents=[FunctionResultContent(call_id="c1", result={"rows": [{"a": 1.25, "b": [None, "ü"]}], "n": 1})],
    )

    assert decode_records(encode_records([call, result])) == [call, result]


# -- stamps ---------------------------------------------------------------------------------------


def test_with_source_stamps_in_memory_only() -> None:
    message = Message(role="user", text="hi")
    assert message.source is None

    assert message.with_source("history") is message
    assert message.source == "history"
    assert "history" not in message.to_record()
    assert "source" not in message.model_dump()
    assert "history" not in message.model_dump_json()
    (back,) = decode_records([message.to_record()])
    assert back.source is None
