"""Typed store options: a backend declares its options once, as the fields of a :class:`StoreSettings` model.

:meth:`StoreSettings.parse` reads them from a URL's query and from keywords alike, when the store is opened, and
returns the backend's own model, typed: no untyped mapping, no dataclass filled by hand. An unknown or
malformed option raises a :class:`~chatkeep.core.StoreConfigurationError` (or the backend's subclass) that
names it and lists the valid ones, so nothing is silently ignored and no driver error surfaces later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import ErrorDetails
from typing_extensions import Self

from chatkeep.core._errors import StoreConfigurationError, redact_url
from chatkeep.core.backend._converters import PositiveInt, Seconds
from chatkeep.core.backend._store import DEFAULT_MAX_MESSAGE_BYTES

__all__ = ["NO_TTL_HINT", "DriverOptions", "StoreSettings", "TTLStoreSettings"]

NO_TTL_HINT = "it has no native TTL; delete old sessions with store.prune(older_than=...) on a schedule"


@dataclass(frozen=True)
class DriverOptions:
    """The driver of a backend that passes the query parameters that are not its options on to the driver.

    Attributes:
        name: the driver's name, for messages (``"redis-py"``).
        accepts: whether the driver takes a query parameter of that name (checked at open, so a typo fails then).
    """

    name: str
    accepts: Callable[[str], bool]


class StoreSettings(BaseModel):
    """The options of a store, typed: subclass it once per backend and declare each option as a field.

    Every store has ``max_message_bytes``; a store whose engine expires sessions itself subclasses
    :class:`TTLStoreSettings` instead, which adds ``ttl``. A field's type is its converter (``PositiveInt``,
    ``Seconds``, ``Flag``, ``NonEmptyText``, or ``Annotated[T, converted(your_converter)]``), its default the
    value when the option is not given, its ``description`` the option's help; its alias, when it has one, is
    the option's name (for a name pydantic keeps for itself, such as ``schema``). The class variables say how
    messages name the store::

        class AcmeSettings(StoreSettings):
            store_name = "Acme"
            store_error = AcmeURLError

            fsync: Flag = Field(True, description="flush every write to the disk before it is acknowledged")

        settings = AcmeSettings.parse(urlsplit(url).query, keywords, url=url)  # typed: settings.fsync is a bool

    ``settings.model_fields_set`` tells which options were given (to let an option override a part of the URL).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: How messages name the store (``"Redis"``, ``"memory://"``).
    store_name: ClassVar[str] = "this"
    #: The :class:`StoreConfigurationError` subclass to raise (the backend's own).
    store_error: ClassVar[type[StoreConfigurationError]] = StoreConfigurationError
    #: What to say when ``ttl`` is given to a store without a ``ttl`` option.
    no_ttl_hint: ClassVar[str] = NO_TTL_HINT
    #: What to say of particular unknown names (an option that was renamed, say).
    option_hints: ClassVar[Mapping[str, str]] = MappingProxyType({})

    _driver_query: tuple[tuple[str, str], ...] = PrivateAttr(default=())

    max_message_bytes: PositiveInt = Field(
        DEFAULT_MAX_MESSAGE_BYTES, description="the largest message record accepted, in UTF-8 bytes"
    )

    @classmethod
    def option_names(cls) -> list[str]:
        """The options' names, in declaration order (a base class's first)."""
        return [field.alias or name for name, field in cls.model_fields.items()]

    @property
    def driver_query(self) -> tuple[tuple[str, str], ...]:
        """The query parameters that are the driver's own options, in order (see ``parse(driver=...)``)."""
        return self._driver_query

    @classmethod
    def parse(
        cls,
        query: str | Iterable[tuple[str, str]] = "",
        keywords: Mapping[str, Any] | None = None,
        *,
        url: str = "",
        driver: DriverOptions | None = None,
    ) -> Self:
        """Read the options from a URL query and keywords (a keyword wins over the query; ``None`` is "not given").

        Args:
            query: the URL's query (``urlsplit(url).query``), or its name-value pairs.
            keywords: the keyword options.
            url: the whole URL, shown (redacted) in messages.
            driver: for a backend that passes other query parameters to its driver: they are kept, in order, in
                :attr:`driver_query` when the driver takes them, and refused otherwise.

        Raises:
            StoreConfigurationError: (the backend's subclass) an option is unknown, given twice in the query,
                or malformed; the message names it and what it must be, and lists the valid options.
        """
        shown = f" in {redact_url(url)}" if url else ""
        names = cls.option_names()
        given: dict[str, Any] = {}
        where: dict[str, str] = {}  # each given option's source, for messages: the URL or a keyword
        driver_query: list[tuple[str, str]] = []
        for name, value in cls._pairs(query, shown):
            if name in names:
                if name in given:
                    raise cls.store_error(
                        f"the {cls.store_name} store option {name} is given twice{shown}; give it once"
                    )
                given[name], where[name] = value, shown
            elif driver is not None and driver.accepts(name):
                driver_query.append((name, value))
            else:
                raise cls._unknown(name, "query option", shown, driver)
        for name, value in (keywords or {}).items():
            if name not in names:
                raise cls._unknown(name, "keyword option", "", driver)
            if value is not None:
                given[name], where[name] = value, ""
        try:
            settings = cls.model_validate(given)
        except ValidationError as exc:
            raise cls._invalid(exc.errors()[0], given, where, shown) from None
        except TypeError as exc:  # a converter refused a value's type with TypeError rather than ValueError
            raise cls.store_error(f"the {cls.store_name} store options{shown} are malformed: {exc}") from None
        settings._driver_query = tuple(driver_query)
        return settings

    @classmethod
    def _pairs(cls, query: str | Iterable[tuple[str, str]], shown: str) -> list[tuple[str, str]]:
        if not isinstance(query, str):
            return list(query)
        try:
            return parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError:
            raise cls.store_error(
                f"the query{shown} is malformed; write ?name=value&name=value with the options {cls._listing()}"
            ) from None

    @classmethod
    def _invalid(
        cls, error: ErrorDetails, given: Mapping[str, Any], where: Mapping[str, str], shown: str
    ) -> StoreConfigurationError:
        ctx = error.get("ctx") or {}
        reason = (
            str(ctx["error"]) if error["type"] == "value_error" and "error" in ctx else f"is invalid: {error['msg']}"
        )
        name = str(error["loc"][0]) if error["loc"] else ""
        if name not in given:  # a check of several options together (a model validator)
            return cls.store_error(f"the {cls.store_name} store options{shown} {reason}")
        secret = redact_url(f"?{name}=x") != f"?{name}=x"  # a password, key, token... is never echoed
        value = "***" if secret else repr(given[name])
        return cls.store_error(f"the {cls.store_name} store option {name}={value}{where[name]} {reason}")

    @classmethod
    def _unknown(cls, name: str, kind: str, shown: str, driver: DriverOptions | None) -> StoreConfigurationError:
        if name == "ttl":
            return cls.store_error(f"{cls.store_name} stores take no ttl option: {cls.no_ttl_hint}")
        driver_hint = f", or an option of the {driver.name} driver" if driver is not None else ""
        hint = f" ({cls.option_hints[name]})" if name in cls.option_hints else ""
        return cls.store_error(
            f"{cls.store_name} stores take no {kind} {name!r}{shown}{hint}; "
            f"the options are {cls._listing()}{driver_hint}"
        )

    @classmethod
    def _listing(cls) -> str:
        return ", ".join(cls.option_names()) or "none"


class TTLStoreSettings(StoreSettings):
    """:class:`StoreSettings` of a store whose engine expires idle sessions itself: it adds the ``ttl`` option."""

    ttl: Seconds | None = Field(None, description="seconds an idle session lives; every write restarts it")
