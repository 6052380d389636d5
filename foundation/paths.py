"""Where spectune keeps its files: one data directory, overridable by environment.

SPECTUNE_HOME holds the SQLite database and run artifacts (default: ``.spectune`` in the
project root). Converted model caches are large and shared by every checkout, so they live
under SPECTUNE_MODEL_CACHE (default: ``~/.cache/spectune/models``). A folder that cannot be
made (the variable names a file, or a path under one, or a place without permission) is one
clear SpectuneError naming the variable, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from foundation.errors import SpectuneError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def home_path() -> Path:
    """The data folder SPECTUNE_HOME names (default: ``.spectune`` in the project root), not created."""
    return Path(os.environ.get("SPECTUNE_HOME", PROJECT_ROOT / ".spectune"))


def spectune_home() -> Path:
    """The data folder, created when missing; SpectuneError when it cannot be a folder."""
    return _folder(home_path(), "SPECTUNE_HOME")


def model_cache_dir() -> Path:
    """The converted-model cache (SPECTUNE_MODEL_CACHE), created when missing; SpectuneError when it cannot be."""
    default = Path.home() / ".cache" / "spectune" / "models"
    return _folder(Path(os.environ.get("SPECTUNE_MODEL_CACHE", default)), "SPECTUNE_MODEL_CACHE")


def _folder(path: Path, variable: str) -> Path:
    """`path` made a folder (with its parents); the reason it cannot be, as one line naming `variable`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise SpectuneError(f"{variable}={path} is a file, not a folder: set {variable} to a folder") from None
    except NotADirectoryError:
        raise SpectuneError(
            f"{variable}={path} cannot be made: part of that path is a file, not a folder; set {variable} to a folder"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SpectuneError(f"{variable}={path} cannot be made ({reason}): set {variable} to a folder you can "
                            "write") from None  # fmt: skip
    return path


def default_database_url(create: bool = True) -> str:
    """The database URL every command and page opens: SPECTUNE_DB_URL, else the SQLite file in the data folder
    (the folder made if missing, unless `create` is False)."""
    if os.environ.get("SPECTUNE_DB_URL"):
        return os.environ["SPECTUNE_DB_URL"]
    home = spectune_home() if create else home_path()
    return f"sqlite:///{home / 'spectune.db'}"
