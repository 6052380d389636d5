"""Recommendations computed from sessions, and the files exported from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from store.base import StoreBase, row_dict
from store.models import Export, Recommendation


class RecommendationsMixin(StoreBase):
    def save_recommendation(self, session_ids: Sequence[int], objective: str, payload: dict[str, Any]) -> int:
        """Keep a recommendation (which sessions it used, the objective, the result payload)."""
        with self._write() as session:
            row = Recommendation(session_ids=list(session_ids), objective=objective, payload=payload)
            session.add(row)
            session.flush()
            return row.id

    def save_export(self, recommendation_id: int, format: str, filename: str, content: str) -> int:
        """Keep a file generated from a recommendation so it can be downloaded again."""
        with self._write() as session:
            row = Export(recommendation_id=recommendation_id, format=format, filename=filename, content=content)
            session.add(row)
            session.flush()
            return row.id

    def list_recommendations(self) -> list[dict[str, Any]]:
        """Recommendations newest first."""
        query = select(Recommendation).order_by(Recommendation.created_at.desc(), Recommendation.id.desc())
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]

    def get_recommendation(self, recommendation_id: int) -> dict[str, Any] | None:
        with self._read() as session:
            row = session.get(Recommendation, recommendation_id)
            return row_dict(row) if row is not None else None

    def list_exports(self, recommendation_id: int) -> list[dict[str, Any]]:
        """A recommendation's exported files, oldest first."""
        query = select(Export).where(Export.recommendation_id == recommendation_id).order_by(Export.id)
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]
