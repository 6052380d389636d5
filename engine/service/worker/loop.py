"""The decoding worker: one long-lived process that runs queued sessions one at a time.

It keeps loaded models in memory between sessions, logs every verification step through the
store's batched writer, samples utilisation alongside, beats a heartbeat, and honours a cancel
request within one verification step. A worker that dies mid-session leaves the session
'running'; whoever looks next (a worker, `sessions`, the dashboard) marks it interrupted (its steps are kept) and it
can be re-queued, and the worker that runs it again resumes it (engine.service.worker.resume: what was measured is
reused, only the missing configuration × prompt pairs run). An end the worker cannot write (the disk is full) is
kept pending and written, with its true cause, once writes are possible again (store.orphans)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from typing import Any

from engine.core.records import Cancelled
from engine.drafts.kinds import draft_kind
from engine.engines import registry
from engine.errors import SpectuneError
from engine.models.pool import ModelPool
from engine.service.worker.control import (
    ensure_worker,
    release_pid_file,
    worker_alive,
    worker_log_path,
    worker_pid_path,
)
from engine.service.worker.store_hooks import TERMINATING, StoreHooks
from engine.session.estimates import batch_sweep_eta_s, compile_each_s
from engine.session.regime_evidence import detect_regime
from engine.session.runner import PromptText
from engine.session.sampling import session_prompts
from engine.session.spec import SessionSpec, gammas_and_policies, widest_draft
from foundation.jsonable import jsonable
from store.errors import DamagedStoreError, StoreError
from store.orphans import STALE_AFTER_S

log = logging.getLogger("spectune.worker")


def run_session(store: Any, session: dict[str, Any], pool: ModelPool, worker_id: str) -> str:
    """Run one claimed session to its end state; returns that state. Never raises for session errors.

    The pool keeps only what the session loads (its target and drafts in its dtype, in an in-process engine) while
    it runs, and nothing after one that did not finish: models of a cancelled or failed session are not held."""
    state = _run_session(store, session, pool, worker_id)
    if state != "done":
        _release(pool.clear(), f"after session {session['id']} ({state})")
    return state


def keep_for(pool: ModelPool, spec: SessionSpec) -> list[tuple[str, str, str]]:
    """Drop the pooled models `spec` does not load (all of them for an engine whose models live elsewhere)."""
    wanted = {spec.target, *spec.drafts} if registry.get(spec.engine).in_process else set()
    return pool.keep_only(wanted, spec.dtype, spec.device)


def _release(dropped: list[tuple[str, str, str]], when: str) -> None:
    if dropped:
        log.info("released %s from the model pool %s", ", ".join(f"{r} ({d})" for r, d, _ in dropped), when)


def _run_session(store: Any, session: dict[str, Any], pool: ModelPool, worker_id: str) -> str:
    from engine.measure.hardware import describe_hardware
    from engine.measure.telemetry import UtilisationSampler

    session_id = session["id"]
    hooks = StoreHooks(store, session_id, worker_id, resume=_ran_before(store, session_id))
    hooks.start_heartbeat()
    sampler = None
    try:
        settings = SessionSpec.from_row(session)
        _release(keep_for(pool, settings), f"before session {session_id}: it does not use them")
        hardware = describe_hardware()
        store.set_hardware(session_id, hardware.get("label", "unknown hardware"))
        prompts = [
            PromptText(str(p.get("id", i)), p["text"], p.get("category"))
            for i, p in enumerate(session_prompts(store.get_prompts, session, settings.prompt_sample))
        ]
        entry = registry.get(settings.engine)
        start_unix = time.time()
        sampler = UtilisationSampler(
            interval_s=0.5, on_sample=lambda t, source, m: hooks.sample(start_unix + t, source, m)
        )
        sampler.start()
        if settings.mode == "quick" and not entry.deployment:
            from engine.service.worker.sweeps import run_quick

            report = run_quick(store, session_id, settings, entry, prompts, hooks, pool).to_dict()
        elif not entry.deployment:
            from engine.service.worker.sweeps import run_full

            report = run_full(store, session_id, settings, entry, prompts, hooks, pool).to_dict()
        else:
            report = registry.sweep(settings, prompts, hooks=hooks, pool=pool).to_dict()
        if not report.get("stopped"):
            hooks.all_decoded()  # what a confirmation reserved and did not need counts as done
        sampler.stop()
        if settings.detect_regime and entry.in_process and not TERMINATING.is_set():
            _regime_evidence(store, session_id, pool, report, settings, hooks)
        summary = _session_summary(report, hardware, sampler.describe())
        if report.get("hardware"):  # the numbers ran elsewhere (a deployment)
            store.set_hardware(session_id, report["hardware"])
        if hooks.check_replaced():  # deleted under the session since the last beat: ended as cut short, spilled
            return _stopped(store, session_id, hooks)
        hooks.phase("done", 1, 1, 0.0)
        if report.get("stopped"):  # the engine stopped early: what it measured is kept, the session failed
            return _end(store, session_id, hooks, "failed", report["stopped"], summary=jsonable(summary))
        status = _end(store, session_id, hooks, "done", None, summary=jsonable(summary))
        if status == "done":
            _decide(store, session_id, settings)
        return status
    except Cancelled:
        return _stopped(store, session_id, hooks)
    except SpectuneError as exc:
        hooks.discard_writer()
        return _end(store, session_id, hooks, "failed", _error_text(exc), runs="failed")
    except MemoryError:
        hooks.discard_writer()
        pool.clear()
        error = "out of memory: the models do not fit on this machine"
        return _end(store, session_id, hooks, "failed", error, runs="failed")
    except Exception as exc:
        hooks.discard_writer()
        message = str(exc).splitlines()[0] if str(exc) else ""
        if "out of memory" in message.lower():
            pool.clear()
            error = f"out of memory: {message}"
        else:
            error = f"internal error ({type(exc).__name__}: {message}); see {worker_log_path()}"
        log.error("session %s failed:\n%s", session_id, traceback.format_exc())
        return _end(store, session_id, hooks, "failed", error, runs="failed")
    finally:
        hooks.stop_heartbeat()
        if sampler is not None and sampler.running:
            sampler.stop()


def _decide(store: Any, session_id: int, spec: SessionSpec) -> None:
    """The session's decision at each temperature it measured, for its serving batch and the default objective,
    made once now and stored (engine.service.decide.decisions): every page reads it from here on."""
    from engine.service.decide.decisions import DecisionQuery, decision_for

    for temperature in spec.temperatures:
        query = DecisionQuery.of_session(spec.serving_batch, temperature)
        try:
            decision_for(store, [session_id], query)
        except SpectuneError as exc:  # nothing to decide from (no draft measured): the pages say so when read
            log.info("session %s: no decision at T=%g: %s", session_id, temperature, exc)
        except Exception:  # noqa: BLE001 - the session is done and stored; a reader decides again
            log.error("session %s: its decision failed:\n%s", session_id, traceback.format_exc())


def _ran_before(store: Any, session_id: int) -> bool:
    """Whether the session has runs from an earlier attempt (re-queued after its worker died or was stopped): it
    resumes. A store that cannot be read answers False; the session's first write reports it."""
    try:
        return bool(store.list_runs(session_id))
    except StoreError:
        return False


