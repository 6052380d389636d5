"""Where spectune keeps its files: one data directory, overridable by environment.

SPECTUNE_HOME holds the SQLite database and run artifacts (default: ``.spectune`` in the
project root). Converted model caches are large and shared by every checkout, so they live
under SPECTUNE_MODEL_CACHE (default: ``~/.cache/spectune/models``).
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def spectune_home() -> Path:
    home = Path(os.environ.get("SPECTUNE_HOME", PROJECT_ROOT / ".spectune"))
    home.mkdir(parents=True, exist_ok=True)
    return home


def model_cache_dir() -> Path:
    default = Path.home() / ".cache" / "spectune" / "models"
    path = Path(os.environ.get("SPECTUNE_MODEL_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_database_url() -> str:
    return os.environ.get("SPECTUNE_DB_URL") or f"sqlite:///{spectune_home() / 'spectune.db'}"
