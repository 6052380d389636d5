"""Regime evidence measured after a session in spectune's loop: v(k), a batch sweep, a roofline, NVML on a GPU.

The measurements are stored raw and judged by engine.analysis.regime.judge_regime — the same judgement the CLI
and the dashboard make later from the stored record."""

from __future__ import annotations

import logging
from typing import Any

from engine.analysis.regime import judge_regime, roofline
from engine.analysis.theory import measured_verify_points
from engine.measure.microbench import (
    BatchSweep,
    batch_sweep,
    compiled_batch_sweep,
    measure_copy_bandwidth,
    measure_matmul_flops,
)
from engine.measure.telemetry import nvml_available, nvml_snapshot
from engine.models.pool import ModelPool
from foundation.jsonable import jsonable

log = logging.getLogger("spectune.regime")


def _roofline_for(target: Any, serving_batch: int, step_time_s: float, context_len: int) -> Any:
    """Achieved bandwidth and FLOP/s of one decode step at the serving batch, against measured peaks."""
    import torch

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


def _sweep_in_session_loop(target: Any, report: dict[str, Any], sizes: list[int]) -> BatchSweep:
    """The batch sweep timed in the loop the session decoded in: the target's compiled loop when the report says
    "compiled" and the target still holds it, else (or when the compiled sweep fails, said in one line) eager."""
    loop = getattr(target, "compiled", None)
    if report.get("loop") == "compiled" and loop is not None:
        try:
            return compiled_batch_sweep(loop, input_len=32, batch_sizes=sizes, reps=5)
        except Exception as exc:  # noqa: BLE001 - the eager sweep still measures the regime
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            log.warning("%s: the batch sweep in the compiled loop failed (%s); sweeping eagerly", target.ref, first)
    return batch_sweep(target.model, input_len=32, batch_sizes=sizes, reps=5, device=target.device)


def detect_regime(pool: ModelPool, report: dict[str, Any], settings: Any, serving_batch: int) -> dict[str, Any]:
    """Regime evidence for the session: measured v(k), a batch sweep, a roofline, and NVML counters on a GPU.

    The batch sweep runs in the loop the session decoded in (the report's "loop"), and the record says which.

    The measurements are stored raw and judged by engine.analysis.regime.judge_regime — the same
    judgement the CLI and the dashboard make later from the stored record.
    """
    verify = measured_verify_points(report.get("verify_cost"))
    target = pool.get(settings.target, settings.dtype, settings.device, settings.trust_remote_code)
    # up to the serving batch and beyond, in interleaved rounds (a burst of load never lands on one batch alone)
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, serving_batch, serving_batch * 2})
    sweep = _sweep_in_session_loop(target, report, sizes)
    times = dict(zip(sweep.batch_sizes, sweep.step_times_s, strict=True))
    at_batch = min(times, key=lambda b: abs(b - serving_batch))
    roof = _roofline_for(target, at_batch, times[at_batch], 32)
    record: dict[str, Any] = {
        "serving_batch": serving_batch,
        "batch_sweep": {
            "batch_sizes": list(sweep.batch_sizes),
            "step_times_s": list(sweep.step_times_s),
            "spread_s": [list(x) for x in sweep.spread_s],
            "reps": sweep.reps,
            "loop": sweep.loop,
        },
        "verify_cost": {str(k): v for k, v in sorted(verify.items())},
        "roofline": jsonable(roof),
    }
    verdict = judge_regime(record, serving_batch, verify_cost=verify)
    nvml = nvml_snapshot(gpm_window_s=0.5) if nvml_available() else None
    evidence = list(verdict.evidence)
    if nvml:
        shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(nvml.items()) if k.endswith("_pct"))
        evidence.append(f"NVML cross-check (GPU utilisation alone says nothing about the regime): {shown}")
    return jsonable(
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
