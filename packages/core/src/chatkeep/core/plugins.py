"""Backend plugins: discovery through entry points with pluggy, and opening stores by URL.

Discovery runs once, lazily (at agent construction or the first :func:`open_store`). Each plugin is
loaded and called on its own, so one broken plugin does not stop the others; what failed is kept and
named in the error a user sees when they ask for a backend that is not there.

Environment variables:
    CHATKEEP_PLUGINS: comma-separated entry-point names to load (an allow-list); unset loads all.
    CHATKEEP_DISABLE_PLUGIN_AUTOLOAD: when set to a true value, no entry point is loaded; plugins
        registered in-process with :func:`register_plugin` still work.
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from chatkeep.core._errors import (
    BackendConflictError,
    IncompatiblePluginError,
    InvalidArgumentTypeError,
    StoreConfigurationError,
    UnknownBackendError,
    redact_url,
)
from chatkeep.core._known_backends import KNOWN_BACKENDS, KNOWN_SCHEMES
from chatkeep.core._version import __version__
from chatkeep.core.backend import BackendSpec, HistoryStore, hookimpl, hookspecs

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendInfo",
    "BackendSpec",
    "PluginRegistry",
    "default_registry",
    "hookimpl",
    "installed_backends",
    "open_store",
    "plugin_failures",
    "register_plugin",
]

log = logging.getLogger("chatkeep.plugins")

ENTRY_POINT_GROUP = "chatkeep"
CORE_DISTRIBUTION = "chatkeep-core"

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class BackendInfo:
    """An installed backend and the distribution that provides it."""

    name: str
    schemes: tuple[str, ...]
    distribution: str
    version: str
    description: str
    spec: BackendSpec


def _core_version() -> str:
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source tree
        return __version__


def _core_extras() -> set[str]:
    """The extras this chatkeep-core declares (a backend's extra exists once its distribution is released)."""
    try:
        return set(metadata.metadata(CORE_DISTRIBUTION).get_all("Provides-Extra") or [])
    except metadata.PackageNotFoundError:
        return set()


def _incompatibility(dist: metadata.Distribution | None, core_version: str) -> str | None:
    """Why ``dist`` cannot run with this core (its ``chatkeep-core`` requirement), or ``None``."""
    if dist is None:
        return None
    try:
        version = Version(core_version)
    except InvalidVersion:
        return None
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != CORE_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            name = dist.metadata["Name"]
            return (
                f"{name} {dist.version} was built for chatkeep-core{req.specifier}, but chatkeep-core {core_version} "
                f'is installed; run pip install -U "{name}" "chatkeep-core" to get versions that fit'
            )
    return None


def _check_url(url_or_name: object) -> None:
    if not isinstance(url_or_name, str):
        raise InvalidArgumentTypeError(
            f"a store is opened by its URL (a str), got {type(url_or_name).__name__}; "
            "pass a URL such as 'sqlite:///history.db' or 'memory://'"
        )
    if not url_or_name.strip():
        raise StoreConfigurationError(
            "the store URL is empty (an unset variable?); pass a URL such as 'sqlite:///history.db' or 'memory://'"
        )


class PluginRegistry:
    """Finds backend plugins and opens stores by URL. Most code uses the module functions instead."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, *, released_extras: set[str] | None = None) -> None:
        self.group = group
        # The chatkeep-core extras that exist, so an install hint never names one that pip would not find.
        self.released_extras = released_extras if released_extras is not None else _core_extras()
        self._pm = pluggy.PluginManager("chatkeep")
        self._pm.add_hookspecs(hookspecs)
        self._lock = threading.RLock()
        self._discovered = False
        self._backends: dict[str, BackendInfo] = {}
        self._schemes: dict[str, str] = {}
        self._conflicts: dict[str, list[str]] = {}
        self._failures: dict[str, str] = {}
        self._incompatible: dict[str, str] = {}  # entry-point name -> why it was refused
        self._sources: dict[str, tuple[str, str]] = {}  # plugin name -> (distribution, version)

    # -- discovery -------------------------------------------------------------------------------

    def discover(self) -> None:
        """Load the entry-point plugins once (later calls do nothing)."""
        with self._lock:
            if self._discovered:
                return
            self._discovered = True
            if os.environ.get("CHATKEEP_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in _TRUE:
                log.debug("plugin autoload disabled by CHATKEEP_DISABLE_PLUGIN_AUTOLOAD")
            else:
                self._load_entry_points()
            for name in list(self._sources):
                self._collect(name)

    def _load_entry_points(self) -> None:
        allowed_env = os.environ.get("CHATKEEP_PLUGINS")
        allowed = None if allowed_env is None else {n.strip() for n in allowed_env.split(",") if n.strip()}
        core_version = _core_version()
        for ep in metadata.entry_points(group=self.group):
            if allowed is not None and ep.name not in allowed:
                continue
            if ep.name in self._sources or self._pm.has_plugin(ep.name):
                continue
            dist = ep.dist
            reason = _incompatibility(dist, core_version)
            if reason is not None:
                self._failures[ep.name] = reason
                self._incompatible[ep.name] = reason
                log.warning("chatkeep plugin %r refused: %s", ep.name, reason)
                continue
            try:
                plugin = ep.load()
                self._pm.register(plugin, name=ep.name)
            except Exception as exc:
                self._failures[ep.name] = f"it failed to load ({type(exc).__name__}: {exc})"
                log.warning("chatkeep plugin %r is unusable: %s", ep.name, self._failures[ep.name])
                log.debug("chatkeep plugin %r failed to load", ep.name, exc_info=True)
                continue
            self._sources[ep.name] = (dist.metadata["Name"] if dist else ep.value, dist.version if dist else "?")

    def register_plugin(self, plugin: object, *, name: str | None = None) -> None:
        """Register a plugin object in-process (for applications and tests); its backends are usable at once."""
        with self._lock:
            name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
            self._pm.register(plugin, name=name)
            self._sources[name] = (f"{name} (registered in-process)", "")
            if self._discovered:
                self._collect(name)

    def unregister_plugin(self, name: str) -> None:
        """Remove an in-process plugin and its backends (mainly for tests)."""
        with self._lock:
            if self._pm.has_plugin(name):
                self._pm.unregister(name=name)
            distribution = self._sources.pop(name, ("", ""))[0]
            for backend in [b for b in self._backends.values() if b.distribution == distribution]:
                del self._backends[backend.name]
                for scheme in backend.schemes:
                    if self._schemes.get(scheme.lower()) == backend.name:
                        del self._schemes[scheme.lower()]

    def _collect(self, plugin_name: str) -> None:
        plugin = self._pm.get_plugin(plugin_name)
        distribution, version = self._sources[plugin_name]
        impls = [i for i in self._pm.hook.chatkeep_register_backends.get_hookimpls() if i.plugin is plugin]
        # Check only this plugin's hooks (pm.check_pending() would blame it for another plugin's unknown hook).
        unknown = sorted(
            name
            for name, caller in vars(self._pm.hook).items()
            if isinstance(caller, pluggy.HookCaller)
            and not caller.has_spec()
            and any(i.plugin is plugin and not i.optionalhook for i in caller.get_hookimpls())
        )
        if unknown:
            self._failures[plugin_name] = (
                f"it implements hooks chatkeep does not define: {', '.join(unknown)} "
                "(check their names against chatkeep.core.backend.hookspecs)"
            )
            self._pm.unregister(plugin)
            return

        def register(spec: BackendSpec) -> None:
            self._add(spec, distribution, version)

        for impl in impls:
            try:
                impl.function(register=register)
            except Exception as exc:
                self._failures[plugin_name] = (
                    f"its chatkeep_register_backends hook failed ({type(exc).__name__}: {exc})"
                )
                log.warning("chatkeep plugin %r is unusable: %s", plugin_name, self._failures[plugin_name])
                log.debug("chatkeep plugin %r failed to register its backends", plugin_name, exc_info=True)

    def _add(self, spec: BackendSpec, distribution: str, version: str) -> None:
        if not isinstance(spec, BackendSpec):
            raise InvalidArgumentTypeError(f"register() takes a BackendSpec, got {type(spec).__name__}")
        label = f"{distribution} {version}".strip()
        existing = self._backends.get(spec.name)
        if existing is not None and existing.distribution != distribution:
            self._conflicts.setdefault(
                f"backend {spec.name!r}", [f"{existing.distribution} {existing.version}".strip()]
            )
            self._conflicts[f"backend {spec.name!r}"].append(label)
            return
        for scheme in spec.schemes:
            owner = self._schemes.get(scheme.lower())
            if owner is not None and owner != spec.name:
                other = self._backends[owner]
                self._conflicts.setdefault(f"scheme {scheme!r}://", [f"{other.distribution} {other.version}".strip()])
                self._conflicts[f"scheme {scheme!r}://"].append(label)
        self._backends[spec.name] = BackendInfo(spec.name, spec.schemes, distribution, version, spec.description, spec)
        for scheme in spec.schemes:
            self._schemes.setdefault(scheme.lower(), spec.name)

    # -- lookup ----------------------------------------------------------------------------------

    def backends(self) -> list[BackendInfo]:
        """The installed backends, by name."""
        self.discover()
        return sorted(self._backends.values(), key=lambda b: b.name)

    def failures(self) -> dict[str, str]:
        """Plugins that could not be used, with the reason."""
        self.discover()
        return dict(self._failures)

    def resolve(self, url_or_name: str) -> BackendSpec:
        """The backend for a URL (by its scheme), a backend name (``"redis"``) or a bare scheme (``"sqlite"``).

        :meth:`BackendSpec.open_store` turns the same word into the URL it stands for.

        Raises:
            UnknownBackendError: nothing installed handles it; the message says what to install.
            BackendConflictError: two plugins claim it.
        """
        _check_url(url_or_name)
        self.discover()
        if "://" in url_or_name:
            scheme = url_or_name.split("://", 1)[0].lower()
            candidates = [scheme] if "+" not in scheme else [scheme, scheme.split("+", 1)[0]]
            for candidate in candidates:
                self._raise_if_conflicting(f"scheme {candidate!r}://")
                name = self._schemes.get(candidate)
                if name is not None:
                    self._raise_if_conflicting(f"backend {name!r}")
                    return self._backends[name].spec
            known = next((KNOWN_SCHEMES[c][0] for c in candidates if c in KNOWN_SCHEMES), None)
            self._raise_if_incompatible(known)
            raise UnknownBackendError(self._unknown_message(url_or_name, candidates))
        self._raise_if_conflicting(f"backend {url_or_name!r}")
        info = self._backends.get(url_or_name)
        if info is not None:
            return info.spec
        if url_or_name.lower() in self._schemes:  # a bare scheme ("sqlite") stands for its URL with nothing after ://
            return self.resolve(f"{url_or_name}://")
        self._raise_if_incompatible(url_or_name)
        if url_or_name.lower() in KNOWN_SCHEMES:
            self._raise_if_incompatible(KNOWN_SCHEMES[url_or_name.lower()][0])
            raise UnknownBackendError(self._unknown_message(url_or_name, [url_or_name.lower()]))
        raise UnknownBackendError(self._unknown_message(url_or_name, None))

    def _raise_if_incompatible(self, backend: str | None) -> None:
        if backend is not None and backend in self._incompatible:
            raise IncompatiblePluginError(
                f"the {backend!r} backend is installed but refused: {self._incompatible[backend]}"
            )

    def _raise_if_conflicting(self, what: str) -> None:
        claimants = self._conflicts.get(what)
        if claimants:
            raise BackendConflictError(
                f"{what} is claimed by more than one installed plugin: {' and '.join(claimants)}; uninstall one, "
                "or list the plugins to load in CHATKEEP_PLUGINS"
            )

    def _unknown_message(self, url_or_name: str, schemes: list[str] | None) -> str:
        shown = redact_url(url_or_name)
        installed = (
            ", ".join(f"{b.name} ({', '.join(s + '://' for s in b.schemes)})" for b in self.backends()) or "none"
        )
        if schemes is None:
            head = f"no installed chatkeep backend is named {shown!r}"
            known = (url_or_name, *KNOWN_BACKENDS[url_or_name]) if url_or_name in KNOWN_BACKENDS else None
        else:
            head = f"no installed chatkeep backend handles {shown!r}"
            known = next((KNOWN_SCHEMES[s] for s in schemes if s in KNOWN_SCHEMES), None)
        parts = [f"{head}. Installed backends: {installed}."]
        if known is not None:
            backend, extra, what = known
            if backend in self._failures:
                parts.append(f"The {backend!r} plugin for {what} is installed but unusable: {self._failures[backend]}.")
            elif extra not in self.released_extras:
                parts.append(
                    f"{what} needs the {backend!r} backend, which is not released yet for this chatkeep-core; "
                    "use an installed backend for now"
                )
            else:
                parts.append(
                    f'{what} needs the {backend!r} backend; install it with: pip install "chatkeep-core[{extra}]"'
                )
        else:
            known_list = ", ".join(sorted(f"{s}://" for s in KNOWN_SCHEMES))
            parts.append(f"Check the spelling; the schemes chatkeep knows are {known_list}.")
        for plugin, reason in sorted(self._failures.items()):
            if known is None or plugin != known[0]:
                parts.append(f"Plugin {plugin!r} is installed but unusable: {reason}.")
        return " ".join(parts)

    def open_store(self, url_or_name: str, **options: Any) -> HistoryStore:
        """Open the store a URL or a bare backend name names (no I/O happens until the store is first used)."""
        return self.resolve(url_or_name).open_store(url_or_name, **options)


_registry = PluginRegistry()


def default_registry() -> PluginRegistry:
    """The process-wide registry the module functions use."""
    return _registry


def open_store(url: str, **options: Any) -> HistoryStore:
    """Open a history store by URL, e.g. ``open_store("memory://")``; the scheme picks the backend.

    A backend's bare name opens its default URL (``open_store("redis")`` is ``redis://localhost:6379/0``), and a
    bare scheme opens that scheme with nothing after ``://`` (``open_store("sqlite")`` is ``sqlite://``).

    Raises:
        UnknownBackendError: no installed backend handles the scheme; the message names the extra to install.
        InvalidArgumentTypeError: ``url`` is not a string.
        StoreConfigurationError: ``url`` is empty, or the backend refuses it or an option.
    """
    return _registry.open_store(url, **options)


def register_plugin(plugin: object, *, name: str | None = None) -> None:
    """Register a plugin object in-process (its ``chatkeep_register_backends`` hook is called at once)."""
    _registry.register_plugin(plugin, name=name)


def installed_backends() -> list[BackendInfo]:
    """The backends installed plugins provide."""
    return _registry.backends()


def plugin_failures() -> dict[str, str]:
    """Plugins that were found but could not be used, with the reason."""
    return _registry.failures()
