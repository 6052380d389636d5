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

from engine.core.decoder import Cancelled
from engine.errors import SpectuneError
from engine.models.pool import ModelPool
from engine.service.store_hooks import StoreHooks
from engine.service.worker_control import ensure_worker, worker_alive, worker_log_path, worker_pid_path
from engine.session.spec import SessionSpec
from engine.session.sweep import PromptText, run_sweep

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
    """Regime evidence for the session: measured v(k), a batch sweep, a roofline, and NVML counters on a GPU."""
    from engine.analysis.regime import classify_batch_sweep, classify_verify_curve, regime_report
    from engine.measure.microbench import batch_sweep
    from engine.measure.telemetry import nvml_available, nvml_snapshot

    verify = {int(k): float(v) for k, v in report.get("verify_cost", {}).items()}
    verify_cls = classify_verify_curve(verify) if len(verify) > 1 else None
    target = pool.get(settings.target, settings.dtype, settings.device, settings.trust_remote_code)
    # up to the serving batch and beyond, until step time grows about linearly (batch_sweep stops there)
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, serving_batch, serving_batch * 2})
    sweep = batch_sweep(target.model, input_len=32, batch_sizes=sizes, reps=2, device=target.device)
    sweep_cls = classify_batch_sweep(list(sweep.batch_sizes), list(sweep.step_times_s), serving_batch)
    times = dict(zip(sweep.batch_sizes, sweep.step_times_s, strict=True))
    at_batch = min(times, key=lambda b: abs(b - serving_batch))
    roof = _roofline_for(target, at_batch, times[at_batch], 32)
    verdict = regime_report(sweep=sweep_cls, verify=verify_cls, roof=roof)
    nvml = nvml_snapshot(gpm_window_s=0.5) if nvml_available() else None
    evidence = list(verdict.evidence)
    if nvml:
        shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(nvml.items()) if k.endswith("_pct"))
        evidence.append(f"NVML cross-check (GPU utilisation alone says nothing about the regime): {shown}")
    return _jsonable(
        {
            "label": verdict.label,
            "serving_batch": serving_batch,
            "evidence": evidence,
            "votes": verdict.votes,
            "batch_sweep": {"batch_sizes": list(sweep.batch_sizes), "step_times_s": list(sweep.step_times_s)},
            "batch_classification": sweep_cls,
            "verify_classification": verify_cls,
            "roofline": roof,
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
            for i, p in enumerate(store.get_prompts(session["prompt_set_id"], limit=session.get("n_prompts")))
        ] if session.get("prompt_set_id") else []
        start_unix = time.time()
        sampler = UtilisationSampler(
            interval_s=0.5, on_sample=lambda t, source, m: hooks.sample(start_unix + t, source, m)
        )
        sampler.start()
        report = run_sweep(settings, prompts, pool=pool, hooks=hooks)
        sampler.stop()
        regime = None
        if settings.detect_regime:
            try:
                regime = detect_regime(pool, report, settings, settings.serving_batch)
                store.set_regime(session_id, regime)
            except Exception as exc:  # evidence is a bonus; never fail a finished sweep over it
                log.warning("regime detection failed: %s", exc)
        summary = {k: v for k, v in report.items() if k not in ("baseline", "runs")}
        summary["hardware"] = hardware
        summary["telemetry_source"] = sampler.describe()
        summary["runs"] = [
            {k: v for k, v in r.items() if k not in ("outputs", "agreement_runs")} for r in report["runs"]
        ]
        store.finish_session(session_id, "done", summary=_jsonable(summary))
        return "done"
    except Cancelled:
        hooks.discard_writer()
        if hooks.lost:  # failed as orphaned by another worker: that status stands
            _mark_open_run(store, hooks, "failed")
            return "failed"
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
    if hooks.run_id is not None:
        run = store.get_run(hooks.run_id)
        if run and run.get("status") == "running":
            store.update_run(hooks.run_id, status=status)


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
    stopping = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    # signal handlers can only be installed on the main thread; the previous one is put back on the way out
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if on_main_thread else None
    try:
        while not stopping:
            session = store.claim_next_session(worker_id)
            if session is None:
                if once or (idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s):
                    break
                time.sleep(poll_s)
                store.fail_orphaned_sessions(STALE_AFTER_S)
                continue
            state = run_session(store, session, pool, worker_id)
            log.info("session %s: %s", session["id"], state)
            ran += 1
            idle_since = time.monotonic()
            if max_sessions is not None and ran >= max_sessions:
                break
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
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
