"""``python -m splitinfer`` is the ``splitinfer`` command."""

import sys

from .cli import main

sys.exit(main())
