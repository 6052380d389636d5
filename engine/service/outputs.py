"""The files commands write (reports, exports, JSON results): checked and written in this one place.

An output path is refused with one line when it resolves (symlinks followed, hard links compared) to the store's
database or one of its -wal, -shm or -journal files, to a folder, or into a folder that does not exist. An existing
file is replaced atomically: the new bytes go to a temporary file beside it, are flushed to disk, and are then
renamed over it, so a failure (a full disk, no permission) leaves the old file whole. Anything at the path that is
not a regular file (a device such as /dev/null, a FIFO, a socket) is refused: it is never replaced nor written
into. Every refusal and failure is an OutputError: one line, exit 2.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from foundation.errors import SpectuneError
from foundation.paths import default_database_url, home_path
from store.db import sqlite_path
from store.files import kind_of_mode, write_whole

# the SQLite database and the files SQLite keeps beside it
STORE_FILES = {
    "": "database",
    "-wal": "database's write-ahead log",
    "-shm": "database's shared-memory index",
    "-journal": "database's journal",
}

# what an operating-system error means to the user: the environment, not a bug
_OS_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
}


class OutputError(SpectuneError):
    """An output file that may not or cannot be written; the message names the option, the path and why."""


def store_files() -> list[tuple[Path, str]]:
    """The files of the store every command opens (the SQLite database and its journals, each with what it is),
    and those of the one in SPECTUNE_HOME when SPECTUNE_DB_URL names another; none for a server database."""
    databases: list[Path] = []
    for url in (default_database_url(create=False), f"sqlite:///{home_path() / 'spectune.db'}"):
        try:
            path = sqlite_path(make_url(url))
        except ArgumentError:  # a malformed SPECTUNE_DB_URL: opening the store says so
            continue
        if path is not None and path not in databases:
            databases.append(path)
    return [(Path(f"{db}{suffix}"), what) for db in databases for suffix, what in STORE_FILES.items()]


def _same_file(resolved: Path, protected: Path) -> bool:
    try:
        if resolved == protected.resolve():
            return True
        return resolved.exists() and protected.exists() and os.path.samefile(resolved, protected)
    except (OSError, RuntimeError):
        return False


def os_error_reason(exc: OSError) -> str | None:
    """What an OSError from writing a file means, as words (the disk is full, permission denied…); None when it is
    not one the user's environment explains."""
    reason = _OS_REASONS.get(exc.errno or 0)
    if reason is None:
        return None
    detail = exc.strerror or ""
    return f"{reason} ({detail})" if detail and detail.lower() != reason else reason


def check_output(path: str | os.PathLike[str], option: str = "") -> Path:
    """The file `path` names, resolved, when a command may write it there; OutputError saying why not (among the
    reasons: something there that is not a regular file, such as a device, a FIFO or a socket).

    `option` (e.g. "--out") opens the message; without it the message starts at the path (argparse adds it)."""
    text = os.fspath(path)
    label = f"{option} {text}" if option else text
    if not text.strip():
        raise OutputError(f"{option or 'output'}: no file named")
    named = Path(text)
    try:
        resolved = named.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise OutputError(f"{label}: the path cannot be resolved ({exc})") from None
    for protected, what in store_files():
        if _same_file(resolved, protected):
            raise OutputError(
                f"{label}: that is spectune's {what} ({protected}); writing there would destroy every session: "
                "choose another file"
            )
    try:
        mode: int | None = os.stat(named).st_mode  # symlinks followed
    except OSError:
        mode = None
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise OutputError(f"{label}: is a folder; name a file in it")
        if (kind := kind_of_mode(mode)) is not None:
            raise OutputError(f"{label}: is {kind}, not a regular file; it was left as it is: name a regular file")
        if not os.access(named, os.W_OK):
            raise OutputError(f"{label}: the file is read-only (permission denied); it was left as it is")
        return resolved
    parent = resolved.parent
    if not parent.exists():
        raise OutputError(f"{label}: folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"{label}: {parent} is not a folder")
    return resolved


def check_output_folder(path: str | os.PathLike[str], option: str = "") -> Path:
    """The folder `path` names, resolved, when files may be written into it; OutputError saying why not."""
    text = os.fspath(path)
    label = f"{option} {text}" if option else text
    folder = Path(text).resolve()
    if not folder.exists():
        raise OutputError(f"{label}: folder does not exist")
    if not folder.is_dir():
        raise OutputError(f"{label}: not a folder")
    return folder


def write_output(path: str | os.PathLike[str], data: str | bytes, option: str = "") -> Path:
    """Write `data` (text as UTF-8) to `path` as check_output allows; an existing file is replaced atomically.
    Returns the path written."""
    target = check_output(path, option)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    label = f"{option} {os.fspath(path)}" if option else os.fspath(path)
    try:
        write_whole(target, payload, stat.S_IMODE(target.stat().st_mode) if target.exists() else None)
    except ValueError as exc:  # something not a regular file appeared there after the check
        raise OutputError(f"{label}: {exc}; it was left as it is") from None
    except OSError as exc:
        reason = os_error_reason(exc) or exc.strerror or str(exc)
        raise OutputError(f"{label}: cannot be written: {reason}; a file there was left as it was") from None
    return target


def output_file(value: str) -> str:
    """argparse `type` for an option naming a file to write: refused at parse time, before anything is loaded."""
    try:
        check_output(value)
    except OutputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def output_folder(value: str) -> str:
    """argparse `type` for an option naming a folder to write files into."""
    try:
        check_output_folder(value)
    except OutputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def run_command(main: Callable[..., int], *args: Any) -> NoReturn:
    """Exit with `main(*args)`'s status; where its output could not be written after all (a full disk, say), one
    line naming the file, exit 2."""
    try:
        status = main(*args)
    except OutputError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        status = 2
    sys.exit(status)
