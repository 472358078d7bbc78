"""The untyped option API (:class:`OptionSet` of :class:`StoreOption` values), kept for backends not yet moved.

New backends declare a :class:`~chatkeep.core.backend.StoreSettings` model instead, and get their options typed.
An :class:`OptionSet` is parsed by the same parser (a model built from its options), so both report alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, create_model

from chatkeep.core._errors import StoreConfigurationError
from chatkeep.core.backend._converters import converted, positive_int, positive_seconds
from chatkeep.core.backend._settings import NO_TTL_HINT, DriverOptions, OptionsModel
from chatkeep.core.backend._store import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["MAX_MESSAGE_BYTES", "TTL", "OptionSet", "StoreOption", "StoreOptions"]


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
    """The options one backend takes (the untyped API; prefer a :class:`~chatkeep.core.backend.StoreSettings`).

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
        no_ttl_hint: str = NO_TTL_HINT,
        hints: Mapping[str, str] | None = None,
    ) -> None:
        self.hints = dict(hints or {})
        self.backend = backend
        self.options = {option.name: option for option in options}
        self.error = error
        self.driver_option = driver_option
        self.driver = driver
        self.no_ttl_hint = no_ttl_hint
        # One field per option, named by position (an option's name may be one pydantic keeps, like "schema").
        fields: dict[str, Any] = {
            f"option_{n}": (Annotated[Any, converted(option.convert)], Field(option.default, alias=option.name))
            for n, option in enumerate(options)
        }
        self._model: type[OptionsModel] = create_model("Options", __base__=OptionsModel, **fields)
        self._model.store_name, self._model.store_error = backend, error
        self._model.no_ttl_hint, self._model.option_hints = no_ttl_hint, self.hints

    @property
    def names(self) -> list[str]:
        """The options' names, in declaration order."""
        return list(self.options)

    def with_driver(self, driver: str, driver_option: Callable[[str], bool] | None) -> OptionSet:
        """The same options, passing other query parameters to ``driver`` when ``driver_option`` accepts them."""
        options = copy.copy(self)  # shares the model: building one per store opened would cost a millisecond
        options.driver, options.driver_option = driver, driver_option
        return options

    def parse(
        self, query: str | Iterable[tuple[str, str]], keywords: Mapping[str, Any], *, url: str = ""
    ) -> StoreOptions:
        """Read the options from a URL query and keywords (a keyword wins over the query; ``None`` is "not given").

        Raises:
            StoreConfigurationError: (the backend's subclass) an option is unknown, given twice in the query,
                or malformed; the message names it and what it must be, and lists the valid options.
        """
        driver = None if self.driver_option is None else DriverOptions(self.driver, self.driver_option)
        parsed = self._model.parse(query, keywords, url=url, driver=driver)
        values = {name: getattr(parsed, f"option_{n}") for n, name in enumerate(self.options)}
        return StoreOptions(values, parsed.driver_query)
