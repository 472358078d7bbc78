"""The hooks a chatkeep plugin may implement.

A plugin is a module (or object) registered under the ``chatkeep`` entry-point group::

    [project.entry-points.chatkeep]
    redis = "chatkeep.redis._plugin"

whose functions are marked with :data:`chatkeep.core.backend.hookimpl`.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from chatkeep.core.backend._spec import PROJECT, BackendSpec

__all__ = ["chatkeep_register_backends", "hookspec"]

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def chatkeep_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Register storage backends by calling ``register(BackendSpec(...))`` once per backend.

    The host validates what is registered (duplicate names and schemes, core compatibility), so a
    plugin only describes its backends here and imports its driver lazily in ``BackendSpec.open``.
    """
