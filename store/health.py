"""The database's health: damage found on open (SQLite's quick_check), and a consistent copy made while in use.

`check_on_open` runs `PRAGMA quick_check` at most once a minute per process and database file, and warns on every
open while the last check found damage; a store that found damage takes no new work (store.sessions refuses to
queue or hand out a session; `damage_refusal` says why and the way out). `backup_checked` copies a live SQLite
database with SQLite's online backup API (a consistent snapshot, even with a worker writing), checks the copy with
integrity_check, and renames it over the destination; store.recovery recovers and restores.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, text

from store.db import engine_where, sqlite_path
from store.errors import StoreError, translated
from store.files import fsync_folder, same_file, special_kind
from store.recovery import integrity_problem

log = logging.getLogger("spectune.store")

CHECK_EVERY_S = 60.0
_checked: dict[str, tuple[float, str | None]] = {}  # database path -> (when checked, damage found or None)


def quick_check(engine: Engine) -> str | None:
    """What SQLite's quick_check finds wrong with the database, in one line; None when it is sound (or not
    SQLite)."""
    if sqlite_path(engine.url) is None:
        return None
    with translated(engine_where(engine)), engine.connect() as conn:
        rows = [str(row[0]) for row in conn.execute(text("PRAGMA quick_check"))]
    if rows == ["ok"]:
        return None
    return "; ".join(rows[:3]) + (f" (and {len(rows) - 3} more)" if len(rows) > 3 else "")


WAY_OUT = (
    "python -m engine backup --out FILE copies it aside (the copy is checked; --recover saves what can be read "
    "into a new file), python -m engine restore FILE puts a good backup back (no worker running), "
    "or SPECTUNE_DB_URL names a new database"
)


def damage_note(where: str, found: str) -> str:
    """The warning for a damaged database: what was found, and what to do."""
    return (
        f"warning: database {where} is damaged (quick_check: {found}); nothing new is written into it until it is "
        f"replaced: {WAY_OUT}"
    )


def damage_refusal(where: str, found: str, what: str) -> str:
    """Why ``what`` (e.g. "queuing a session") is refused on a damaged database, and the way out."""
    return f"{what} refused: database {where} is damaged (quick_check: {found}); {WAY_OUT}"


def check_on_open(engine: Engine, now: float | None = None) -> str | None:
    """The damage found in the database (checked at most once a minute per process), warned about each time;
    None when sound. A check that cannot run (locked) is skipped, not an error."""
    path = sqlite_path(engine.url)
    if path is None:
        return None
    key = str(path.resolve())
    now = time.monotonic() if now is None else now
    last = _checked.get(key)
    if last is None or now - last[0] >= CHECK_EVERY_S:
        try:
            last = (now, quick_check(engine))
        except StoreError as exc:
            if "corrupt" not in str(exc):
                log.info("quick_check skipped: %s", exc)
                return None
            cause = exc.__cause__ or exc
            last = (now, str(getattr(cause, "orig", cause)).splitlines()[0])
        _checked[key] = last
    if last[1] is not None:
        log.warning(damage_note(engine_where(engine), last[1]))
    return last[1]


def forget_check(path: Path) -> None:
    """Drop the last check of the database at ``path`` (it was replaced): the next open checks it afresh."""
    _checked.pop(str(path.resolve()), None)


def backup_to(engine: Engine, destination: Path) -> Path:
    """Copy the database to ``destination`` with SQLite's online backup API; returns the path written (see
    `backup_checked`, which also says whether the copy is sound)."""
    return backup_checked(engine, destination)[0]


def backup_checked(engine: Engine, destination: Path) -> tuple[Path, str | None]:
    """Copy the database to ``destination`` with SQLite's online backup API, then check the copy with
    integrity_check: (path written, what the check found wrong or None). Refuses the database's own files, what is
    not a regular file, and any database that is not SQLite (PostgreSQL: use pg_dump). A damaged copy never
    replaces an existing file."""
    source = sqlite_path(engine.url)
    if source is None:
        raise StoreError(
            f"database {engine_where(engine)} is not a SQLite file: back up PostgreSQL with pg_dump, e.g. "
            'pg_dump --format=custom --file spectune.dump "$SPECTUNE_DB_URL" (pg_restore brings it back)'
        )
    target = _checked_destination(source, destination)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        _copy(source, partial)
        problem = integrity_problem(partial)
        if problem is not None and target.exists():
            raise StoreError(
                f"the copy of {source} is damaged too (integrity_check: {problem}), so it did not replace "
                f"{destination}; back up to a new file, or save what can be read: python -m engine backup "
                "--recover --out NEW"
            )
        _refuse_special(destination, target)  # again at the last moment: something may have been put there
        os.replace(partial, target)
        fsync_folder(target.parent)
    except sqlite3.Error as exc:
        raise StoreError(f"backup of {source} to {target} failed: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"backup of {source} to {target} failed: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return target, problem


def _checked_destination(source: Path, destination: Path) -> Path:
    """The backup's path, refused when it is the database, its WAL, SHM or journal (by name, symlink or hard link),
    when something there is not a regular file (a folder, a device, a FIFO, a socket), or when it has no folder."""
    target = destination.expanduser().resolve()
    database = source.resolve()
    own = [database.with_name(database.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")]
    if any(same_file(target, path) for path in own):
        raise StoreError(f"{destination} is the database's own file: the backup must go elsewhere")
    if target.is_dir():
        raise StoreError(f"{destination} is a folder: give the backup's file name")
    _refuse_special(destination, target)
    if not target.parent.is_dir():
        raise StoreError(f"{destination}: folder {target.parent} does not exist")
    return target


def _refuse_special(destination: Path, target: Path) -> None:
    """StoreError when something that is not a regular file is at ``target``: a backup replaces only a file."""
    try:
        kind = special_kind(target)
    except OSError as exc:
        raise StoreError(f"{destination} cannot be examined: {exc.strerror or exc}") from exc
    if kind is not None:
        raise StoreError(f"{destination} is {kind}, not a regular file: it was left as it is; name a file")


def _copy(source: Path, partial: Path) -> None:
    """SQLite's online backup of ``source`` into a new file ``partial``, page by page, consistent as a whole."""
    src = sqlite3.connect(source)
    try:
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst, pages=1024)
        finally:
            dst.close()
    finally:
        src.close()
