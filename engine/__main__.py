"""Entry point for `python -m engine`."""

import sys

from engine.cli import main

sys.exit(main())
