"""A regime record as the worker stores it, read back defensively: raw batch sweep, knee, v(k) points, roofline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from engine.analysis.regime_sources import MEASUREMENT_ERROR, Roofline, roofline_flags
from engine.analysis.theory import measured_verify_points


def stored_sweep(regime: Mapping[str, Any] | None) -> tuple[list[int], list[float]] | None:
    """The raw batch sweep of a regime record (batch sizes, step times in s, sorted) when usable, else None."""
    if not isinstance(regime, Mapping):
        return None
    sweep = regime.get("batch_sweep")
    if not isinstance(sweep, Mapping):
        return None
    try:
        bs = [int(b) for b in sweep.get("batch_sizes") or []]
        ts = [float(t) for t in sweep.get("step_times_s") or []]
    except (TypeError, ValueError):
        return None
    if not bs or len(bs) != len(ts) or len(set(bs)) != len(bs) or any(b < 1 for b in bs):
        return None
    if any(not (t > 0) for t in ts):
        return None
    pairs = sorted(zip(bs, ts, strict=True))
    return [b for b, _ in pairs], [t for _, t in pairs]


def stored_knee(regime: Mapping[str, Any] | None) -> int | None:
    """The knee a regime record stored (used only when its raw timings are not there to re-judge)."""
    if not isinstance(regime, Mapping):
        return None
    classification = regime.get("batch_classification")
    knee = classification.get("knee_batch") if isinstance(classification, Mapping) else None
    try:
        return None if knee is None else int(knee)
    except (TypeError, ValueError):
        return None


def stored_verify(regime: Mapping[str, Any] | None) -> dict[int, float]:
    """v(k) points of a regime record: its raw table, else the one point its verify classification kept."""
    if not isinstance(regime, Mapping):
        return {}
    try:
        points = measured_verify_points(regime.get("verify_cost") or {})
        if points:
            return points
        cls = regime.get("verify_classification")
        if isinstance(cls, Mapping) and cls.get("k") is not None and cls.get("v_k") is not None:
            return measured_verify_points({int(cls["k"]): float(cls["v_k"])})
    except (TypeError, ValueError, AttributeError):
        return {}
    return {}


def stored_roofline(regime: Mapping[str, Any] | None) -> Roofline | None:
    """The roofline of a regime record, re-checked against its bounds (old records were never checked)."""
    raw = regime.get("roofline") if isinstance(regime, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    names = {f.name for f in fields(Roofline)}
    try:
        roof = Roofline(**{k: v for k, v in raw.items() if k in names})
        bw, fl = float(roof.bandwidth_fraction), float(roof.flops_fraction)
    except (TypeError, ValueError):
        return None
    flags = roofline_flags(bw, fl)
    if flags and not roof.flags:
        roof.flags = flags
        roof.label = MEASUREMENT_ERROR
        roof.evidence = flags + [f"(measurement error, not evidence) {e}" for e in roof.evidence or []]
    return roof