def _error_text(exc: SpectuneError) -> str:
    """A session's error line for a refused or failed step; a full disk says so first (its true cause)."""
    text = str(exc)
    return f"disk full: {text}" if isinstance(exc, StoreError) and "disk is full" in text else text


def _end(
    store: Any,
    session_id: int,
    hooks: StoreHooks,
    status: str,
    error: str | None,
    summary: dict[str, Any] | None = None,
    runs: str | None = None,
) -> str:
    """Close the open runs (with ``runs``) and end the session; returns ``status``. When the store cannot be
    written (the disk is full) the end is recorded as pending, with its cause, for when writes work again."""
    try:
        if runs is not None:
            _mark_open_run(store, hooks, runs)
        store.finish_session(session_id, status, error=error, summary=summary)
        return status
    except StoreError as exc:
        if status == "done":
            status, error = "failed", _error_text(exc)
        log.error("session %s: its end (%s: %s) could not be written: %s", session_id, status, error, exc)
        store.record_ending(session_id, status, error or status)
        return status


def _regime_evidence(
    store: Any, session_id: int, pool: ModelPool, report: dict[str, Any], settings: SessionSpec, hooks: StoreHooks
) -> None:
    """The batch sweep, roofline and v(k) verdict after the sweep; its time joins the report's phase times."""
    base_tps = (report.get("baseline") or {}).get("tokens_per_s")
    compiled = report.get("loop") == "compiled"
    widths = widest_draft(*gammas_and_policies(settings)) + 1
    models = 1 + sum(1 for d in settings.drafts if draft_kind(d).needs_model)
    each = compile_each_s(report.get("compile_s"), widths, models) if compiled else 0.0
    eta = batch_sweep_eta_s(1.0 / base_tps if base_tps else None, settings.serving_batch, each)
    hooks.phase(f"batch sweep up to batch {settings.serving_batch * 2}", 0, 1, eta)
    started = time.perf_counter()
    try:
        store.set_regime(session_id, detect_regime(pool, report, settings, settings.serving_batch))
    except Exception as exc:  # evidence is a bonus; never fail a finished sweep over it
        log.warning("regime detection failed: %s", exc)
    report.setdefault("phase_times_s", {})["batch sweep"] = round(time.perf_counter() - started, 3)


