"""Store: the one object the worker and the dashboard use to read and write spectune's database.

Each concern lives in its own mixin module (prompt_sets, sessions, runs, readers, recommendations);
this class only assembles them. Get one from store.open_store(), which migrates the schema first.
"""

from __future__ import annotations

from store.decisions import DecisionsMixin
from store.endpoints import EndpointsMixin
from store.prompt_sets import PromptSetsMixin
from store.readers import ReadersMixin
from store.recommendations import RecommendationsMixin
from store.runs import RunsMixin
from store.sessions import SessionsMixin
from store.spill import SpillMixin
from store.watch import WatchMixin


class Store(
    PromptSetsMixin,
    SessionsMixin,
    RunsMixin,
    ReadersMixin,
    RecommendationsMixin,
    EndpointsMixin,
    DecisionsMixin,
    WatchMixin,
    SpillMixin,
):
    """Repository over one database; thread-safe (each call uses its own short transaction)."""

    def __enter__(self) -> Store:
        return self
