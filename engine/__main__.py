"""Entry point for `python -m engine`."""

import sys

from engine.service.cli.main import main

sys.exit(main())
