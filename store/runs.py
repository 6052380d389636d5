"""Runs of a session's sweep: creating them, their final metrics, per-prompt outputs, and the step logger."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import delete, insert, select, update

from store.base import StoreBase, row_dict
from store.errors import StoreError
from store.models import RUN_KINDS, RUN_STATUSES, SAMPLE_SOURCES, Output, Run, Step, UtilisationSample
from store.records import OutputLike
from store.writer import DEFAULT_BATCH_SIZE, DEFAULT_FLUSH_INTERVAL_S, StepWriter

_METRICS = frozenset(c.key for c in Run.__mapper__.column_attrs) - {"id", "session_id", "created_at"}


def run_dict(run: Run) -> dict[str, Any]:
    """A run as a dict, with verify_cost keys back to ints (JSON object keys are always strings)."""
    data = row_dict(run)
    if isinstance(data.get("verify_cost"), dict):
        data["verify_cost"] = {_int_key(k): v for k, v in data["verify_cost"].items()}
    return data


def _int_key(key: str) -> int | str:
    try:
        return int(key)
    except (TypeError, ValueError):
        return key


class RunsMixin(StoreBase):
    def create_run(self, session_id: int, draft: str, gamma: int, temperature: float, kind: str) -> int:
        """Start a run (status running): ``kind`` is 'baseline' (target alone) or 'speculative'."""
        if kind not in RUN_KINDS:
            raise ValueError(f"run kind must be one of {RUN_KINDS}, not {kind!r}")
        with self._write() as session:
            run = Run(session_id=session_id, draft=draft, gamma=gamma, temperature=temperature, kind=kind)
            session.add(run)
            session.flush()
            return run.id

    def update_run(self, run_id: int, **metrics: Any) -> None:
        """Set a run's results (alpha, c, verify_cost, tokens_per_s, speedup_*, summary, status, ...)."""
        unknown = set(metrics) - _METRICS
        if unknown:
            raise TypeError(f"update_run: unknown fields {sorted(unknown)}; allowed: {sorted(_METRICS)}")
        if "status" in metrics and metrics["status"] not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, not {metrics['status']!r}")
        if isinstance(metrics.get("verify_cost"), Mapping):
            metrics["verify_cost"] = {str(k): v for k, v in metrics["verify_cost"].items()}
        with self._core() as conn:
            if not conn.execute(update(Run).where(Run.id == run_id).values(**metrics)).rowcount:
                raise StoreError(f"run {run_id} does not exist")

    def finish_run(self, run_id: int, summary: Mapping[str, Any], status: str = "done", **columns: Any) -> None:
        """Close a run: its whole summary as JSON, and ``columns`` (runs-table metrics such as alpha or
        tokens_per_s) set alongside. The caller decides which metrics are columns; unknown ones are refused."""
        self.update_run(run_id, **columns, summary=dict(summary), status=status)

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        with self._read() as session:
            run = session.get(Run, run_id)
            return run_dict(run) if run is not None else None

    def list_runs(self, session_id: int) -> list[dict[str, Any]]:
        """A session's runs in the order they were started."""
        with self._read() as session:
            return [
                run_dict(r) for r in session.scalars(select(Run).where(Run.session_id == session_id).order_by(Run.id))
            ]

    def add_output(self, run_id: int, output: OutputLike, divergence: Any = None) -> int:
        """Store one prompt's decoded output and, for speculative runs, its divergence from the baseline."""
        if dataclasses.is_dataclass(divergence) and not isinstance(divergence, type):
            divergence = dataclasses.asdict(divergence)
        with self._write() as session:
            row = Output(
                run_id=run_id,
                prompt_index=output.prompt_index,
                prompt_id=output.prompt_id,
                prompt_tokens=output.prompt_tokens,
                text=output.text,
                token_ids=list(output.token_ids),
                from_draft=list(output.from_draft),
                wall_time_s=output.wall_time_s,
                steps=output.steps,
                divergence=dict(divergence) if divergence is not None else None,
            )
            session.add(row)
            session.flush()
            return row.id

    def get_outputs(self, run_id: int) -> list[dict[str, Any]]:
        """A run's outputs in prompt order."""
        query = select(Output).where(Output.run_id == run_id).order_by(Output.prompt_index, Output.id)
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]

    def run_steps(self, run_id: int) -> list[dict[str, Any]]:
        """A run's stored steps, in prompt then step order (to resume a session: reused, never decoded again)."""
        query = select(Step).where(Step.run_id == run_id).order_by(Step.prompt_index, Step.step_index, Step.id)
        with self._read() as session:
            return [row_dict(row) for row in session.scalars(query)]

    def drop_unfinished_prompts(self, run_id: int) -> int:
        """Delete the steps of the run's prompts that have no output (cut off mid-decode: they are decoded again
        when the session resumes); returns how many."""
        finished = select(Output.prompt_index).where(Output.run_id == run_id)
        with self._core() as conn:
            stmt = delete(Step).where(Step.run_id == run_id, Step.prompt_index.not_in(finished))
            return conn.execute(stmt).rowcount

    def step_writer(
        self,
        run_id: int,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
    ) -> StepWriter:
        """A batching logger for this run's StepRecords and utilisation samples (use ``with``)."""
        with self._read() as session:
            session_id = session.scalar(select(Run.session_id).where(Run.id == run_id))
        if session_id is None:
            raise StoreError(f"run {run_id} does not exist")
        return StepWriter(
            self.sessions, self.where, run_id, session_id, batch_size=batch_size, flush_interval_s=flush_interval_s
        )

    def add_utilisation_samples(
        self, session_id: int, samples: Iterable[Mapping[str, Any] | Any], run_id: int | None = None
    ) -> int:
        """Store samples taken outside a StepWriter (e.g. while models load): dicts or objects (such as
        engine.measure.telemetry.Sample) with t (unix seconds), source (nvml|cpu) and metrics."""
        rows = []
        for sample in samples:
            t, source, metrics = (
                (sample["t"], sample["source"], sample["metrics"])
                if isinstance(sample, Mapping)
                else (sample.t, sample.source, sample.metrics)
            )
            if source not in SAMPLE_SOURCES:
                raise ValueError(f"utilisation source must be one of {SAMPLE_SOURCES}, not {source!r}")
            metrics = {str(k): float(v) for k, v in metrics.items()}
            rows.append(
                {"session_id": session_id, "run_id": run_id, "t": float(t), "source": source, "metrics": metrics}
            )
        if rows:
            with self._write() as session:
                session.execute(insert(UtilisationSample.__table__), rows)
        return len(rows)
