"""From measured requests and counters to the figures shown and exported: per level, and compared.

Everything here works on plain dicts (a RequestResult's `row()` or a stored endpoint_requests row), so the
CLI, the worker and the dashboard's live view compute the same numbers. No I/O.

- tokens/s at a level: output tokens of its successful requests ÷ the level's wall time (all together).
- TTFT and ITL percentiles: over successful requests; ITL over every gap between streamed chunks.
- goodput: requests per second (and their tokens per second) meeting the latency target: TTFT ≤ `ttft_slo_s`
  and time per output token ≤ `tpot_slo_s` (0 = no bound on that one).
- the flip: with a baseline endpoint (same model, no speculation) driven at the same levels, speedup =
  speculative tokens/s ÷ baseline tokens/s per level, and the lowest measured concurrency where it is ≤ 1.
- predicted points: Theorem 3.8's memory-bound form, speedup = E ÷ (γc + 1), with E the measured mean
  acceptance length at that level, γ the mean draft length, and c fitted so that the prediction equals the
  measurement at the lowest level. It assumes a verify step costs the same at any batch, which is exactly
  what stops holding as concurrency grows: the gap between predicted and measured is the regime change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.engines.endpoint.results import LevelResult, SweepResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100), linearly interpolated (numpy's default); None for no values."""
    data = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    if not data:
        return None
    rank = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return data[lo] + (data[hi] - data[lo]) * (rank - lo)


