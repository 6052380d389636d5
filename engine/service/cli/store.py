"""CLI commands that look after the database file itself: backup (checked, or recovered) and restore.

    python -m engine backup --out FILE            # a consistent copy while in use, checked with integrity_check
    python -m engine backup --recover --out NEW   # what can still be read of a damaged database, into a new file
    python -m engine restore FILE                 # a checked backup put in the database's place (no worker running)

A backup whose copy is damaged too says so and exits 1; restore refuses while a worker runs or a session is being
written, and keeps the database it replaces beside it under a dated name. docs/cli.md, "Backup and restore".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import SpectuneError
from foundation.paths import default_database_url

EXIT_DAMAGED_COPY = 1


def add_commands(sub: Any) -> None:
    """Register backup and restore on the main parser."""
    backup = sub.add_parser(
        "backup",
        help="copy the database while in use (SQLite's online backup API; PostgreSQL: pg_dump), checked "
        "with integrity_check; --recover saves what can be read of a damaged one into a new file",
    )
    backup.add_argument("--out", required=True, help="the backup file (replaced atomically if it exists)")
    backup.add_argument(
        "--recover", action="store_true", help="recover what can be read into --out, a new file (SQLite's .recover)"
    )
    restore = sub.add_parser(
        "restore",
        help="put a backup in the database's place: checked first, refused while a worker runs; the "
        "database it replaces is kept beside it",
    )
    restore.add_argument("file", help="the backup file (made by python -m engine backup)")


def cmd_backup(args: argparse.Namespace) -> int:
    """Copy the database to --out, consistent even while a worker writes; say plainly when the copy is damaged."""
    from engine.service.jobs import open_app_store
    from store.health import backup_checked

    if args.recover:
        return _recover(Path(args.out))
    store = open_app_store()
    try:
        written, problem = backup_checked(store.engine, Path(args.out))
    finally:
        store.close()
    if problem is None:
        print(f"backed up {store.where} to {written} (integrity_check: ok)")
        return 0
    print(f"backed up {store.where} to {written}, but the copy is damaged too (integrity_check: {problem})")
    print(
        "save what can still be read into a new file: python -m engine backup --recover --out NEW, then put it "
        "in place with python -m engine restore NEW"
    )
    return EXIT_DAMAGED_COPY


def _recover(out: Path) -> int:
    """What can be read of the database, into the new file ``out``; the recovered file is checked."""
    from store.recovery import integrity_problem, recover_into

    database = _sqlite_database("recover")
    done = recover_into(database, out.expanduser().resolve())
    problem = integrity_problem(out)
    verdict = "integrity_check: ok" if problem is None else f"damaged still (integrity_check: {problem})"
    print(f"recovered {database} into {out}: {done.sentence()}; {verdict}")
    if problem is None:
        print(f"put it in place with python -m engine restore {out} (no worker running)")
    return 0 if problem is None else EXIT_DAMAGED_COPY


def cmd_restore(args: argparse.Namespace) -> int:
    """Put a checked backup in the database's place while no worker runs; the replaced file is kept."""
    from engine.service.jobs import open_app_store
    from engine.service.worker.control import worker_alive
    from store.health import forget_check
    from store.orphans import STALE_AFTER_S
    from store.recovery import restore_from, sessions_being_written

    database = _sqlite_database("restore")
    if pid := worker_alive():
        raise SpectuneError(
            f"a worker is running (pid {pid}): stop it first (kill -TERM {pid}; it ends after the "
            "current step), then restore; nothing was changed"
        )
    if busy := sessions_being_written(database, STALE_AFTER_S):
        raise SpectuneError(
            f"{', '.join(busy)} is being written by a live worker: stop that worker first, then "
            "restore; nothing was changed"
        )
    kept = restore_from(Path(args.file).expanduser(), database)
    forget_check(database)
    open_app_store().close()  # a backup from an older version is migrated now, and checked on open
    print(f"restored {args.file} to {database} (integrity_check: ok)")
    if kept is not None:
        print(f"the database it replaced is kept as {kept}")
    return 0


def _sqlite_database(what: str) -> Path:
    """The SQLite file every command opens; SpectuneError for a server database (pg_dump / pg_restore)."""
    from sqlalchemy.engine import make_url

    from store.db import sqlite_path

    path = sqlite_path(make_url(default_database_url()))
    if path is None:
        raise SpectuneError(
            f"{what} works on a SQLite database; SPECTUNE_DB_URL names a server database: use pg_dump and pg_restore"
        )
    return path


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"backup": cmd_backup, "restore": cmd_restore}
