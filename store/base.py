"""What every part of the Store shares: the engine, short transactions, and ORM rows copied into dicts.

Readers return plain dicts so the dashboard never holds an ORM instance that outlives its session
(Streamlit reruns would otherwise hit DetachedInstanceError or lazy loads on a closed connection).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from store.db import engine_read_only, engine_where, session_factory
from store.errors import DamagedStoreError, translated
from store.health import check_on_open, damage_note, damage_refusal
from store.models import Base


def row_dict(obj: Base) -> dict[str, Any]:
    """A detached copy of an ORM row's column values."""
    return {attr.key: getattr(obj, attr.key) for attr in obj.__mapper__.column_attrs}


class StoreBase:
    """Holds the engine and opens short, error-translated transactions for the mixins."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions: sessionmaker[Session] = session_factory(engine)
        self.where = engine_where(engine)
        self.read_only = engine_read_only(engine)
        self.damage: str | None = None  # what quick_check found wrong on open (store.health), None when sound

    def recheck_damage(self) -> str | None:
        """What quick_check finds wrong now (run at most once a minute per process), kept as this store's state."""
        self.damage = check_on_open(self.engine)
        return self.damage

    def damage_notice(self) -> str | None:
        """The banner for a damaged database (what was found, and the way out), checked afresh at most once a
        minute; None while it is sound."""
        found = self.recheck_damage()
        return None if found is None else damage_note(self.where, found).removeprefix("warning: ")

    def refuse_if_damaged(self, what: str) -> None:
        """DamagedStoreError, saying why and the way out, when this store found damage: no new work goes into a
        damaged database."""
        if self.damage is not None:
            raise DamagedStoreError(damage_refusal(self.where, self.damage, what))

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
