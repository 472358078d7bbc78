"""Store options: one parser for the URL query and keywords of every backend.

A backend declares the options it takes as :class:`StoreOption` values (the shared ones, :data:`TTL` and
:data:`MAX_MESSAGE_BYTES`, plus its own) in an :class:`OptionSet`. :meth:`OptionSet.parse` reads them from a
URL's query and from keywords alike, when the store is opened: an unknown or malformed option raises a
:class:`~chatkeep.core.StoreConfigurationError` (or the backend's subclass) that names it and lists the
valid ones, so nothing is silently ignored and no driver error surfaces later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl

from chatkeep.core._errors import StoreConfigurationError, redact_url
from chatkeep.core.backend._store import DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "MAX_MESSAGE_BYTES",
    "TTL",
    "OptionSet",
    "StoreOption",
    "StoreOptions",
    "boolean",
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


@dataclass(frozen=True)
class StoreOption:
    """One option a store takes, in the URL query (``?name=value``) or as a keyword (``name=value``).

    Attributes:
        name: the option's name in both places.
        convert: turns the given value (text from a URL, or a keyword's value) into the option's value;
            raises ``ValueError`` saying what the value must be.
        default: the value when the option is not given (a keyword of ``None`` means "not given").
        help: what the option does, for error messages and docs.
    """

    name: str
    convert: Callable[[Any], Any]
    default: Any = None
    help: str = ""


#: Seconds (or a ``timedelta``) an idle session lives; every write restarts it. Only for backends with a native TTL.
TTL = StoreOption("ttl", positive_seconds, None, "seconds an idle session lives; every write restarts it")
#: The largest message record a store accepts, in UTF-8 bytes.
MAX_MESSAGE_BYTES = StoreOption(
    "max_message_bytes", positive_int, DEFAULT_MAX_MESSAGE_BYTES, "the largest message record accepted, in bytes"
)


@dataclass(frozen=True)
class StoreOptions:
    """What :meth:`OptionSet.parse` read: every declared option's value, and the driver's own query options.

    Attributes:
        values: each declared option by name, given or default.
        driver: query parameters that are the driver's own options, in order (only where the backend passes any).
    """

    values: Mapping[str, Any]
    driver: tuple[tuple[str, str], ...] = field(default=())

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


class OptionSet:
    """The options one backend takes, and the one parser for them.

    Args:
        backend: how messages name the store (``"Redis"``, ``"SQL"``, ``"memory://"``).
        options: the options it takes; include :data:`TTL` only when the engine expires sessions itself.
        error: the :class:`StoreConfigurationError` subclass to raise (the backend's own).
        driver_option: for backends that pass other query parameters to their driver, tells whether the
            driver takes a parameter of that name (checked now, so a typo fails at open, not at first use).
        driver: the driver's name, for messages about its options.
        no_ttl_hint: what to say when ``ttl`` is given to a backend without :data:`TTL`.
        hints: what to say of particular unknown names (an option that was renamed, say).
    """

    def __init__(
        self,
        backend: str,
        options: Sequence[StoreOption],
        *,
        error: type[StoreConfigurationError] = StoreConfigurationError,
        driver_option: Callable[[str], bool] | None = None,
        driver: str = "",
        no_ttl_hint: str = "it has no native TTL; delete old sessions with store.prune(older_than=...) on a schedule",
        hints: Mapping[str, str] | None = None,
    ) -> None:
        self.hints = dict(hints or {})
        self.backend = backend
        self.options = {option.name: option for option in options}
        self.error = error
        self.driver_option = driver_option
        self.driver = driver
        self.no_ttl_hint = no_ttl_hint

    @property
    def names(self) -> list[str]:
        """The options' names, in declaration order."""
        return list(self.options)

    def with_driver(self, driver: str, driver_option: Callable[[str], bool] | None) -> OptionSet:
        """The same options, passing other query parameters to ``driver`` when ``driver_option`` accepts them."""
        return OptionSet(
            self.backend,
            list(self.options.values()),
            error=self.error,
            driver_option=driver_option,
            driver=driver,
            no_ttl_hint=self.no_ttl_hint,
            hints=self.hints,
        )

    def parse(
        self, query: str | Iterable[tuple[str, str]], keywords: Mapping[str, Any], *, url: str = ""
    ) -> StoreOptions:
        """Read the options from a URL query and keywords (a keyword wins over the query; ``None`` is "not given").

        Raises:
            StoreConfigurationError: (the backend's subclass) an option is unknown, given twice in the query,
                or malformed; the message names it and what it must be, and lists the valid options.
        """
        shown = f" in {redact_url(url)}" if url else ""
        if isinstance(query, str):
            try:
                pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
            except ValueError:
                raise self.error(
                    f"the query{shown} is malformed; write ?name=value&name=value with the options {self._listing()}"
                ) from None
        else:
            pairs = list(query)
        given: dict[str, Any] = {}
        driver: list[tuple[str, str]] = []
        for name, value in pairs:
            if name in self.options:
                if name in given:
                    raise self.error(f"the {self.backend} store option {name} is given twice{shown}; give it once")
                given[name] = self._convert(name, value, shown)
            elif self.driver_option is not None and self.driver_option(name):
                driver.append((name, value))
            else:
                raise self._unknown(name, "query option", shown)
        for name, value in keywords.items():
            if name not in self.options:
                raise self._unknown(name, "keyword option", "")
            if value is not None:
                given[name] = self._convert(name, value, "")
        values = {name: given.get(name, option.default) for name, option in self.options.items()}
        return StoreOptions(values, tuple(driver))

    def _convert(self, name: str, value: Any, shown: str) -> Any:
        try:
            return self.options[name].convert(value)
        except (ValueError, TypeError) as exc:
            secret = redact_url(f"?{name}=x") != f"?{name}=x"  # a password, key, token... is never echoed
            given = "***" if secret else repr(value)
            raise self.error(f"the {self.backend} store option {name}={given}{shown} {exc}") from None

    def _unknown(self, name: str, kind: str, shown: str) -> StoreConfigurationError:
        if name == "ttl":
            return self.error(f"{self.backend} stores take no ttl option: {self.no_ttl_hint}")
        driver = f", or an option of the {self.driver} driver" if self.driver_option is not None else ""
        hint = f" ({self.hints[name]})" if name in self.hints else ""
        return self.error(
            f"{self.backend} stores take no {kind} {name!r}{shown}{hint}; the options are {self._listing()}{driver}"
        )

    def _listing(self) -> str:
        return ", ".join(self.options) or "none"
