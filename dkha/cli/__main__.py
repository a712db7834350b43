"""``python -m dkha.cli``: the ``dkha`` command."""

import sys

from dkha.cli import main

sys.exit(main())
