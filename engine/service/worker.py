"""The decoding worker: one long-lived process that runs queued sessions one at a time.

It keeps loaded models in memory between sessions, logs every verification step through the
store's batched writer, samples utilisation alongside, beats a heartbeat, and honours a cancel
request within one verification step. A worker that dies mid-session leaves the session
'running'; the next worker to start marks it failed (its steps are kept)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import asdict, is_dataclass
from typing import Any

from engine.core.records import Cancelled
from engine.errors import SpectuneError
from engine.llamacpp.server import stop_all
from engine.models.pool import ModelPool
from engine.service.store_hooks import TERMINATING, StoreHooks
from engine.service.worker_control import ensure_worker, worker_alive, worker_log_path, worker_pid_path
from engine.session.llamacpp_sweep import run_llamacpp_sweep
from engine.session.sampling import session_prompts
from engine.session.spec import SessionSpec
from engine.session.sweep import PromptText, batch_sweep_eta_s, run_sweep

log = logging.getLogger("spectune.worker")


STALE_AFTER_S = 30.0


def _jsonable(value: Any) -> Any:
    if is_dataclass(value):
        return _jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _roofline_for(target: Any, serving_batch: int, step_time_s: float, context_len: int) -> Any:
    """Achieved bandwidth and FLOP/s of one decode step at the serving batch, against measured peaks."""
    import torch

    from engine.analysis.regime import roofline
    from engine.measure.microbench import measure_copy_bandwidth, measure_matmul_flops

    params = sum(p.numel() for p in target.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    cfg = target.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    elem = torch.finfo(target.model.dtype).bits // 8
    kv_bytes = 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem * context_len * serving_batch
    flops = 2.0 * params * serving_batch  # one multiply-add per weight per row
    peak_bw = measure_copy_bandwidth(target.device)
    peak_flops = measure_matmul_flops(target.device, dtype=target.model.dtype)
    return roofline(weight_bytes, kv_bytes, flops, step_time_s, peak_bw, peak_flops)


def detect_regime(pool: ModelPool, report: dict[str, Any], settings: Any, serving_batch: int) -> dict[str, Any]:
    """Regime evidence for the session: measured v(k), a batch sweep, a roofline, and NVML counters on a GPU.

    The measurements are stored raw and judged by engine.analysis.regime.judge_regime — the same
    judgement the CLI and the dashboard make later from the stored record.
    """
    from engine.analysis.regime import judge_regime
    from engine.analysis.theory import measured_verify_points
    from engine.measure.microbench import batch_sweep
    from engine.measure.telemetry import nvml_available, nvml_snapshot

    verify = measured_verify_points(report.get("verify_cost"))
    target = pool.get(settings.target, settings.dtype, settings.device, settings.trust_remote_code)
    # up to the serving batch and beyond, until step time grows about linearly (batch_sweep stops there)
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, serving_batch, serving_batch * 2})
    sweep = batch_sweep(target.model, input_len=32, batch_sizes=sizes, reps=2, device=target.device)
    times = dict(zip(sweep.batch_sizes, sweep.step_times_s, strict=True))
    at_batch = min(times, key=lambda b: abs(b - serving_batch))
    roof = _roofline_for(target, at_batch, times[at_batch], 32)
    record: dict[str, Any] = {
        "serving_batch": serving_batch,
        "batch_sweep": {"batch_sizes": list(sweep.batch_sizes), "step_times_s": list(sweep.step_times_s)},
        "verify_cost": {str(k): v for k, v in sorted(verify.items())},
        "roofline": _jsonable(roof),
    }
    verdict = judge_regime(record, serving_batch, verify_cost=verify)
    nvml = nvml_snapshot(gpm_window_s=0.5) if nvml_available() else None
    evidence = list(verdict.evidence)
    if nvml:
        shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(nvml.items()) if k.endswith("_pct"))
        evidence.append(f"NVML cross-check (GPU utilisation alone says nothing about the regime): {shown}")
    return _jsonable(
        record
        | {
            "label": verdict.label,
            "evidence": evidence,
            "votes": verdict.votes,
            "agree": verdict.agree,
            "flags": verdict.flags,
            "batch_classification": verdict.sweep,
            "verify_classification": verdict.verify,
            "roofline": verdict.roof,
            "nvml": nvml,
        }
    )


def run_session(store: Any, session: dict[str, Any], pool: ModelPool, worker_id: str) -> str:
    """Run one claimed session to its end state; returns that state. Never raises for session errors."""
    from engine.measure.hardware import describe_hardware
    from engine.measure.telemetry import UtilisationSampler

    session_id = session["id"]
    hooks = StoreHooks(store, session_id, worker_id)
    hooks.start_heartbeat()
    sampler = None
    try:
        settings = SessionSpec.from_row(session)
        hardware = describe_hardware()
        store.set_hardware(session_id, hardware.get("label", "unknown hardware"))
        prompts = [
            PromptText(str(p.get("id", i)), p["text"], p.get("category"))
            for i, p in enumerate(session_prompts(store.get_prompts, session, settings.prompt_sample))
        ]
        if settings.engine == "endpoint":  # a running deployment: no local model, so no utilisation sampling
            from engine.service.endpoint_cli import run_endpoint_session

            return run_endpoint_session(store, session, settings, prompts, hooks)
        start_unix = time.time()
        sampler = UtilisationSampler(
            interval_s=0.5, on_sample=lambda t, source, m: hooks.sample(start_unix + t, source, m)
        )
        sampler.start()
        if settings.engine == "llama.cpp":
            report = run_llamacpp_sweep(settings, prompts, hooks=hooks)
        else:
            report = run_sweep(settings, prompts, pool=pool, hooks=hooks)
        sampler.stop()
        regime = None
        if settings.detect_regime and settings.engine == "spectune" and not TERMINATING.is_set():
            base_tps = (report.get("baseline") or {}).get("tokens_per_s")
            eta = batch_sweep_eta_s(1.0 / base_tps if base_tps else None, settings.serving_batch)
            hooks.phase(f"batch sweep up to batch {settings.serving_batch * 2}", 0, 1, eta)
            started = time.perf_counter()
            try:
                regime = detect_regime(pool, report, settings, settings.serving_batch)
                store.set_regime(session_id, regime)
            except Exception as exc:  # evidence is a bonus; never fail a finished sweep over it
                log.warning("regime detection failed: %s", exc)
            report.setdefault("phase_times_s", {})["batch sweep"] = round(time.perf_counter() - started, 3)
        summary = {k: v for k, v in report.items() if k not in ("baseline", "runs")}
        summary["hardware"] = hardware
        summary["telemetry_source"] = sampler.describe()
        summary["runs"] = [
            {k: v for k, v in r.items() if k not in ("outputs", "agreement_runs")} for r in report["runs"]
        ]
        hooks.phase("done", 1, 1, 0.0)
        store.finish_session(session_id, "done", summary=_jsonable(summary))
        return "done"
    except Cancelled:
        hooks.discard_writer()
        if hooks.lost:  # failed as orphaned by another worker: that status stands
            _mark_open_run(store, hooks, "failed")
            return "failed"
        if TERMINATING.is_set():
            _mark_open_run(store, hooks, "cancelled")
            store.finish_session(
                session_id, "interrupted",
                error=f"the worker was stopped; what it measured is kept (requeue: python -m engine requeue --session "
                f"{session_id})",
            )  # fmt: skip
            return "interrupted"
        _mark_open_run(store, hooks, "cancelled")
        store.finish_session(session_id, "cancelled", error="cancelled by the user")
        return "cancelled"
    except SpectuneError as exc:
        hooks.discard_writer()
        _mark_open_run(store, hooks, "failed")
        store.finish_session(session_id, "failed", error=str(exc))
        return "failed"
    except MemoryError:
        hooks.discard_writer()
        _mark_open_run(store, hooks, "failed")
        pool.clear()
        store.finish_session(session_id, "failed", error="out of memory: the models do not fit on this machine")
        return "failed"
    except Exception as exc:
        hooks.discard_writer()
        _mark_open_run(store, hooks, "failed")
        message = str(exc).splitlines()[0] if str(exc) else ""
        if "out of memory" in message.lower():
            pool.clear()
            error = f"out of memory: {message}"
        else:
            error = f"internal error ({type(exc).__name__}: {message}); see {worker_log_path()}"
        log.error("session %s failed:\n%s", session_id, traceback.format_exc())
        store.finish_session(session_id, "failed", error=error)
        return "failed"
    finally:
        hooks.stop_heartbeat()
        if sampler is not None and sampler.running:
            sampler.stop()


def _mark_open_run(store: Any, hooks: StoreHooks, status: str) -> None:
    """Every run the sweep left open (an interleaved sweep has them all open at once) gets ``status``."""
    for run_id in hooks.open_runs:
        run = store.get_run(run_id)
        if run and run.get("status") == "running":
            store.update_run(run_id, status=status)


def serve(
    store: Any,
    once: bool = False,
    poll_s: float = 0.5,
    max_sessions: int | None = None,
    idle_exit_s: float | None = None,
) -> int:
    """Claim and run sessions until stopped; returns how many ran."""
    from store.workers import make_worker_id

    worker_id = make_worker_id()
    orphaned = store.fail_orphaned_sessions(STALE_AFTER_S)
    if orphaned:
        log.warning("marked orphaned sessions failed: %s", orphaned)
    pool = ModelPool()
    ran = 0
    idle_since = time.monotonic()
    TERMINATING.clear()

    def _stop(signum: int, frame: Any) -> None:
        log.info("signal %s: finishing the current step, then exiting", signum)
        TERMINATING.set()

    # signal handlers can only be installed on the main thread; the previous ones are put back on the way out
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)} if on_main_thread else {}
    try:
        while not TERMINATING.is_set():
            session = store.claim_next_session(worker_id)
            if session is None:
                if once or (idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s):
                    break
                TERMINATING.wait(poll_s)
                store.fail_orphaned_sessions(STALE_AFTER_S)
                continue
            state = run_session(store, session, pool, worker_id)
            log.info("session %s: %s", session["id"], state)
            ran += 1
            idle_since = time.monotonic()
            if max_sessions is not None and ran >= max_sessions:
                break
    finally:
        stopped = stop_all()  # no llama-server outlives the worker, whatever ended the loop
        if stopped:
            log.info("stopped %d llama-server process(es)", stopped)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return ran


def main_worker(once: bool = False, max_sessions: int | None = None, idle_exit_s: float | None = None) -> int:
    """Entry for `python -m engine worker`: records its pid so the dashboard can find it."""
    from engine.service.jobs import open_app_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = open_app_store()
    if worker_alive() is None:
        worker_pid_path().write_text(str(os.getpid()))
    ran = serve(store, once=once, max_sessions=max_sessions, idle_exit_s=idle_exit_s)
    log.info("worker exiting after %d session(s)", ran)
    return 0


__all__ = ["ensure_worker", "main_worker", "run_session", "serve", "worker_alive", "worker_log_path", "worker_pid_path"]
