"""Alembic environment for spectune's store.

open_store() passes its own connection in ``config.attributes["connection"]`` (so the SQLite pragmas
and the write lock it took apply); the ``alembic`` CLI gets an engine from ``sqlalchemy.url`` instead.
render_as_batch lets future migrations alter SQLite tables (SQLite has almost no ALTER TABLE).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from store.db import make_engine
from store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or None)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
