"""Decisions: the one answer a query over some sessions led to, kept so that every reader shows the same one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select

from store.base import StoreBase
from store.models import Decision, Run


def session_key(session_ids: Sequence[int]) -> str:
    """The sessions as one key: their ids, sorted and deduplicated, joined by commas."""
    return ",".join(str(i) for i in sorted({int(i) for i in session_ids}))


class DecisionsMixin(StoreBase):
    def newest_run_id(self, session_ids: Sequence[int]) -> int:
        """The newest run id of these sessions (0 when they have none): a decision made before it is stale."""
        ids = sorted({int(i) for i in session_ids})
        with self._read() as session:
            return int(session.scalar(select(func.max(Run.id)).where(Run.session_id.in_(ids))) or 0)

    def save_decision(self, session_ids: Sequence[int], query_key: str, runs_seen: int, payload: dict[str, Any]) -> int:
        """Keep the decision for (sessions, query), replacing one made before from fewer runs."""
        key = session_key(session_ids)
        with self._write() as session:
            session.execute(delete(Decision).where(Decision.session_key == key, Decision.query_key == query_key))
            row = Decision(session_key=key, query_key=query_key, runs_seen=int(runs_seen), payload=payload)
            session.add(row)
            session.flush()
            return row.id

    def get_decision(self, session_ids: Sequence[int], query_key: str) -> dict[str, Any] | None:
        """The stored decision for (sessions, query) with its `runs_seen`, or None."""
        key = session_key(session_ids)
        query = select(Decision).where(Decision.session_key == key, Decision.query_key == query_key)
        with self._read() as session:
            row = session.scalars(query).first()
            return None if row is None else {"id": row.id, "runs_seen": row.runs_seen, "payload": row.payload}
