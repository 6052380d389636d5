"""Dashboard queries: aggregates computed in SQL, so a 20,000-step run costs a few small result sets.

Nothing here loads every step into Python. Series are bucketed with GROUP BY so a chart gets at
most ``max_points`` points however long the run; per-position acceptance is counted in SQL too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from sqlalchemy import ColumnElement, Float, Integer, Select, and_, cast, func, literal_column, select, true

from store.base import StoreBase
from store.models import Run, Step, UtilisationSample

DEFAULT_MAX_POINTS = 500


def _totals_columns() -> list[Any]:
    return [
        func.count(Step.id).label("steps"),
        func.coalesce(func.sum(Step.accepted), 0).label("accepted"),
        func.coalesce(func.sum(Step.gamma), 0).label("proposed"),
        func.coalesce(func.sum(Step.emitted), 0).label("emitted"),
        func.coalesce(func.sum(Step.target_calls), 0).label("target_calls"),
        func.coalesce(func.sum(Step.draft_forwards), 0).label("draft_forwards"),
        func.coalesce(func.sum(Step.draft_time_s), 0.0).label("draft_time_s"),
        func.coalesce(func.sum(Step.verify_time_s), 0.0).label("verify_time_s"),
        func.count(func.distinct(Step.prompt_index)).label("prompts"),
        func.max(Step.t).label("last_t"),
    ]


def _floor_int(value: ColumnElement[Any], dialect: str) -> ColumnElement[Any]:
    """floor(value) as an integer, for value >= 0: SQLite's CAST truncates, PostgreSQL's CAST rounds."""
    return cast(value if dialect == "sqlite" else func.floor(value), Integer)


def _progress(row: Any) -> dict[str, Any]:
    data = {key: row._mapping[key] for key in row._mapping.keys() if key != "run_id"}
    busy = data["draft_time_s"] + data["verify_time_s"]
    data["draft_acceptance_rate"] = data["accepted"] / data["proposed"] if data["proposed"] else None
    data["mean_acceptance_length"] = data["emitted"] / data["target_calls"] if data["target_calls"] else None
    data["tokens_per_s"] = data["emitted"] / busy if busy > 0 else None
    return data


def positions_from_histogram(histogram: Iterable[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """Per-position acceptance from (gamma, accepted, count) rows.

    A step with γ proposals and a accepted evaluated positions 0..min(a, γ-1) (the accepted ones, then
    the rejection) and accepted positions 0..a-1: exactly what its accept_mask records.
    """
    evaluated: dict[int, int] = {}
    accepted: dict[int, int] = {}
    for gamma, acc, count in histogram:
        for pos in range(min(acc + 1, gamma)):
            evaluated[pos] = evaluated.get(pos, 0) + count
        for pos in range(min(acc, gamma)):
            accepted[pos] = accepted.get(pos, 0) + count
    return [
        {"position": pos, "evaluated": n, "accepted": accepted.get(pos, 0), "rate": accepted.get(pos, 0) / n}
        for pos, n in sorted(evaluated.items())
        if n
    ]


class ReadersMixin(StoreBase):
    def run_progress(self, run_id: int) -> dict[str, Any]:
        """Totals so far: steps, accepted, proposed (Σγ), emitted, draft/verify seconds, and rates from them."""
        with self._read() as session:
            row = session.execute(select(*_totals_columns()).where(Step.run_id == run_id)).one()
        return _progress(row)

    def session_progress(self, session_id: int) -> dict[int, dict[str, Any]]:
        """run_progress for every run of a session, in one GROUP BY query: {run_id: totals}."""
        query = (
            select(Step.run_id, *_totals_columns())
            .join(Run, Run.id == Step.run_id)
            .where(Run.session_id == session_id)
            .group_by(Step.run_id)
        )
        with self._read() as session:
            return {row.run_id: _progress(row) for row in session.execute(query)}

    def step_series(
        self,
        run_id: int,
        bucket: float | None = None,
        *,
        by: Literal["step", "time"] = "step",
        max_points: int = DEFAULT_MAX_POINTS,
    ) -> list[dict[str, Any]]:
        """The run as a chart series: per bucket of step_index (or of seconds, by="time"), the steps'
        mean accepted and γ, acceptance rate, tokens emitted, draft/verify seconds and tokens/s.

        ``bucket`` defaults to the smallest width giving at most ``max_points`` points.
        """
        key: ColumnElement[Any] = Step.step_index if by == "step" else Step.t
        with self._read() as session:
            lo, hi = session.execute(select(func.min(key), func.max(key)).where(Step.run_id == run_id)).one()
            if lo is None:
                return []
            origin = 0 if by == "step" else lo
            if bucket is None:
                span = hi - origin
                bucket = max(1, math.ceil((span + 1) / max_points)) if by == "step" else max(span / max_points, 1e-9)
            # Literal widths, not bound parameters: PostgreSQL only matches GROUP BY to the select list
            # when the expressions are identical, and two "$n" placeholders are not.
            if by == "time":
                offset = Step.t - literal_column(repr(float(origin)))
                dialect = session.get_bind().dialect.name
                index = _floor_int(offset / literal_column(repr(float(bucket))), dialect).label("bucket")
            else:
                index = (Step.step_index // literal_column(str(int(bucket)))).label("bucket")
            query = (
                select(
                    index,
                    func.count(Step.id).label("steps"),
                    func.min(Step.step_index).label("step"),
                    # avg() over floats: PostgreSQL's avg() of integers is numeric, which arrives as Decimal.
                    (cast(func.sum(Step.emitted), Float) / func.sum(Step.target_calls)).label("mean_acceptance_length"),
                    func.avg(cast(Step.gamma, Float)).label("mean_gamma"),
                    func.sum(Step.accepted).label("accepted"),
                    func.sum(Step.gamma).label("proposed"),
                    func.sum(Step.emitted).label("emitted"),
                    func.sum(Step.draft_time_s).label("draft_time_s"),
                    func.sum(Step.verify_time_s).label("verify_time_s"),
                    func.max(Step.t).label("t"),
                )
                .where(Step.run_id == run_id)
                .group_by(index)
                .order_by(index)
            )
            rows = session.execute(query).all()
        points = []
        for row in rows:
            point = dict(row._mapping)
            busy = point["draft_time_s"] + point["verify_time_s"]
            point["draft_acceptance_rate"] = point["accepted"] / point["proposed"] if point["proposed"] else None
            point["tokens_per_s"] = point["emitted"] / busy if busy > 0 else None
            points.append(point)
        return points

    def per_position_acceptance(self, run_id: int) -> list[dict[str, Any]]:
        """For each draft position i: how often it was evaluated, accepted, and the rate (α_i given i reached).

        SQLite counts the stored accept_mask lists with json_each; other databases derive the same
        numbers from a (γ, accepted) histogram, which needs no JSON functions.
        """
        with self._read() as session:
            if session.get_bind().dialect.name != "sqlite":
                return positions_from_histogram(session.execute(self._histogram_query(run_id)).all())
            mask = func.json_each(Step.accept_mask).table_valued("key", "value", joins_implicitly=True)
            query = (
                select(
                    mask.c.key.label("position"),
                    func.count().label("evaluated"),
                    func.sum(mask.c.value).label("accepted"),
                )
                .select_from(Step)
                .join(mask, true())
                .where(Step.run_id == run_id)
                .group_by(mask.c.key)
                .order_by(mask.c.key)
            )
            rows = session.execute(query).all()
        return [
            {
                "position": int(r.position),
                "evaluated": r.evaluated,
                "accepted": int(r.accepted),
                "rate": r.accepted / r.evaluated,
            }
            for r in rows
        ]

    def per_position_from_histogram(self, run_id: int) -> list[dict[str, Any]]:
        """per_position_acceptance computed from the (γ, accepted) histogram (any database)."""
        with self._read() as session:
            return positions_from_histogram(session.execute(self._histogram_query(run_id)).all())

    def utilisation_series(
        self,
        session_id: int,
        *,
        run_id: int | None = None,
        since_t: float | None = None,
        max_points: int = 1000,
    ) -> list[dict[str, Any]]:
        """Utilisation samples in time order (t, source, run_id, metrics), thinned in SQL to about
        ``max_points`` per source by keeping the first sample of each time bucket. ``since_t`` lets a
        live chart fetch only what is new."""
        conditions = [UtilisationSample.session_id == session_id]
        if run_id is not None:
            conditions.append(UtilisationSample.run_id == run_id)
        if since_t is not None:
            conditions.append(UtilisationSample.t > since_t)
        where = and_(*conditions)
        with self._read() as session:
            n, lo, hi = session.execute(
                select(
                    func.count(UtilisationSample.id), func.min(UtilisationSample.t), func.max(UtilisationSample.t)
                ).where(where)
            ).one()
            if not n:
                return []
            query: Select[Any] = select(
                UtilisationSample.t, UtilisationSample.source, UtilisationSample.run_id, UtilisationSample.metrics
            ).where(where)
            if n > max_points and hi > lo:
                width = literal_column(repr((hi - lo) / max_points))
                offset = UtilisationSample.t - literal_column(repr(float(lo)))
                slot = _floor_int(offset / width, session.get_bind().dialect.name)
                keep = select(func.min(UtilisationSample.id)).where(where).group_by(UtilisationSample.source, slot)
                query = query.where(UtilisationSample.id.in_(keep))
            rows = session.execute(query.order_by(UtilisationSample.t, UtilisationSample.id)).all()
        return [dict(row._mapping) for row in rows]

    @staticmethod
    def _histogram_query(run_id: int) -> Select[Any]:
        return (
            select(Step.gamma, Step.accepted, func.count())
            .where(Step.run_id == run_id)
            .group_by(Step.gamma, Step.accepted)
        )
