"""The WAL and shared-memory files a deleted SQLite database leaves at its path: in use, or safe to set aside.

A database deleted or moved while a process had it open leaves ``<path>-wal`` and ``<path>-shm`` behind. While
any process still has that database open, a new file at the path would take over (and empty) the WAL its writer
uses, so nothing may be created there. Once none has, the leftovers belong to no file: a new database at the path
would read the old WAL's pages as its own. They are then renamed aside and a new database can start.

In use means: this process has either file open, or another process holds SQLite's lock on the shared-memory
file. Every connection to a WAL database holds a shared lock on that file's "DMS" byte (byte 128 in SQLite's unix
VFS) for as long as it is open, so an exclusive lock that cannot be taken there says another process is using it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

SHM_DMS_BYTE = 128  # UNIX_SHM_BASE (120) + SQLITE_SHM_NLOCK (8): shared-locked by every open connection
SUFFIXES = ("-wal", "-shm")


def identity(path: Path | str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``; None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def open_in_this_process(file: tuple[int, int]) -> str | None:
    """A /proc path through which this process reads the file of that (device, inode), or None (none, or not
    Linux)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        link = f"/proc/self/fd/{name}"
        if identity(link) == file:
            return link
    return None


def leftovers(database: Path) -> list[Path]:
    """The WAL and shared-memory files at ``database``'s path while the database file itself is missing."""
    if database.exists():
        return []
    return [Path(f"{database}{suffix}") for suffix in SUFFIXES if Path(f"{database}{suffix}").exists()]


def in_use(database: Path) -> bool:
    """Whether any process (this one included) still has the database behind these leftovers open; True when it
    cannot be told."""
    for path in leftovers(database):
        file = identity(path)
        if file is not None and open_in_this_process(file) is not None:
            return True
    shm = Path(f"{database}-shm")
    try:
        fd = os.open(shm, os.O_RDWR)
    except FileNotFoundError:
        return False  # a WAL database is never open without its shared memory
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, SHM_DMS_BYTE)
    except OSError:
        return True  # another process's connection holds its shared lock
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, SHM_DMS_BYTE)
        return False
    finally:
        os.close(fd)


def set_aside(database: Path, now: float | None = None) -> list[Path]:
    """Rename the leftovers of a deleted database to ``<name>-wal.left-DATE-TIME`` (and ``-shm``); the new
    names. Call it only when `in_use` is False."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    moved = []
    for path in leftovers(database):
        target = path.with_name(f"{path.name}.left-{stamp}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
            moved.append(target)
    return moved
