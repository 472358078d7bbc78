"""The ``chatkeep`` command line: inspect stores, export and import, copy between backends, prune, migrate, chat.

Run ``chatkeep --help``; ``docs/cli.md`` describes every command, its ``--json`` output and its exit codes.
"""

from chatkeep.core.cli._app import main

__all__ = ["main"]
