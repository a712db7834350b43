"""``python -m dkha.cli``: the ``dkha`` command."""

import sys

from dkha.cli.main import main

sys.exit(main())
