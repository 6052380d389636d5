"""StoreHooks: a sweep's callbacks mapped onto the store (runs, batched step logs, outputs, heartbeat, cancel)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from engine.service.worker.progress import SessionProgress, is_decoding_phase
from engine.service.worker.resume import EarlierRuns, Measured, measured_prompts
from engine.session.hooks import Hooks
from engine.session.summary import RunSummary

log = logging.getLogger("spectune.worker")
TERMINATING = threading.Event()  # set by the worker's SIGTERM/SIGINT handler

HEARTBEAT_S = 2.0


CANCEL_POLL_S = 0.0  # every step: a cancel lands within one verification step


def _identity(key: dict[str, Any]) -> dict[str, Any]:
    """What a new run's summary says of it before it finishes: its policy and concurrency, which the store has no
    column for (the pages name a running policy run by its policy, not by γ=0)."""
    return {name: key[name] for name in ("policy", "concurrency") if name in key}


class StoreHooks(Hooks):
    """Connects a sweep to the store: runs, batched step logs, outputs, progress, heartbeat, cancel."""

    def __init__(self, store: Any, session_id: int, worker_id: str, resume: bool = False) -> None:
        """`resume`: the session ran before (re-queued); its earlier runs are reopened and what they measured
        reused (engine.service.worker.resume)."""
        self.store = store
        self.session_id = session_id
        self.worker_id = worker_id
        # every run of an interleaved sweep is open at once: one StepWriter per open run, by run id
        self.writers: dict[int, Any] = {}
        self._unfinished: list[int] = []  # started, neither finished nor failed: the failure paths mark them
        self.run_id: int | None = None  # the run started last
        self._current: int | None = None  # the run that logged the last step: telemetry samples go there
        self._last_cancel_check = 0.0
        self._stop = False
        # True once a heartbeat finds the session is no longer ours (another worker failed it as orphaned);
        # its status then belongs to that worker and is never overwritten.
        self.lost = False
        # why the session stops because its database file was deleted, moved or replaced (checked every beat)
        self.replaced: str | None = None
        self._beat_stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self._progress = SessionProgress()  # the bar over every sweep of the session, and the decodes' time left
        self._resume = resume
        self._earlier: EarlierRuns | None = None  # a resumed session's runs from earlier attempts (read once)
        self._reopened: set[int] = set()

    def run_started(self, key: dict[str, Any]) -> int:
        """The run for this configuration: an earlier attempt's, reopened (a resumed session), else a new one."""
        if self._earlier is None and self._resume:
            self._earlier = EarlierRuns(self.store, self.session_id)
        run_id = self._earlier.take(key) if self._earlier is not None else None
        if run_id is None:
            run_id = self.store.create_run(self.session_id, key["draft"], key["gamma"], key["temperature"], key["kind"])
            self.store.update_run(run_id, status="running", summary=_identity(key) or None)
        else:
            self._reopened.add(run_id)
        self.run_id = run_id
        self._unfinished.append(run_id)
        self.writers[run_id] = self.store.step_writer(run_id)
        return run_id

    def measured(self, run: Any) -> dict[int, Measured]:
        """Per prompt index, what an earlier attempt measured in this run (empty for a new run)."""
        return measured_prompts(self.store, run) if run in self._reopened else {}

    @property
    def open_runs(self) -> list[int]:
        """The runs started and neither finished nor failed, in the order they started."""
        return list(self._unfinished)

    def step(self, run: Any, record: Any) -> None:
        self._current = run
        self.writers[run].add(record)

    def sample(self, t: float, source: str, metrics: dict[str, float]) -> None:
        """Telemetry callback (sampler thread): attach to the run decoding now when one is being logged."""
        current = self._current
        writer = self.writers.get(current) if current is not None else None
        if writer is not None:
            writer.add_sample(metrics, source, t=t)
        else:
            self.store.add_utilisation_samples(self.session_id, [{"t": t, "source": source, "metrics": metrics}])

    def output(self, run: Any, output: Any, divergence: dict | None) -> None:
        # a prompt is done: its steps go out now, since this run may not log another step for a while
        # (the other configurations decode this prompt first) and the live view should see them
        writer = self.writers.get(run)
        if writer is not None:
            writer.flush()
        self.store.add_output(run, output, divergence)

    def requests(self, run: Any, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.store.add_endpoint_requests(self.session_id, rows)

    def run_finished(self, run: Any, summary: RunSummary) -> None:
        self.close_writer(run)
        self._forget(run)
        self.store.finish_run(run, summary.to_dict(), **summary.columns())

    def close_writer(self, run: int | None = None) -> None:
        """Close one run's writer (every open one when ``run`` is None), flushing what it buffered."""
        for run_id in [run] if run is not None else list(self.writers):
            writer = self.writers.pop(run_id, None)  # detach first: a failed close must not leave it attached
            if writer is not None:
                writer.close()

    def discard_writer(self, run: int | None = None) -> None:
        """Close every open writer (or ``run``'s) on an error path without raising: when the cause was the
        database itself (disk full, locked) the final flush fails too; its rows are logged as dropped and
        the session is failed."""
        for run_id in [run] if run is not None else list(self.writers):
            writer = self.writers.pop(run_id, None)
            if writer is None:
                continue
            try:
                writer.close()
            except Exception as exc:
                log.warning(
                    "session %s run %s: %d buffered rows could not be written: %s",
                    self.session_id,
                    run_id,
                    writer.pending,
                    exc,
                )

    def run_failed(self, run: Any, message: str) -> None:
        self.discard_writer(run)
        self._forget(run)
        self.store.update_run(run, status="failed", summary={"error": message})

    def _forget(self, run: Any) -> None:
        if run in self._unfinished:
            self._unfinished.remove(run)

    def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
        """The phase as the pages show it, with when it started (`at`, Unix seconds: the pages count its time
        left down from there); a decoding phase's time left is the session's decodes' (SessionProgress)."""
        self._progress.phase(name)
        if is_decoding_phase(name):
            eta_s = self._progress.eta_s()
        eta = None if eta_s is None else round(float(eta_s), 1)
        phase = {"name": name, "done": done, "total": total, "eta_s": eta, "at": round(time.time(), 1)}
        self.store.set_phase(self.session_id, phase)

    def progress(self, done: int, total: int) -> None:
        self.store.set_progress(self.session_id, *self._progress.update(done, total))

    def next_sweep(self) -> None:
        self._progress.next_sweep()

    def reserve(self, decodes: int) -> None:
        self._progress.reserve(decodes)

    def all_decoded(self) -> None:
        self.store.set_progress(self.session_id, *self._progress.all_decoded())

    def check_replaced(self) -> bool:
        """Whether the session's database file was deleted, moved or replaced, looked at now (the heartbeat looks
        only every beat): a session is never ended into a file no longer at its path."""
        if self.replaced is None:
            self.replaced = self.store.replaced()
        return self.replaced is not None

    def should_stop(self) -> bool:
        if TERMINATING.is_set():  # the worker was told to exit: stop within this step
            return True
        now = time.monotonic()
        if self.lost or self.replaced:
            self._stop = True  # someone else owns the session now, or its database file is gone
        if not self._stop and now - self._last_cancel_check >= CANCEL_POLL_S:
            self._last_cancel_check = now
            self._stop = self.store.is_cancel_requested(self.session_id)
        return self._stop

    # A thread beats every HEARTBEAT_S for the whole session: model loading, v(k), agreement runs and the
    # regime sweep run no decode steps, and a silent session would be failed as orphaned.
    def start_heartbeat(self) -> None:
        self._beat_thread = threading.Thread(target=self._beat_loop, name="spectune-heartbeat", daemon=True)
        self._beat_thread.start()

    def stop_heartbeat(self) -> None:
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=5.0)

    def _beat_loop(self) -> None:
        while not self._beat_stop.wait(HEARTBEAT_S):
            try:
                if self.check_replaced():
                    return
                if not self.store.heartbeat(self.session_id, self.worker_id):
                    self.lost = True
                    return
            except Exception as exc:  # a locked/full database: keep trying; the session's own writes report it
                log.warning("heartbeat for session %s failed: %s", self.session_id, exc)
