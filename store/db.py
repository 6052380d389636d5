"""Engines and the entry point: SQLite tuned for one writer (the worker) and many readers (the dashboard).

SQLite runs in WAL mode so readers never wait for the worker's writes; busy_timeout makes two writers
queue instead of failing at once; foreign_keys=ON makes the ON DELETE cascades real. Every connection
gets these settings from a "connect" listener, because SQLite pragmas are per connection. Any other
SQLAlchemy URL (e.g. postgresql+psycopg://…) is passed through unchanged for a shared team database.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from foundation.paths import default_database_url
from store.errors import StoreError
from store.leftovers import identity, in_use, leftovers, set_aside

log = logging.getLogger("spectune.store")

SQLITE_MAGIC = b"SQLite format 3\x00"
DEFAULT_BUSY_TIMEOUT_S = 10.0


def sqlite_path(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory databases and other backends."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database.startswith("file:"):
        database = unquote(database[len("file:") :].split("?", 1)[0])
    if database in ("", ":memory:"):
        return None
    return Path(database)


def describe_url(url: URL) -> str:
    """How errors name the database: the file path for SQLite, the URL without password otherwise."""
    path = sqlite_path(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


def _check_sqlite_file(path: Path) -> None:
    """Refuse a non-SQLite file before SQLite touches it, so it is never rewritten (e.g. to WAL)."""
    try:
        with path.open("rb") as fh:
            header = fh.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"database {path} cannot be read: {exc.strerror or exc}") from exc
    if header and header != SQLITE_MAGIC:
        raise StoreError(
            f"database {path} is not a SQLite database or is corrupt (file is not a database); "
            "it was left untouched (move it aside or set SPECTUNE_DB_URL)"
        )


def _refuse_a_deleted_database(path: Path) -> None:
    """Refuse to start a new database where one was deleted or moved while a process still has it open: its WAL
    or shared-memory file is still there, and a new file would take (and empty) the WAL the old one's writer uses.
    Once no process has it open, those leftovers are set aside (store.leftovers) and a new database may start."""
    left = leftovers(path)
    if not left:
        return
    if not in_use(path):
        moved = set_aside(path)
        names = ", ".join(p.name for p in moved)
        log.warning("database %s was deleted or moved; no process has it open any more, so the files it left were "
                    "set aside (%s) and a new database starts there", path, names)  # fmt: skip
        return
    raise StoreError(
        f"database {path} is missing but its {' and '.join(p.name.removeprefix(path.name) for p in left)} file is "
        "still there: it was deleted or moved while a process (a worker, the dashboard) had it open, and it is still "
        "open there; nothing was created. Stop those processes (a worker saves what the file held as it stops), then "
        "restore a backup (python -m engine restore FILE), or start again: a new database is made once none has it open"
    )


def _create_empty(path: Path) -> None:
    """A new, empty database file (SQLite writes its header on the first write)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise StoreError(f"database {path} cannot be created: {exc.strerror or exc}") from exc


def _is_read_only(path: Path) -> bool:
    """True when the file exists and is not writable. Mode bits count too: root ignores them, we don't."""
    if not path.exists():
        return False
    return not os.access(path, os.W_OK) or (path.stat().st_mode & 0o222) == 0


def _install_sqlite_pragmas(engine: Engine, *, busy_timeout_s: float, wal: bool, read_only: bool) -> None:
    busy_ms = max(0, int(busy_timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            if wal:
                # Parse the schema first: a damaged file fails here, before journal_mode writes its header.
                cur.execute("SELECT count(*) FROM sqlite_master").fetchone()
                mode = str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                if mode != "wal" and not read_only:
                    cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = NORMAL")  # durable on app crash; fsync at checkpoints only
        finally:
            cur.close()


def make_engine(url: str | URL | None = None, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """An Engine for ``url`` (default: foundation.paths.default_database_url()), with SQLite set up for WAL.

    A SQLite file that exists but is not writable is opened read-only (mode=ro), so reads work and
    writes fail with a clear StoreError instead of a half-written database.
    """
    parsed = make_url(url or default_database_url())
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)

    path = sqlite_path(parsed)
    kwargs: dict[str, Any] = {}
    read_only = False
    if path is None:  # in-memory: one shared connection, or every thread would see its own empty database
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        _check_sqlite_file(path)
        _refuse_a_deleted_database(path)
        read_only = _is_read_only(path)
        if not read_only and not path.exists():
            _create_empty(path)
        # mode=rw: a connection made later never creates a new file where this one was deleted or moved
        query = {**parsed.query, "mode": "ro" if read_only else "rw", "uri": "true"}
        parsed = parsed.set(database=f"file:{quote(str(path.resolve()))}", query=query)
    engine = create_engine(parsed, **kwargs)
    _install_sqlite_pragmas(engine, busy_timeout_s=busy_timeout_s, wal=path is not None, read_only=read_only)
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """ORM sessions that keep attribute values after commit (readers copy them into dicts anyway)."""
    return sessionmaker(engine, expire_on_commit=False)


def file_identity(path: Path | None) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``; None when there is none (or no path)."""
    return None if path is None else identity(path)


def engine_where(engine: Engine) -> str:
    """The database's name for error messages (file path, or URL without password)."""
    return describe_url(engine.url)


def engine_read_only(engine: Engine) -> bool:
    """Whether make_engine opened this SQLite file read-only."""
    return engine.url.get_backend_name() == "sqlite" and engine.url.query.get("mode") == "ro"
