"""Plain-file helpers every writer shares: what an existing path is, and a file written whole or not at all.

A command only ever replaces a regular file: a device, a FIFO or a socket at the path is named by `special_kind`
and refused by the caller. `write_whole` writes bytes to a temporary file beside the target, syncs it, renames it
over the target and syncs the folder, so a reader finds the old file or the complete new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def kind_of_mode(mode: int) -> str | None:
    """What a file of this mode is, in words, when it is not a regular file; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def special_kind(path: Path) -> str | None:
    """What exists at ``path`` (symlinks followed) when it is not a regular file; None when it is one or nothing
    is there."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return kind_of_mode(mode)


def same_file(one: Path, other: Path) -> bool:
    """Whether two paths name the same file: equal once resolved, or one inode under two names (a hard link)."""
    try:
        if one.resolve() == other.resolve():
            return True
        return os.path.samefile(one, other)
    except (OSError, RuntimeError):
        return False


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable, where the file system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refuse_special(target: Path) -> None:
    kind = special_kind(target)
    if kind is not None:
        raise ValueError(f"{target} is {kind}, not a regular file: only a regular file is ever replaced")


def write_whole(target: Path, payload: bytes, mode: int | None = None) -> None:
    """Write ``payload`` to ``target`` completely or not at all: a synced temporary file renamed over it.

    Refuses (ValueError) a target that exists and is not a regular file; an OSError (a full disk) leaves whatever
    was at ``target`` as it was and no temporary file behind."""
    _refuse_special(target)
    temporary = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        _refuse_special(target)  # again at the last moment: something may have been put there meanwhile
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_folder(target.parent)