def _session_summary(report: dict[str, Any], hardware: dict[str, Any], telemetry: Any) -> dict[str, Any]:
    """What the sessions table keeps of a report: everything but the outputs (stored per run already)."""
    summary = {k: v for k, v in report.items() if k not in ("baseline", "runs")}
    summary["hardware"] = hardware
    summary["telemetry_source"] = telemetry
    for part in ("runs", "baselines"):
        summary[part] = [{k: v for k, v in r.items() if k not in ("outputs", "agreement_runs")} for r in report[part]]
    return summary


def _stopped(store: Any, session_id: int, hooks: StoreHooks) -> str:
    """A sweep that stopped early: lost to another worker, interrupted by the worker's SIGTERM, or cancelled."""
    hooks.discard_writer()
    if hooks.lost:  # ended as orphaned by another process: that status stands
        _mark_open_run(store, hooks, "failed")
        return "failed"
    if hooks.replaced:  # written into the file the worker still has open: whoever restores it can requeue it
        error = (
            f"{hooks.replaced}; what it measured is kept in that file (requeue: python -m engine "
            f"requeue --session {session_id})"
        )
        return _end(store, session_id, hooks, "interrupted", error, runs="cancelled")
    if TERMINATING.is_set():
        error = (
            f"the worker was stopped; what it measured is kept (requeue: python -m engine requeue --session "
            f"{session_id})"
        )
        return _end(store, session_id, hooks, "interrupted", error, runs="cancelled")
    return _end(store, session_id, hooks, "cancelled", "cancelled by the user", runs="cancelled")


def _mark_open_run(store: Any, hooks: StoreHooks, status: str) -> None:
    """Every run the sweep left open (an interleaved sweep has them all open at once) gets ``status``."""
    for run_id in hooks.open_runs:
        run = store.get_run(run_id)
        if run and run.get("status") == "running":
            store.update_run(run_id, status=status)


REPLACED_WAY_OUT = (
    "It takes no more work: a new database at that path would not hold what the old one did, and nothing is written "
    "there. Put a backup in place (python -m engine restore FILE) or start a new database, then start the worker again"
)


class WriteBackoff:
    """How long the idle worker waits while the database refuses writes (the disk is full): the poll interval,
    doubled after each failed try up to a cap, back to the poll interval once every refused write has gone
    through; and whether a try's outcome changes that state, the only thing worth a log line. Each kind of write
    (`what`: claiming a session, writing pending ends) clears only its own failure."""

    def __init__(self, poll_s: float, cap_s: float = 60.0) -> None:
        self.poll_s = poll_s
        self.cap_s = max(cap_s, poll_s)
        self.failures = 0
        self.failing: dict[str, str] = {}  # what fails -> why

    @property
    def wait_s(self) -> float:
        """How long to wait before the next try."""
        return min(self.poll_s * 2**self.failures, self.cap_s)

    def failed(self, what: str, reason: str) -> bool:
        """``what`` was refused for ``reason``; True when that is news (writes worked, or fail for a new reason)."""
        news = _kind_of_failure(reason) not in {_kind_of_failure(r) for r in self.failing.values()}
        self.failures += 1
        self.failing[what] = reason
        return news

    def worked(self, what: str) -> bool:
        """``what`` went through; True when that was the last refused write (news: writes work again)."""
        if self.failing.pop(what, None) is None or self.failing:
            return False
        self.failures = 0
        return True


def _kind_of_failure(reason: str) -> str:
    """A failure's kind, without its details: a full disk stays one state however its message varies."""
    lowered = reason.lower()
    kinds = ("disk is full", "disk i/o error", "locked", "read-only")
    return next((kind for kind in kinds if kind in lowered), lowered)


