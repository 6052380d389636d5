"""open_store: the entry point that opens (creating if needed) a database, migrates it and hands out its Store."""

from __future__ import annotations

import time

from sqlalchemy.engine import URL

from store.db import DEFAULT_BUSY_TIMEOUT_S, engine_where, make_engine
from store.errors import StoreError, translated
from store.health import check_on_open
from store.migrate import upgrade_to_head
from store.repo import Store


def open_store(url: str | URL | None = None, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Store:
    """Open (creating if needed) the database, migrate it to the newest schema and return its Store; its `damage`
    says what SQLite's quick_check found wrong (None when sound; see store.health). Sessions spilled from a
    database deleted at that path under its worker are replayed into a sound one (store.spill)."""
    engine = make_engine(url, busy_timeout_s=busy_timeout_s)
    deadline = time.monotonic() + busy_timeout_s
    attempt = 0
    while True:
        try:
            with translated(engine_where(engine)):
                upgrade_to_head(engine)
            opened = Store(engine)
            opened.damage = check_on_open(engine)  # warned about on every open while it lasts
            opened.replay_spills()  # a session spilled from a database deleted under its worker
            return opened
        except StoreError as exc:
            # Two first opens of a new file can trip SQLite's deadlock guard, which answers "locked" at
            # once instead of waiting out busy_timeout; retry until that timeout has really passed.
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                engine.dispose()
                raise
            attempt += 1
            time.sleep(min(0.05 * attempt, 0.5))
        except BaseException:
            engine.dispose()
            raise
