"""Requests an endpoint session sent to a running deployment: stored as measured, read back per session."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, insert, select

from store.base import StoreBase, row_dict
from store.models import EndpointRequest

_FIELDS = frozenset(c.key for c in EndpointRequest.__mapper__.column_attrs) - {"id", "session_id"}
_REQUIRED = frozenset({"endpoint", "concurrency", "request_index", "prompt_index", "started_at", "ok"})


class EndpointsMixin(StoreBase):
    def add_endpoint_requests(self, session_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Store measured requests (dicts with EndpointRequest's columns) in one transaction; returns how many."""
        values = []
        for row in rows:
            unknown = set(row) - _FIELDS
            if unknown:
                raise TypeError(f"add_endpoint_requests: unknown fields {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
            missing = _REQUIRED - set(row)
            if missing:
                raise TypeError(f"add_endpoint_requests: missing fields {sorted(missing)}")
            values.append({
                "output_tokens": 0, "duration_s": 0.0, "retries": 0, **row,
                "session_id": session_id, "ok": bool(row["ok"]),
                "itl_s": [float(x) for x in row.get("itl_s") or []],
            })  # fmt: skip
        if values:
            with self._write() as session:
                session.execute(insert(EndpointRequest.__table__), values)
        return len(values)

    def list_endpoint_requests(self, session_id: int, endpoint: str | None = None) -> list[dict[str, Any]]:
        """A session's requests by endpoint, concurrency and request index."""
        query = select(EndpointRequest).where(EndpointRequest.session_id == session_id)
        if endpoint is not None:
            query = query.where(EndpointRequest.endpoint == endpoint)
        query = query.order_by(
            EndpointRequest.endpoint, EndpointRequest.concurrency, EndpointRequest.request_index, EndpointRequest.id
        )
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]

    def count_endpoint_requests(self, session_id: int) -> int:
        query = select(func.count()).where(EndpointRequest.session_id == session_id)
        with self._read() as session:
            return int(session.scalar(query) or 0)