def serve(
    store: Any,
    once: bool = False,
    poll_s: float = 0.5,
    max_sessions: int | None = None,
    idle_exit_s: float | None = None,
) -> int:
    """Claim and run sessions until stopped; returns how many ran. While the database refuses writes the worker
    backs off exponentially and logs only when that state changes."""
    from store.workers import make_worker_id

    worker_id = make_worker_id()
    backoff = WriteBackoff(poll_s)
    _tidy(store, backoff)
    pool = ModelPool()
    ran = 0
    cut_short: int | None = None  # the last session, when it ended interrupted: its database may be gone
    idle_since = time.monotonic()
    TERMINATING.clear()

    def _stop(signum: int, frame: Any) -> None:
        log.info("signal %s: finishing the current step, then exiting", signum)
        TERMINATING.set()
        release_pid_file(os.getpid())

    # signal handlers can only be installed on the main thread; the previous ones are put back on the way out
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)} if on_main_thread else {}
    try:
        while not TERMINATING.is_set():
            if (why := store.replaced()) is not None:
                _stop_for_a_replaced_file(store, why, cut_short)
                break
            try:
                store.recheck_damage()
                session = store.claim_next_session(worker_id)
                _note_success(backoff, "claim")
            except DamagedStoreError as exc:  # no new work in a damaged database: say why once, and stop
                log.error("the worker stops: %s", exc)
                break
            except StoreError as exc:
                _note_failure(backoff, "claim", exc)
                session = None
            if session is None:
                if once or (idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s):
                    break
                TERMINATING.wait(backoff.wait_s)
                _tidy(store, backoff)
                continue
            state = run_session(store, session, pool, worker_id)
            log.info("session %s: %s", session["id"], state)
            cut_short = session["id"] if state == "interrupted" else None
            ran += 1
            idle_since = time.monotonic()
            if max_sessions is not None and ran >= max_sessions:
                break
    finally:
        for what, count in registry.stop_all_processes().items():  # no server outlives the worker
            log.info("stopped %d %s", count, what)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return ran


def _stop_for_a_replaced_file(store: Any, why: str, cut_short: int | None) -> None:
    """Say why the worker stops; a deleted, moved or replaced file it still holds is first copied out for
    `restore`, and the session it cut short is spilled from that copy, to be replayed into the next database at
    the path (store.spill)."""
    saved = store.save_open_copy()
    if saved is None:
        log.error("the worker stops: %s. %s", why, REPLACED_WAY_OUT)
        return
    spilled = store.spill_from_copy(saved, cut_short) if cut_short is not None else None
    carried = (
        f" Session {cut_short}, which it was running, is spilled to {spilled}: it is replayed into the next "
        "database at that path (a new one, or a backup put in place), ready to requeue."
        if spilled is not None
        else ""
    )
    log.error(
        "the worker stops: %s. What it held, the last session's steps included, is saved as %s: put it "
        "back with python -m engine restore %s.%s",
        why,
        saved,
        saved,
        carried,
    )


def _note_failure(backoff: WriteBackoff, what: str, exc: StoreError) -> None:
    """Count a refused write; one log line when writes start failing (or fail for a new reason)."""
    if backoff.failed(what, str(exc)):
        log.warning(
            "the database refuses writes (%s): no session is started and pending session ends wait; "
            "retrying with a doubling wait, at most every %.0f s",
            exc,
            backoff.cap_s,
        )


def _note_success(backoff: WriteBackoff, what: str) -> None:
    """One log line when the last refused write went through."""
    if backoff.worked(what):
        log.warning("the database takes writes again")


def _tidy(store: Any, backoff: WriteBackoff) -> None:
    """Write the session ends left pending by a full disk, then mark sessions whose worker died interrupted."""
    try:
        settled = store.settle_endings()
        _note_success(backoff, "endings")
        orphaned = store.interrupt_orphaned_sessions(STALE_AFTER_S)
    except StoreError as exc:
        _note_failure(backoff, "endings", exc)
        return
    if settled:
        log.warning("wrote the pending ends of sessions %s", settled)
    if orphaned:
        log.warning("sessions whose worker died, marked interrupted: %s", orphaned)


def main_worker(once: bool = False, max_sessions: int | None = None, idle_exit_s: float | None = None) -> int:
    """Entry for `python -m engine worker`: records its pid so the dashboard can find it."""
    from engine.service.jobs import open_app_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = open_app_store()
    if worker_alive() is None:
        worker_pid_path().write_text(str(os.getpid()))
    ran = serve(store, once=once, max_sessions=max_sessions, idle_exit_s=idle_exit_s)
    release_pid_file(os.getpid())
    log.info("worker exiting after %d session(s)", ran)
    return 2 if store.damage is not None or store.replaced() is not None else 0


__all__ = ["ensure_worker", "main_worker", "run_session", "serve", "worker_alive", "worker_log_path", "worker_pid_path"]
