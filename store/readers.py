"""Dashboard queries: aggregates computed in SQL, so a 20,000-step run costs a few small result sets.

Nothing here loads every step into Python. Series are bucketed with GROUP BY so a chart gets at
most ``max_points`` points however long the run; per-position acceptance is counted in SQL too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

from sqlalchemy import ColumnElement, Float, Integer, Select, and_, cast, func, literal_column, select, true

from store.base import StoreBase, row_dict
from store.models import Output, Prompt, Run, Step, TuningSession, UtilisationSample

DEFAULT_MAX_POINTS = 500
_SUMMED = ("steps", "accepted", "proposed", "emitted", "target_calls", "draft_time_s", "verify_time_s")


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
    data["tokens_per_call"] = data["emitted"] / data["target_calls"] if data["target_calls"] else None
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
                    (cast(func.sum(Step.emitted), Float) / func.sum(Step.target_calls)).label("tokens_per_call"),
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

    def live_version(self, session_id: int, *, count_steps: bool = True) -> dict[str, Any]:
        """What a live view polls to learn whether anything changed, in one small query.

        ``newest_step_id``: the newest step in the whole database (a primary-key lookup: it moves whenever any
        step is logged). ``steps`` and ``max_step_id``: this session's logged steps and its newest step id
        (index-only, but proportional to the session's steps; None with count_steps=False). Then the
        session's outputs and finished runs, and its own state (status, progress, phase, error, cancel flag).
        ``version`` is all of it as one comparable tuple; ``data_version`` leaves out the session's own state
        (it changes when there may be something new to chart)."""
        mine = Run.session_id == session_id
        step_run = Run.id == Step.run_id
        counted = (
            select(func.count(Step.id)).join(Run, step_run).where(mine).scalar_subquery(),
            select(func.max(Step.id)).join(Run, step_run).where(mine).scalar_subquery(),
        ) if count_steps else (literal_column("NULL"), literal_column("NULL"))  # fmt: skip
        query = select(
            select(func.max(Step.id)).scalar_subquery(),
            *counted,
            select(func.count(Output.id)).join(Run, Run.id == Output.run_id).where(mine).scalar_subquery(),
            select(func.count(Run.id)).where(mine).scalar_subquery(),
            select(func.count(Run.id)).where(mine, Run.status != "running").scalar_subquery(),
            TuningSession.status, TuningSession.progress_done, TuningSession.progress_total,
            TuningSession.phase, TuningSession.error, TuningSession.cancel_requested,
        ).where(TuningSession.id == session_id)  # fmt: skip
        with self._read() as session:
            row = session.execute(query).one_or_none()
        if row is None:
            data, own = (None, None, None, 0, 0, 0), None
        else:
            data, own = tuple(int(v) if v is not None else None for v in row[:6]), tuple(row[6:])
        return {
            "newest_step_id": data[0],
            "steps": data[1] if count_steps else None,
            "max_step_id": data[2],
            "outputs": data[3] or 0,
            "runs": data[4] or 0,
            "runs_done": data[5] or 0,
            "status": own[0] if own else None,
            "phase": own[3] if own else None,
            "data_version": data,
            "version": (data, repr(own)),
        }

    def step_totals_since(self, session_id: int, after_step_id: int | None = None) -> dict[str, Any]:
        """The session's steps logged after ``after_step_id`` (all when None), summed per run, so a live view
        can keep running totals without re-reading old steps: {"max_step_id", "last_run_id" (the run of the
        newest step), "runs": {run_id: {steps, accepted, proposed, emitted, target_calls, draft_time_s,
        verify_time_s}}, "histogram": {run_id: [(γ, accepted, count), …]}} (per-position acceptance comes
        from the histogram: positions_from_histogram). The histogram holds single steps only: a record that
        covers several target calls (an engine's totals for a request: llama.cpp, vLLM) says how many tokens were
        drafted and accepted in all, not at which position, so it is no step of γ = its draft tokens."""
        where = [Run.session_id == session_id]
        join = Run.id == Step.run_id
        if after_step_id is not None:
            where.append(Step.id > after_step_id)
            # "+ 0" keeps SQLite off the (run_id, step_index) index, so only the new rows are read, by primary key
            join = Run.id == Step.run_id + 0
        single = (func.coalesce(Step.target_calls, 1) <= 1).label("single")  # one step, not a request's totals
        sums = (
            select(
                Step.run_id, Step.gamma, Step.accepted, single, func.count(Step.id).label("steps"),
                func.sum(Step.emitted).label("emitted"), func.sum(Step.target_calls).label("target_calls"),
                func.sum(Step.draft_time_s).label("draft_time_s"), func.sum(Step.verify_time_s).label("verify_time_s"),
                func.max(Step.id).label("max_id"),
            )
            .join(Run, join)
            .where(*where)
            .group_by(Step.run_id, Step.gamma, Step.accepted, single)
        )  # fmt: skip
        runs: dict[int, dict[str, Any]] = {}
        histogram: dict[int, list[tuple[int, int, int]]] = {}
        newest: tuple[int, int] | None = None  # (step id, run id)
        with self._read() as session:
            for row in session.execute(sums):
                totals = runs.setdefault(row.run_id, dict.fromkeys(_SUMMED, 0))
                totals["steps"] += row.steps
                totals["accepted"] += row.accepted * row.steps
                totals["proposed"] += row.gamma * row.steps
                for key in ("emitted", "target_calls", "draft_time_s", "verify_time_s"):
                    totals[key] += getattr(row, key) or 0
                positions = histogram.setdefault(row.run_id, [])
                if row.single:
                    positions.append((row.gamma, row.accepted, row.steps))
                if newest is None or row.max_id > newest[0]:
                    newest = (row.max_id, row.run_id)
        return {
            "max_step_id": newest[0] if newest else after_step_id,
            "last_run_id": newest[1] if newest else None,
            "runs": runs,
            "histogram": histogram,
        }

    @staticmethod
    def positions_from_histogram(histogram: Iterable[tuple[int, int, int]]) -> list[dict[str, Any]]:
        """Per-position acceptance from (γ, accepted, count) rows, e.g. step_totals_since's histogram summed."""
        return positions_from_histogram(histogram)

    def latest_output(self, session_id: int) -> dict[str, Any] | None:
        """The session's newest stored output (any run), or None."""
        query = (
            select(Output).join(Run, Run.id == Output.run_id).where(Run.session_id == session_id)
            .order_by(Output.id.desc()).limit(1)
        )  # fmt: skip
        with self._read() as session:
            row = session.scalars(query).first()
            return row_dict(row) if row is not None else None

    def prompt_categories(self, prompt_set_id: int) -> dict[str, int]:
        """How many prompts of the set carry each category ("" for none), in order of first appearance."""
        query = (
            select(func.coalesce(Prompt.category, ""), func.count(Prompt.id), func.min(Prompt.position))
            .where(Prompt.prompt_set_id == prompt_set_id)
            .group_by(func.coalesce(Prompt.category, ""))
            .order_by(func.min(Prompt.position))
        )
        with self._read() as session:
            return {str(name): int(n) for name, n, _ in session.execute(query)}

    @staticmethod
    def _histogram_query(run_id: int) -> Select[Any]:
        return (
            select(Step.gamma, Step.accepted, func.count())
            .where(Step.run_id == run_id, func.coalesce(Step.target_calls, 1) <= 1)
            .group_by(Step.gamma, Step.accepted)
        )
