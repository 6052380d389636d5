"""StepWriter: per-step logging cheap enough to leave on (a few µs per step against ~10-100 ms decode steps).

Each StepRecord becomes a dict in memory; rows reach the database in one bulk INSERT and one commit
per batch (256 records or 0.5 s, whichever comes first, and on close), so SQLite's per-commit cost
(fsync, WAL append) is paid a few times a second rather than every step, and the dashboard still
sees progress within about half a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from store.errors import translated
from store.models import SAMPLE_SOURCES, Step, UtilisationSample
from store.records import StepLike

DEFAULT_BATCH_SIZE = 256
DEFAULT_FLUSH_INTERVAL_S = 0.5


class StepWriter:
    """Buffers a run's steps (and utilisation samples) and commits them in batches.

    Use as a context manager; leaving the block flushes what is buffered, even when the block raised,
    so a failed run keeps the steps it logged. add()/add_sample() may be called from different threads
    (e.g. the decode loop and a utilisation sampler). If a flush fails, its rows go back to the buffer.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        where: str,
        run_id: int,
        session_id: int,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._where = where
        self.run_id = run_id
        self.session_id = session_id
        self.batch_size = max(1, batch_size)
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self._steps: list[dict[str, Any]] = []
        self._samples: list[dict[str, Any]] = []
        self._buffer_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_flush = clock()
        self.steps_written = 0
        self.samples_written = 0
        self.commits = 0

    def add(self, record: StepLike, t: float | None = None) -> None:
        """Buffer one step (``t``: unix time it happened, default now); flushes when a batch is due."""
        row = {
            "run_id": self.run_id,
            "prompt_index": record.prompt_index,
            "step_index": record.step_index,
            "gamma": record.gamma,
            "accepted": record.accepted,
            "accept_mask": list(record.accept_mask),
            "beta": list(record.beta),
            "draft_time_s": record.draft_time_s,
            "verify_time_s": record.verify_time_s,
            "draft_forwards": record.draft_forwards,
            "emitted": record.emitted,
            "target_calls": record.target_calls,
            "t": time.time() if t is None else t,
        }
        with self._buffer_lock:
            self._steps.append(row)
            due = self._due()
        if due:
            self.flush()

    def add_sample(self, metrics: Mapping[str, float], source: str = "cpu", t: float | None = None) -> None:
        """Buffer one utilisation reading (``source`` nvml|cpu) for this writer's run."""
        if source not in SAMPLE_SOURCES:
            raise ValueError(f"utilisation source must be one of {SAMPLE_SOURCES}, not {source!r}")
        row = {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "t": time.time() if t is None else t,
            "source": source,
            "metrics": {str(k): float(v) for k, v in metrics.items()},
        }
        with self._buffer_lock:
            self._samples.append(row)
            due = self._due()
        if due:
            self.flush()

    def flush(self) -> int:
        """Write everything buffered in one transaction; returns the number of rows written."""
        with self._flush_lock:
            with self._buffer_lock:
                steps, self._steps = self._steps, []
                samples, self._samples = self._samples, []
                self._last_flush = self._clock()
            if not steps and not samples:
                return 0
            try:
                with translated(self._where), self._sessions.begin() as session:
                    # Table-level INSERT with a list: one executemany, without ORM per-row bookkeeping.
                    if steps:
                        session.execute(insert(Step.__table__), steps)
                    if samples:
                        session.execute(insert(UtilisationSample.__table__), samples)
            except BaseException:
                with self._buffer_lock:  # keep the rows: the caller may retry, or close() will
                    self._steps[:0] = steps
                    self._samples[:0] = samples
                raise
            self.commits += 1
            self.steps_written += len(steps)
            self.samples_written += len(samples)
            return len(steps) + len(samples)

    @property
    def pending(self) -> int:
        """Rows buffered but not yet committed."""
        with self._buffer_lock:
            return len(self._steps) + len(self._samples)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:
                raise  # otherwise keep the original error; the unflushed rows are lost with the run

    def _due(self) -> bool:
        pending = len(self._steps) + len(self._samples)
        return pending >= self.batch_size or self._clock() - self._last_flush >= self.flush_interval_s
