"""Schema migrations run from code: open_store() brings any database to head before handing it out.

Alembic is configured here rather than from an alembic.ini so it works from any working directory
and inside an installed package. Migrating takes the database's write lock first (BEGIN IMMEDIATE on
SQLite, a transaction-scoped advisory lock on PostgreSQL), so a worker and a dashboard starting together
migrate once; the other waits, then sees head.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Connection, Engine

from store.db import engine_read_only, engine_where
from store.errors import StoreError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# pg_advisory_xact_lock key that serialises spectune's migrations on one PostgreSQL database ("spectune").
PG_MIGRATION_LOCK = 0x7370_6563_74756E65


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic Config pointing at store/migrations; env.py uses ``connection`` when one is given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = script_directory().get_current_head()
    assert head is not None, "store/migrations has no revisions"
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision (None for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision``; a no-op (and no write) when it is already there."""
    scripts = script_directory()
    current = current_revision(engine)
    target = scripts.get_current_head() if revision == "head" else revision
    if current is not None and not _known(scripts, current):
        raise StoreError(
            f"database {engine_where(engine)} has schema revision {current}, newer than this spectune knows "
            f"({head_revision()}); upgrade spectune or use another database"
        )
    if current == target:
        return
    if engine_read_only(engine):
        raise StoreError(f"database {engine_where(engine)} is read-only and its schema needs upgrading to {target}")
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        try:
            if sqlite:
                # Batch mode rebuilds tables (copy, drop, rename); with foreign keys on, the drop would cascade.
                conn.exec_driver_sql("PRAGMA foreign_keys = OFF")
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif conn.dialect.name == "postgresql":
                # PostgreSQL has no database write lock: without this, two first opens both CREATE TABLE and
                # one fails on a duplicate (or, in one process, Alembic's global context gets shared and they
                # deadlock). Held until commit/rollback; Alembic then reads alembic_version after the winner.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})")
            command.upgrade(alembic_config(conn), revision)
            if sqlite and conn.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                raise StoreError(
                    f"database {engine_where(engine)}: migration left broken foreign keys; nothing changed"
                )
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys = ON")
                conn.commit()


def upgrade_to_head(engine: Engine) -> None:
    upgrade(engine, "head")


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except (CommandError, RevisionError):
        return False
