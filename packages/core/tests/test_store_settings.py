"""Typed store options: one StoreSettings model per backend, parsed from the URL query and keywords alike."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType
from typing import Annotated, Any

import pytest
from pydantic import Field, model_validator

from chatkeep.core import StoreConfigurationError
from chatkeep.core.backend import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DriverOptions,
    Flag,
    NonEmptyText,
    PositiveInt,
    StoreSettings,
    TTLStoreSettings,
    converted,
)


class AcmeURLError(StoreConfigurationError):
    """The test backend's own error."""


def _even(value: object) -> int:
    number = int(str(value))
    if number % 2:
        raise ValueError("must be even")
    return number


class AcmeSettings(TTLStoreSettings):
    store_name = "Acme"
    store_error = AcmeURLError
    option_hints = MappingProxyType({"max_messages": "the load window is a provider's max_messages"})

    fsync: Flag = Field(True, description="flush every write")
    pool: PositiveInt = Field(5, description="connections kept open")
    schema_: NonEmptyText | None = Field(None, alias="schema", description="a name pydantic keeps for itself")
    pairs: Annotated[int, converted(_even)] = Field(2, description="a backend's own converter")


def test_options_come_typed_from_the_query_and_from_keywords_alike() -> None:
    by_url = AcmeSettings.parse("fsync=off&pool=7&schema=s&ttl=1.5&pairs=4", {})
    by_keyword = AcmeSettings.parse("", {"fsync": False, "pool": 7, "schema": "s", "ttl": 1.5, "pairs": 4})
    assert by_url == by_keyword
    assert (by_url.fsync, by_url.pool, by_url.schema_, by_url.ttl, by_url.pairs) == (False, 7, "s", 1.5, 4)
    assert by_url.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES


def test_a_keyword_wins_over_the_query_and_none_means_not_given() -> None:
    settings = AcmeSettings.parse("pool=7&ttl=9", {"pool": 3, "ttl": None, "fsync": None})
    assert (settings.pool, settings.ttl, settings.fsync) == (3, 9.0, True)
    assert settings.model_fields_set == {"pool", "ttl"}  # what was given, so an option can override the URL
    assert AcmeSettings.parse("", {"ttl": timedelta(minutes=1)}).ttl == 60.0


def test_the_options_are_listed_in_declaration_order_by_their_names() -> None:
    assert AcmeSettings.option_names() == ["max_message_bytes", "ttl", "fsync", "pool", "schema", "pairs"]
    assert StoreSettings.option_names() == ["max_message_bytes"]


@pytest.mark.parametrize(
    ("query", "keywords", "message"),
    [
        ("colour=blue", {}, r"^Acme stores take no query option 'colour' in acme://h\?colour=blue; the options are "),
        (
            "",
            {"colour": "blue"},
            r"^Acme stores take no keyword option 'colour'; the options are max_message_bytes, ttl",
        ),
        ("", {"max_messages": 5}, r"no keyword option 'max_messages' \(the load window is a provider's max_messages\)"),
        ("pool=1&pool=2", {}, r"^the Acme store option pool is given twice in acme://h\?pool=1&pool=2; give it once$"),
        ("pool=0", {}, r"^the Acme store option pool='0' in acme://h\?pool=0 must be a whole number of 1 or more$"),
        ("", {"pool": True}, r"^the Acme store option pool=True must be a whole number, not true or false$"),
        ("", {"fsync": "maybe"}, r"^the Acme store option fsync='maybe' must be true or false$"),
        ("pairs=3", {}, r"option pairs='3' in acme://h\?pairs=3 must be even$"),
        ("", {"pairs": None, "schema": ""}, r"option schema='' must be non-empty text$"),
        ("ttl=0", {}, r"ttl='0' in acme://h\?ttl=0 must be a positive, finite number of seconds$"),
        ("a&&b", {}, r"^the query in acme://h\?a&&b is malformed; write \?name=value&name=value with the options "),
    ],
)
def test_unknown_and_malformed_options_name_themselves_and_the_valid_ones(
    query: str, keywords: dict[str, Any], message: str
) -> None:
    with pytest.raises(AcmeURLError, match=message):
        AcmeSettings.parse(query, keywords, url=f"acme://h?{query}")


def test_ttl_is_refused_with_advice_by_a_store_without_it() -> None:
    class Plain(StoreSettings):
        store_name = "Plain"

    with pytest.raises(StoreConfigurationError, match=r"^Plain stores take no ttl option: it has no native TTL; "):
        Plain.parse("", {"ttl": 5})
    assert Plain.parse("max_message_bytes=10", {}).max_message_bytes == 10


def test_a_secret_value_is_never_echoed() -> None:
    class Secretive(StoreSettings):
        password: PositiveInt = Field(1, description="a secret")

    with pytest.raises(StoreConfigurationError) as raised:
        Secretive.parse("password=hunter2", {}, url="acme://h?password=hunter2")
    assert "hunter2" not in str(raised.value)
    assert "password=***" in str(raised.value)


def test_a_check_of_several_options_together_is_reported_as_the_backend_error() -> None:
    class Exclusive(StoreSettings):
        store_name = "Excl"
        store_error = AcmeURLError
        a: Flag = Field(False, description="one")
        b: Flag = Field(False, description="other")

        @model_validator(mode="after")
        def _one_of(self) -> Exclusive:
            if self.a and self.b:
                raise ValueError("take a or b, not both")
            return self

    with pytest.raises(AcmeURLError, match=r"^the Excl store options in x://\?a=1&b=1 take a or b, not both$"):
        Exclusive.parse("a=1&b=1", {}, url="x://?a=1&b=1")


def test_driver_options_pass_through_in_order_and_a_typo_still_fails() -> None:
    driver = DriverOptions("acme-py", {"ssl", "tcp_nodelay"}.__contains__)
    settings = AcmeSettings.parse("ssl=1&pool=2&tcp_nodelay=0&ssl=2", {}, driver=driver)
    assert settings.driver_query == (("ssl", "1"), ("tcp_nodelay", "0"), ("ssl", "2"))
    assert settings.pool == 2
    assert AcmeSettings.parse("", {}).driver_query == ()
    with pytest.raises(AcmeURLError, match=r"take no query option 'sll'; .*pairs, or an option of the acme-py driver"):
        AcmeSettings.parse("sll=1", {}, driver=driver)


def test_settings_are_frozen() -> None:
    settings = AcmeSettings.parse("", {})
    with pytest.raises(ValueError, match="frozen"):
        settings.pool = 3  # type: ignore[misc]
