"""Entry point for `python -m engine`."""

import sys

from engine.service.cli import main

sys.exit(main())
