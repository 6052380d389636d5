"""A damaged SQLite database's way out: check a copy, recover what can be read into a new file, restore a backup.

`integrity_problem` runs SQLite's integrity_check on a file without writing to it. `recover_into` copies what can
still be read into a new database: SQLite's own `.recover` (the sqlite3 command-line tool) when it is installed
and works, else every table read row by row until its first unreadable page. `restore_from` puts a checked backup
in the database's place, keeping the file it replaces (and its WAL) beside it under a dated name: nothing already
stored is lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from store.db import SQLITE_MAGIC, file_identity
from store.errors import StoreError
from store.files import fsync_folder, special_kind
from store.leftovers import open_in_this_process
from store.workers import worker_is_dead

JOURNALS = ("-wal", "-shm", "-journal")
log = logging.getLogger("spectune.store")
RECOVER_TIMEOUT_S = 600.0


def _read_only(path: Path, live: bool = False) -> sqlite3.Connection:
    """A connection that never writes to ``path``. A file nobody writes (a backup without a WAL) is read as
    immutable, nothing made beside it; a live database (``live``, or one with a WAL) through its WAL."""
    mode = "mode=ro" if live or Path(f"{path}-wal").exists() else "immutable=1"
    return sqlite3.connect(f"file:{quote(str(path.resolve()))}?{mode}", uri=True)


def integrity_problem(path: Path) -> str | None:
    """What SQLite's integrity_check finds wrong with the file at ``path``, in one line; None when it is sound."""
    try:
        conn = _read_only(path)
        try:
            rows = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if rows == ["ok"]:
        return None
    return "; ".join(rows[:3]) + (f" (and {len(rows) - 3} more)" if len(rows) > 3 else "")


@dataclass
class Recovered:
    """What a recovery wrote: by which means, rows per table, and the tables it could not read to the end."""

    how: str
    rows: dict[str, int] = field(default_factory=dict)
    cut_short: list[str] = field(default_factory=list)

    def sentence(self) -> str:
        """One line: the rows recovered, and where damage stopped a table."""
        total = sum(self.rows.values())
        line = f"{total} rows in {len(self.rows)} tables recovered ({self.how})"
        return line + (f"; stopped at damage in {', '.join(self.cut_short)}" if self.cut_short else "")


def recover_into(source: Path, target: Path, *, use_cli: bool = True) -> Recovered:
    """Copy what can be read of the database ``source`` into the new file ``target`` (which must not exist)."""
    if target.exists() or target.is_symlink():
        raise StoreError(f"{target} exists: a recovery is written into a new file only; name one that does not exist")
    if not target.parent.is_dir():
        raise StoreError(f"{target}: folder {target.parent} does not exist")
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        done = _recover_with_cli(source, partial) if use_cli else None
        if done is None:
            partial.unlink(missing_ok=True)
            done = _recover_by_rows(source, partial)
        os.rename(partial, target)
        fsync_folder(target.parent)
    except OSError as exc:
        raise StoreError(f"recovery of {source} into {target} failed: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
    return done


def _recover_with_cli(source: Path, partial: Path) -> Recovered | None:
    """SQLite's `.recover` piped into a new database; None when the tool is missing or cannot recover here."""
    tool = shutil.which("sqlite3")
    if tool is None:
        return None
    try:
        dump = subprocess.run([tool, "-readonly", str(source), ".recover"], capture_output=True,
                              timeout=RECOVER_TIMEOUT_S, check=False)  # fmt: skip
        if dump.returncode != 0 or not dump.stdout:
            return None
        load = subprocess.run([tool, str(partial)], input=dump.stdout, capture_output=True,
                              timeout=RECOVER_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if load.returncode != 0 or integrity_problem(partial) is not None:
        return None
    return Recovered("sqlite3 .recover", _row_counts(partial))


def _row_counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in _tables(conn)}
    finally:
        conn.close()


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return [str(row[0]) for row in rows]


def _recover_by_rows(source: Path, partial: Path) -> Recovered:
    """Every table's schema, then its rows in order until the first one that cannot be read, then its indexes."""
    src = _read_only(source, live=True)
    dst = sqlite3.connect(partial)
    try:
        try:
            schema = src.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"nothing can be recovered from {source}: its schema cannot be read ({exc})") from exc
        done = Recovered("row by row: the sqlite3 tool's .recover is not available here")
        tables = [(name, sql) for kind, name, sql in schema if kind == "table" and not name.startswith("sqlite_")]
        for name, sql in tables:
            dst.execute(sql)
            done.rows[name] = _copy_rows(src, dst, name, done)
        for kind, name, sql in schema:
            if kind in ("index", "trigger", "view") and not name.startswith("sqlite_"):
                try:
                    dst.execute(sql)
                except sqlite3.Error:  # e.g. a unique index over rows the damage duplicated: the rows matter more
                    done.cut_short.append(f"{kind} {name} (not rebuilt)")
        dst.commit()
    finally:
        dst.close()
        src.close()
    return done


def _copy_rows(src: sqlite3.Connection, dst: sqlite3.Connection, name: str, done: Recovered) -> int:
    """Rows of one table copied until the first unreadable one; how many."""
    copied = 0
    try:
        cursor = src.execute(f'SELECT * FROM "{name}"')
        marks = ", ".join("?" * len(cursor.description))
        for row in cursor:
            dst.execute(f'INSERT INTO "{name}" VALUES ({marks})', row)
            copied += 1
    except sqlite3.DatabaseError:
        done.cut_short.append(f"{name} (after {copied} rows)")
    return copied


