"""Converters of option values: each reads text from a URL's query and typed keyword values alike.

A converter raises ``ValueError`` saying what the value must be; the option parser puts that in its message.
The ``Annotated`` types (:data:`PositiveInt`, :data:`Seconds`, ...) are the same converters as field types of a
:class:`~chatkeep.core.backend.StoreSettings` model; :func:`converted` makes one of a backend's own converter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from pydantic import PlainValidator

__all__ = [
    "Flag",
    "NonEmptyText",
    "NonNegativeInt",
    "PositiveInt",
    "Seconds",
    "boolean",
    "converted",
    "non_negative_int",
    "positive_int",
    "positive_seconds",
    "text",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def positive_int(value: object) -> int:
    """A whole number of 1 or more (from text or an ``int``)."""
    number = _whole(value)
    if number < 1:
        raise ValueError("must be a whole number of 1 or more")
    return number


def non_negative_int(value: object) -> int:
    """A whole number of 0 or more (from text or an ``int``)."""
    number = _whole(value)
    if number < 0:
        raise ValueError("must be a whole number of 0 or more")
    return number


def _whole(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true or false")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise ValueError("must be a whole number")


def positive_seconds(value: object) -> float:
    """A positive number of seconds (from text, a number or a ``timedelta``)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError("must be a number of seconds, not true or false")
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError("must be a number of seconds") from None
    else:
        raise ValueError("must be a number of seconds or a timedelta")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError("must be a positive, finite number of seconds")
    return seconds


def boolean(value: object) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``, or a ``bool``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE:
        return True
    if isinstance(value, str) and value.lower() in _FALSE:
        return False
    raise ValueError("must be true or false")


def text(value: object) -> str:
    """Non-empty text."""
    if not isinstance(value, str) or not value:
        raise ValueError("must be non-empty text")
    return value


def converted(convert: Callable[[Any], Any]) -> PlainValidator:
    """Make ``convert`` a field's whole validation: ``Annotated[int, converted(my_converter)]``.

    The converter gets the value as given (text from a URL, or a keyword's value) and returns the option's value,
    or raises ``ValueError`` saying what it must be (a ``TypeError`` counts as one).
    """

    def convert_or_refuse(value: Any) -> Any:
        try:
            return convert(value)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    return PlainValidator(convert_or_refuse)


#: A whole number of 1 or more.
PositiveInt = Annotated[int, converted(positive_int)]
#: A whole number of 0 or more.
NonNegativeInt = Annotated[int, converted(non_negative_int)]
#: A positive, finite number of seconds (also from a ``timedelta``).
Seconds = Annotated[float, converted(positive_seconds)]
#: ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``, or a ``bool``.
Flag = Annotated[bool, converted(boolean)]
#: Non-empty text.
NonEmptyText = Annotated[str, converted(text)]
