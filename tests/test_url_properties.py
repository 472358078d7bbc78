"""Property tests of store URLs (with Hypothesis): any string opens a store or raises a ChatkeepError, nothing else.

Every installed backend's plugin is discovered for real. Opening a store connects to nothing (the first call
does), so random URLs are safe to open; the hosts are loopback ones anyway, and each store is closed unused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from hypothesis import event, given, settings
from hypothesis import strategies as st

from chatkeep.core import ChatkeepError, history_provider, open_store
from chatkeep.core._known_backends import KNOWN_SCHEMES
from chatkeep.testing.conformance import PROPERTY_SETTINGS

_schemes = st.sampled_from([*sorted(KNOWN_SCHEMES), "sqlite+aiosqlite", "postgresql+asyncpg", "mysql+asyncmy", "s3"])
_hosts = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", "127.0.0.1:1", "user:secret@127.0.0.1:9"])
_options = st.sampled_from(
    [
        "ttl",
        "max_message_bytes",
        "prefix",
        "schema",
        "synchronous",
        "busy_timeout",
        "pool_size",
        "connect_timeout",
        "statement_timeout",
    ]
)
_values = st.one_of(st.text(st.characters(), max_size=12), st.integers(-5, 10**7).map(str), st.just(""))
_query = st.lists(st.tuples(_options | st.text(max_size=8), _values), max_size=3).map(
    lambda pairs: "&".join(f"{quote(k)}={quote(v, safe='', errors='surrogatepass')}" for k, v in pairs)
)


@st.composite
def _urls(draw: st.DrawFn) -> str:
    """A URL of a known scheme on a loopback host with a random path and options, or any text at all."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.text(st.characters(), max_size=40))
    path = draw(st.text(st.characters(), max_size=12))
    query = draw(st.just("") | _query)
    return f"{draw(_schemes)}://{draw(_hosts)}/{path}" + (f"?{query}" if query else "")


_keywords = st.just({}) | st.dictionaries(
    _options, st.one_of(_values, st.integers(-5, 10**7), st.none(), st.floats()), max_size=2
)
#: No I/O per example, so more of them than the kit's.
_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=150)


@given(url=_urls(), options=_keywords)
@_SETTINGS
async def test_open_store_of_any_url_opens_or_raises_a_chatkeep_error(url: str, options: dict[str, Any]) -> None:
    try:
        store = open_store(url, **options)
    except ChatkeepError as exc:
        event(type(exc).__name__)  # --hypothesis-show-statistics shows the mix of outcomes
        return
    event("opened")
    await store.close()  # opened without I/O: nothing to connect, nothing left behind


@given(url=_urls(), options=_keywords)
@_SETTINGS
async def test_history_provider_of_any_url_opens_or_raises_a_chatkeep_error(url: str, options: dict[str, Any]) -> None:
    try:
        provider = history_provider(url, store_options=options)
    except ChatkeepError as exc:
        event(type(exc).__name__)
        return
    event("opened")
    await provider.store.close()
