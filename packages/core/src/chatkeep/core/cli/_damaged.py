"""How commands that walk many sessions (``sessions list``, ``export``, ``copy``) meet a damaged one.

A session whose stored document, metadata or a record no longer decodes is never passed over in silence.
By default the command stops there, names the session and what is wrong, and exits 1. With
``--skip-damaged`` it names each damaged session on stderr, goes on with the others, and exits
:data:`EXIT_SKIPPED` (3), so a script can tell "done, but not everything" from "done" (0) and from "failed" (1).
An entry so damaged that it no longer says which session it is (a listing's :class:`DamagedListingError`) is
treated the same way, named by where it is stored.
"""

from __future__ import annotations

import argparse
from typing import Any

from chatkeep.core._errors import ChatkeepError, DamagedListingError, MessageFormatError, SessionFormatError
from chatkeep.core.backend import HistoryStore, SessionKey, SessionPage
from chatkeep.core.cli._output import plural, printable, say

__all__ = ["DAMAGE", "EXIT_SKIPPED", "DamagedSessionError", "DamagedSessions", "list_page"]

#: What a store raises for a session it stored and can no longer read (each names the session).
DAMAGE = (SessionFormatError, MessageFormatError)
#: The exit status of a command that finished but skipped damaged sessions (``--skip-damaged``).
EXIT_SKIPPED = 3


class DamagedSessionError(ChatkeepError):
    """A command stopped at a damaged session (without ``--skip-damaged``)."""


class DamagedSessions:
    """The damaged sessions one command met: stop at the first, or (``--skip-damaged``) name each and go on."""

    def __init__(self, args: argparse.Namespace, command: str, *, after: str) -> None:
        """``after`` says what holds when the command stops at a damaged session (what it did before)."""
        self.skip = bool(getattr(args, "skip_damaged", False))
        self.command = command
        self.after = after
        self.skipped: list[dict[str, Any]] = []
        self._entries: set[str] = set()  # damaged entries without a session already named (each page names them)

    def found(self, key: SessionKey, error: BaseException, *, note: str = "") -> None:
        """Report the damaged session at ``key``: raise :class:`DamagedSessionError`, or name it and record it."""
        where = f"session {printable(repr(key.session_id))} of tenant {printable(repr(key.tenant))}"
        record = {"tenant": key.tenant, "session_id": key.session_id}
        self._found(where, f"damaged {where}{note}", str(error), error, record)

    def found_in_listing(self, tenant: str, error: DamagedListingError) -> None:
        """Report the entries a listing of ``tenant`` could not name a session for (each once), as :meth:`found`."""
        for entry in error.entries:
            if entry not in self._entries:
                self._entries.add(entry)
                where = f"an entry of tenant {printable(repr(tenant))} that names no session"
                self._found(where, f"a damaged {where[3:]}", entry, error, {"tenant": tenant, "session_id": None})

    def _found(self, where: str, skipped: str, why: str, error: BaseException, record: dict[str, Any]) -> None:
        """Stop at ``where`` (raise), or name what is ``skipped`` on stderr and record it."""
        if not self.skip:
            raise DamagedSessionError(
                f"{self.command} stopped at {where}, which is damaged: {why.rstrip('.')}. {self.after}. Add "
                f"--skip-damaged to {self.command} the other sessions (each damaged one is named, and the exit "
                f"status is {EXIT_SKIPPED})"
            ) from error
        say(f"chatkeep: skipped {skipped}: {why}", err=True)
        self.skipped.append({**record, "error": why})

    def exit_status(self, status: int = 0) -> int:
        """``status``, or :data:`EXIT_SKIPPED` when it is 0 and sessions were skipped."""
        return EXIT_SKIPPED if status == 0 and self.skipped else status

    def summary(self) -> str:
        """The closing line about skipped sessions ("" when none was)."""
        if not self.skipped:
            return ""
        return f"skipped {plural(len(self.skipped), 'damaged session')} (named above); exit status {EXIT_SKIPPED}"


async def list_page(
    store: HistoryStore, tenant: str, damage: DamagedSessions, *, limit: int, cursor: str | None = None
) -> SessionPage:
    """One page of ``tenant``'s sessions; entries the store cannot name a session for go to ``damage``.

    Without ``--skip-damaged`` that stops the command, naming them; with it, the page holds the other sessions.
    """
    try:
        return await store.list_sessions(tenant, limit=limit, cursor=cursor)
    except DamagedListingError as exc:
        damage.found_in_listing(tenant, exc)
        return exc.page  # type: ignore[no-any-return]
