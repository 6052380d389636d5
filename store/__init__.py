"""Persistent store for spectune: prompt sets, tuning sessions, runs, per-step logs and exports.

The dashboard and the worker are separate processes sharing one database, so everything here is
plain SQLAlchemy Core/ORM with short transactions; readers return plain dicts, never ORM objects.
"""

from store.db import make_engine, session_factory
from store.errors import DamagedStoreError, StoreError
from store.open import open_store
from store.repo import Store
from store.writer import StepWriter

__all__ = ["DamagedStoreError", "StepWriter", "Store", "StoreError", "make_engine", "open_store", "session_factory"]