def wall_time(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """From the first request's start to the last one's end (for rows read back from the store)."""
    spans = [(float(r["started_at"]), float(r["started_at"]) + float(r.get("duration_s") or 0.0)) for r in rows]
    if not spans:
        return None
    return max(end for _, end in spans) - min(start for start, _ in spans)


def meets_slo(row: Mapping[str, Any], ttft_slo_s: float = 0.0, tpot_slo_s: float = 0.0) -> bool:
    if not row.get("ok"):
        return False
    if ttft_slo_s and (row.get("ttft_s") is None or row["ttft_s"] > ttft_slo_s):
        return False
    return not (tpot_slo_s and row.get("tpot_s") is not None and row["tpot_s"] > tpot_slo_s)


def request_stats(
    rows: Sequence[Mapping[str, Any]], wall_s: float | None = None, ttft_slo_s: float = 0.0, tpot_slo_s: float = 0.0
) -> dict[str, Any]:
    """Throughput, latency percentiles, errors, goodput and the per-request speculation sums of one level."""
    ok = [r for r in rows if r.get("ok")]
    wall = wall_s if wall_s is not None else wall_time(rows)
    tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    itl = [gap for r in ok for gap in (r.get("itl_s") or [])]
    tpot = [r["tpot_s"] for r in ok if r.get("tpot_s") is not None]
    good = [r for r in ok if meets_slo(r, ttft_slo_s, tpot_slo_s)]
    with_timings = [r for r in ok if r.get("draft_n") is not None]
    draft_n = sum(int(r["draft_n"]) for r in with_timings)
    accepted = sum(int(r.get("draft_n_accepted") or 0) for r in with_timings)
    verify = [r for r in with_timings if r.get("verify_calls")]
    errors: dict[str, int] = {}
    for r in rows:
        if not r.get("ok"):
            errors[str(r.get("error_kind") or "error")] = errors.get(str(r.get("error_kind") or "error"), 0) + 1
    per_s = (lambda n: n / wall) if wall else (lambda n: None)
    return {
        "requests": len(rows),
        "ok": len(ok),
        "errors": len(rows) - len(ok),
        "error_kinds": errors,
        "retries": sum(int(r.get("retries") or 0) for r in rows),
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": per_s(tokens),
        "requests_per_s": per_s(len(ok)),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "itl_p50_s": percentile(itl, 50),
        "itl_p95_s": percentile(itl, 95),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "goodput_rps": per_s(len(good)),
        "goodput_tokens_per_s": per_s(sum(int(r.get("output_tokens") or 0) for r in good)),
        "slo_met": len(good) / len(ok) if ok else None,
        # what the responses themselves said (llama.cpp timings, SGLang sglext); None when none did
        "response_draft_tokens": draft_n if with_timings else None,
        "response_accepted_tokens": accepted if with_timings else None,
        "response_acceptance_rate": accepted / draft_n if draft_n else None,
        "response_mean_acceptance_length": (
            (accepted + sum(int(r["verify_calls"]) for r in verify)) / sum(int(r["verify_calls"]) for r in verify)
            if verify
            else None
        ),
    }


def counter_fields(level: LevelResult) -> dict[str, Any]:
    """The server-counter part of a level's entry: null where the server does not report it."""
    c = level.counters
    if c is None or not c.speculates:
        return {
            "drafts": None,
            "draft_tokens": None,
            "accepted_tokens": None,
            "draft_acceptance_rate": None,
            "mean_acceptance_length": None,
            "per_position_acceptance": None,
            "acceptance_source": None,
            "verify_calls": None,
        }
    return {
        "drafts": c.drafts,
        "draft_tokens": c.draft_tokens,
        "accepted_tokens": c.accepted_tokens,
        "draft_acceptance_rate": c.draft_acceptance_rate(),
        "mean_acceptance_length": c.mean_acceptance_length(),
        "per_position_acceptance": c.per_position_acceptance(),
        "acceptance_source": c.source(),
        "verify_calls": c.verify_calls,
    }


def level_entry(level: LevelResult, ttft_slo_s: float = 0.0, tpot_slo_s: float = 0.0) -> dict[str, Any]:
    """One level as the probe JSON and the session summary give it."""
    stats = request_stats([r.row() for r in level.requests], level.wall_s, ttft_slo_s, tpot_slo_s)
    entry = {"endpoint": level.endpoint, "concurrency": level.concurrency, **stats, **counter_fields(level)}
    if entry["acceptance_source"] != "counters" and stats["response_acceptance_rate"] is not None:
        # SGLang: its per-request sglext figures are exact over the level; its gauges cover its last log interval
        verify = sum(int(r.verify_calls or 0) for r in level.requests if r.ok)
        entry.update(
            drafts=verify or None,
            draft_tokens=stats["response_draft_tokens"],
            accepted_tokens=stats["response_accepted_tokens"],
            draft_acceptance_rate=stats["response_acceptance_rate"],
            mean_acceptance_length=stats["response_mean_acceptance_length"],
            acceptance_source="responses",
        )
    entry["stopped"] = level.stopped
    return entry


def compare(spec: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Speculative vs baseline level entries at each concurrency both measured: speedups, predictions, flip."""
    by_c = {int(b["concurrency"]): b for b in base}
    points: list[dict[str, Any]] = []
    for s in sorted(spec, key=lambda e: int(e["concurrency"])):
        b = by_c.get(int(s["concurrency"]))
        if b is None or not s.get("tokens_per_s") or not b.get("tokens_per_s"):
            continue
        points.append(
            {
                "concurrency": int(s["concurrency"]),
                "speedup": s["tokens_per_s"] / b["tokens_per_s"],
                "tokens_per_s": s["tokens_per_s"],
                "baseline_tokens_per_s": b["tokens_per_s"],
                "goodput_rps": s.get("goodput_rps"),
                "baseline_goodput_rps": b.get("goodput_rps"),
                "tpot_p50_s": s.get("tpot_p50_s"),
                "baseline_tpot_p50_s": b.get("tpot_p50_s"),
                "mean_acceptance_length": s.get("mean_acceptance_length"),
                "mean_draft_length": (s["draft_tokens"] / s["drafts"]) if s.get("drafts") else None,
            }
        )
    _predict(points)
    flip = next((p["concurrency"] for p in points if p["speedup"] <= 1.0), None)
    if not points:
        verdict = "no level measured on both endpoints"
    elif flip is None:
        verdict = f"speculation paid at every measured concurrency (up to {points[-1]['concurrency']})"
    elif flip == points[0]["concurrency"]:
        verdict = f"speculation did not pay even at concurrency {flip}"
    else:
        verdict = f"speculation stops paying at concurrency {flip} (measured)"
    return {"points": points, "flip_concurrency": flip, "verdict": verdict}


def _predict(points: list[dict[str, Any]]) -> None:
    """Add `predicted_speedup` (Theorem 3.8, memory-bound, c fitted at the lowest level) to each point."""
    first = points[0] if points else None
    if first is None or not first.get("mean_acceptance_length") or not first.get("mean_draft_length"):
        for p in points:
            p["predicted_speedup"] = None
        return
    gamma = first["mean_draft_length"]
    c = max((first["mean_acceptance_length"] / first["speedup"] - 1.0) / gamma, 0.0)
    for p in points:
        e, g = p.get("mean_acceptance_length"), p.get("mean_draft_length") or gamma
        p["predicted_speedup"] = e / (g * c + 1.0) if e else None
        p["fitted_c"] = c


def sweep_report(result: SweepResult, ttft_slo_s: float = 0.0, tpot_slo_s: float = 0.0) -> dict[str, Any]:
    """The whole sweep: per endpoint its engine, version and levels; the comparison when there is a baseline."""
    endpoints = []
    for run in result.runs:
        endpoints.append(
            {
                "label": run.endpoint.label,
                "url": run.endpoint.url,
                "model": run.model or None,
                "api": run.endpoint.api,
                "engine": run.info.engine if run.info else None,
                "server_version": run.info.version if run.info else None,
                "warnings": list(run.warnings),
                "levels": [level_entry(level, ttft_slo_s, tpot_slo_s) for level in run.levels],
            }
        )
    report: dict[str, Any] = {
        "endpoints": endpoints,
        "stopped": result.stopped,
        "cancelled": result.cancelled,
        "latency_target": {"ttft_slo_s": ttft_slo_s or None, "tpot_slo_s": tpot_slo_s or None},
    }
    spec = next((e for e in endpoints if e["label"] == "speculative"), None)
    base = next((e for e in endpoints if e["label"] == "baseline"), None)
    report["comparison"] = compare(spec["levels"], base["levels"]) if spec and base else None
    return report
