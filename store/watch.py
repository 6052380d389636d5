"""Watch windows: a watched deployment's windows, their figures and verdicts, kept for a retention period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select

from store.base import StoreBase
from store.models import WatchWindow

RETENTION_DAYS = 30.0  # windows older than this are deleted when a new one is written


class WatchMixin(StoreBase):
    def save_watch_window(
        self, deployment: str, ended_at: datetime, seconds: float, verdict: str, figures: dict[str, Any],
        retention_days: float | None = RETENTION_DAYS,
    ) -> int:  # fmt: skip
        """Keep one window; windows of any deployment older than `retention_days` (None: keep all) are deleted."""
        with self._write() as session:
            if retention_days is not None:
                cutoff = datetime.now(UTC) - timedelta(days=float(retention_days))
                session.execute(delete(WatchWindow).where(WatchWindow.ended_at < cutoff))
            row = WatchWindow(deployment=deployment, ended_at=ended_at, seconds=float(seconds), verdict=verdict,
                              figures=figures)  # fmt: skip
            session.add(row)
            session.flush()
            return row.id

    def list_watch_windows(self, deployment: str, limit: int | None = None) -> list[dict[str, Any]]:
        """A deployment's windows, oldest first (the newest `limit` when given)."""
        query = select(WatchWindow).where(WatchWindow.deployment == deployment).order_by(WatchWindow.ended_at.desc())
        if limit is not None:
            query = query.limit(int(limit))
        with self._read() as session:
            rows = session.scalars(query).all()
            return [
                {"id": r.id, "deployment": r.deployment, "ended_at": r.ended_at, "seconds": r.seconds,
                 "verdict": r.verdict, "figures": r.figures}
                for r in reversed(rows)
            ]  # fmt: skip

    def watch_deployments(self) -> list[str]:
        """The deployments with stored windows, by name."""
        with self._read() as session:
            return sorted(session.scalars(select(WatchWindow.deployment).distinct()).all())
