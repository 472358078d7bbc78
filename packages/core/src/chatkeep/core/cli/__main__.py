"""``python -m chatkeep.core.cli``: the same as the ``chatkeep`` command."""

import sys

from chatkeep.core.cli._app import main

sys.exit(main())
