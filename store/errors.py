"""Database failures turned into one clear line: which file, what is wrong, what to do.

The dashboard shows SpectuneError messages instead of tracebacks, so StoreError subclasses it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError, IntegrityError

from foundation.errors import SpectuneError


class StoreError(SpectuneError):
    """The database cannot be opened, read or written; the message names the file and the cause."""


class DamagedStoreError(StoreError):
    """New work refused because the database is damaged; the message says what was found and the way out."""


_CORRUPT = "is not a SQLite database or is corrupt; it was left untouched (move it aside or set SPECTUNE_DB_URL)"

# (substring of the driver's message, what we tell the user); first match wins.
_REASONS: list[tuple[str, str]] = [
    ("file is not a database", _CORRUPT),
    ("file is encrypted", _CORRUPT),
    ("database disk image is malformed", _CORRUPT),
    ("readonly database", "is read-only; check the permissions of the file and its folder"),
    ("database is locked", "is locked by another process; retry when the other writer has finished"),
    ("database table is locked", "is locked by another process; retry when the other writer has finished"),
    ("unable to open database file", "cannot be opened; does its folder exist and is it writable?"),
    ("disk i/o error", "could not be read or written (disk I/O error)"),
    ("database or disk is full", "cannot be written: the disk is full"),
]


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def describe(exc: BaseException, where: str) -> StoreError:
    """Map a driver exception to a StoreError whose one-line message says what to do."""
    detail = _first_line(exc)
    lowered = detail.lower()
    for needle, reason in _REASONS:
        if needle in lowered:
            return StoreError(f"database {where} {reason} ({detail})")
    return StoreError(f"database error on {where}: {detail}")


@contextmanager
def translated(where: str) -> Iterator[None]:
    """Re-raise driver errors inside the block as StoreError (keeping the original as __cause__).

    IntegrityError passes through: a violated constraint is the caller's bug or a race it handles.
    """
    try:
        yield
    except (StoreError, IntegrityError):
        raise
    except (DBAPIError, sqlite3.Error) as exc:
        raise describe(exc, where) from exc
