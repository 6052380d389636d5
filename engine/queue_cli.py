"""CLI commands that talk to the store: worker, submit, sessions, recommend (filled in with the store)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def add_commands(sub: Any, add_run_options: Callable[[argparse.ArgumentParser, bool], None]) -> None:
    """Register the queue commands on the main parser."""