def check_backup(backup: Path) -> None:
    """StoreError unless ``backup`` is a regular SQLite file that passes integrity_check and holds sessions."""
    kind = special_kind(backup)
    if not backup.exists() and kind is None:
        raise StoreError(f"{backup} does not exist")
    if kind is not None:
        raise StoreError(f"{backup} is {kind}, not a backup file")
    with backup.open("rb") as fh:
        if fh.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise StoreError(f"{backup} is not a SQLite database: nothing was restored")
    problem = integrity_problem(backup)
    if problem is not None:
        raise StoreError(f"{backup} is damaged too (integrity_check: {problem}): nothing was restored; recover it "
                         "into a new file first (python -m engine backup --recover --out NEW)")  # fmt: skip
    conn = _read_only(backup)
    try:
        if "sessions" not in _tables(conn):
            raise StoreError(f"{backup} is a SQLite database but not spectune's (no sessions table): nothing restored")
    finally:
        conn.close()


def restore_from(backup: Path, database: Path, now: float | None = None) -> Path | None:
    """Put the checked ``backup`` in place of ``database``; the file it replaced (with its WAL and journal) is kept
    beside it under a dated name, returned (None when there was no database). The caller makes sure that no
    worker writes the database meanwhile."""
    check_backup(backup)
    if backup.resolve() == database.resolve() or (database.exists() and os.path.samefile(backup, database)):
        raise StoreError(f"{backup} is the database itself: name a backup")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    staged = database.with_name(f".{database.name}.{os.getpid()}.restoring")
    try:
        _copy_whole(backup, staged)
        with staged.open("rb+") as fh:
            os.fsync(fh.fileno())
        kept = _set_aside(database, stamp)
        os.rename(staged, database)
        fsync_folder(database.parent)
    except OSError as exc:
        raise StoreError(f"restore of {backup} to {database} failed: {exc.strerror or exc}") from exc
    finally:
        staged.unlink(missing_ok=True)
    return kept


def _copy_whole(source: Path, target: Path) -> None:
    """``source`` (with what its WAL holds) into the new single file ``target``, by SQLite's backup API."""
    src = _read_only(source)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{source} cannot be copied: {exc}") from exc
    finally:
        src.close()


def _set_aside(database: Path, stamp: str) -> Path | None:
    """Rename the database and the files SQLite keeps beside it to a dated name, paired as SQLite pairs them; a WAL
    left without its database is set aside too, so it is never replayed into the file restored. None when there
    was nothing to set aside."""
    companions = [suffix for suffix in JOURNALS if Path(f"{database}{suffix}").exists()]
    if not database.exists() and not companions:
        return None
    kept = database.with_name(f"{database.name}.before-restore-{stamp}")
    n = 1
    while kept.exists() or any(Path(f"{kept}{suffix}").exists() for suffix in JOURNALS):
        n += 1
        kept = database.with_name(f"{database.name}.before-restore-{stamp}-{n}")
    for suffix in companions:
        os.rename(Path(f"{database}{suffix}"), Path(f"{kept}{suffix}"))
    if database.exists():
        os.rename(database, kept)
    return kept


def save_open_copy(database: Path, identity: tuple[int, int], now: float | None = None) -> Path | None:
    """Copy the database file this process still has open (by inode: it was deleted, moved, or another file was
    put at its path) and the WAL it writes to ``DATABASE.saved-DATE-TIME`` beside the path, for `restore`; None when
    this process holds no such file. Call it while nothing writes."""
    source = open_in_this_process(identity)
    if source is None:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = database.with_name(f"{database.name}.saved-{stamp}")
    wal = Path(f"{database}-wal")
    shutil.copyfile(source, target)
    wal_identity = file_identity(wal)
    if wal_identity is not None and open_in_this_process(wal_identity) is not None:  # this process's WAL, no other
        shutil.copyfile(wal, Path(f"{target}-wal"))
    _fold_wal(target)
    return target


def _fold_wal(path: Path) -> None:
    """Write what the WAL beside ``path`` holds into the file itself and drop the WAL: one self-contained file."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
    except sqlite3.Error as exc:
        log.warning("the saved copy %s keeps its WAL beside it: %s", path, exc)
    finally:
        conn.close()


def sessions_being_written(database: Path, stale_after_s: float, now: datetime | None = None) -> list[str]:
    """The running sessions of ``database`` whose worker is alive (a fresh heartbeat, its process not gone), each
    as 'session N (worker W)'; none when the file cannot be read."""
    now = now or datetime.now(UTC)
    try:
        conn = _read_only(database, live=True)
        try:
            rows = conn.execute("SELECT id, worker_id, heartbeat_at FROM sessions WHERE status = 'running'").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    live = []
    for session_id, worker_id, beat in rows:
        try:
            last = datetime.fromisoformat(str(beat)).replace(tzinfo=UTC)
        except ValueError:
            continue
        if (now - last).total_seconds() < stale_after_s and not worker_is_dead(worker_id):
            live.append(f"session {session_id} (worker {worker_id})")
    return live
