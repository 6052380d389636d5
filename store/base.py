"""What every part of the Store shares: the engine, short transactions, and ORM rows copied into dicts.

Readers return plain dicts so the dashboard never holds an ORM instance that outlives its session
(Streamlit reruns would otherwise hit DetachedInstanceError or lazy loads on a closed connection).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from store.db import engine_read_only, engine_where, file_identity, session_factory, sqlite_path
from store.errors import DamagedStoreError, translated
from store.health import check_on_open, damage_note, damage_refusal, forget_check
from store.models import Base
from store.recovery import save_open_copy


def row_dict(obj: Base) -> dict[str, Any]:
    """A detached copy of an ORM row's column values."""
    return {attr.key: getattr(obj, attr.key) for attr in obj.__mapper__.column_attrs}


log = logging.getLogger("spectune.store")

REPLACED_WAY_OUT = (
    "nothing new is written into the old file; put a backup in place (python -m engine restore FILE, no worker "
    "running) or start a new database, then reload or restart"
)


class StoreBase:
    """Holds the engine and opens short, error-translated transactions for the mixins."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions: sessionmaker[Session] = session_factory(engine)
        self.where = engine_where(engine)
        self.read_only = engine_read_only(engine)
        self.damage: str | None = None  # what quick_check found wrong on open (store.health), None when sound
        self.identity = file_identity(sqlite_path(engine.url))  # (device, inode) of the SQLite file opened

    def replaced(self) -> str | None:
        """Why the database file this store has open is no longer the one at its path (deleted, moved, or another
        file put there), compared by inode; None while it is the same file (or not a SQLite file)."""
        if self.identity is None:
            return None
        now = file_identity(sqlite_path(self.engine.url))
        if now == self.identity:
            return None
        if now is None:
            return f"database {self.where} was deleted or moved while in use"
        return f"database {self.where} was replaced by another file while in use"

    def recheck_damage(self) -> str | None:
        """What quick_check finds wrong now (run at most once a minute per process), kept as this store's state."""
        self.damage = check_on_open(self.engine)
        return self.damage

    def damage_notice(self) -> str | None:
        """The banner for a damaged database (what was found, and the way out), checked afresh at most once a
        minute; None while it is sound."""
        found = self.recheck_damage()
        return None if found is None else damage_note(self.where, found).removeprefix("warning: ")

    def save_open_copy(self) -> Path | None:
        """When this store's file was deleted, moved or replaced by another file, copy what it holds (through the
        file still open) beside its path for `restore`; the copy's path, or None (nothing to save, or it cannot be
        copied)."""
        path = sqlite_path(self.engine.url)
        if path is None or self.identity is None or file_identity(path) == self.identity:
            return None
        try:
            return save_open_copy(path, self.identity)
        except OSError as exc:
            log.error("could not save a copy of the deleted database %s: %s", self.where, exc)
            return None

    def refuse_new_work(self, what: str) -> None:
        """DamagedStoreError, saying why and the way out, when this store found damage or its file is no longer the
        one at its path: no new work goes into a damaged database, nor into one deleted or replaced under us."""
        if self.damage is not None:
            raise DamagedStoreError(damage_refusal(self.where, self.damage, what))
        if (why := self.replaced()) is not None:
            raise DamagedStoreError(f"{what} refused: {why}; {REPLACED_WAY_OUT}")

    def follow_replacement(self) -> bool:
        """When another database file was put at this store's path (a restore), read and write that one from now
        on: True. False while the path holds the file opened, or nothing."""
        path = sqlite_path(self.engine.url)
        now = file_identity(path)
        if now is None or now == self.identity:
            return False
        self.engine.dispose()  # pooled connections hold the old file; new ones open the path
        self.identity = now
        forget_check(path)
        self.recheck_damage()
        return True

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """An ORM session in a transaction, committed on success; driver errors become StoreError."""
        with translated(self.where), self.sessions.begin() as session:
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """An ORM session for queries only (never committed)."""
        with translated(self.where), self.sessions() as session:
            yield session

    @contextmanager
    def _core(self) -> Iterator[Connection]:
        """A Core connection in a transaction, for single-statement atomic updates."""
        with translated(self.where), self.engine.begin() as conn:
            yield conn

    def close(self) -> None:
        """Close pooled connections (SQLite then checkpoints the WAL into the main file)."""
        self.engine.dispose()

    def __enter__(self) -> StoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
