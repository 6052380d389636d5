"""A draft's γ curve: predicted, calibrated and measured speedup and arithmetic per γ, and its crossover."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from engine.analysis.bounds import check_predicted_speedup
from engine.analysis.calibrate import calibration, expected_tokens, measurement_flags, runs_usable
from engine.analysis.recommend_types import DEFAULT_GAMMAS, DraftMeasurement, GammaPoint
from engine.analysis.theory import (
    expected_tokens_per_call,
    largest_measured_k,
    verify_cost_per_call,
    walltime_improvement,
)


def _bounded(speedup: float, gamma: int, flags: list[str]) -> float:
    """The speedup, capped at its physical bound at this γ (the breach is appended to `flags`)."""
    flag = check_predicted_speedup(speedup, gamma)
    if flag is None:
        return speedup
    flags.append(flag.message)
    return flag.bound


def gamma_curve(m: DraftMeasurement, gammas: Iterable[int] = DEFAULT_GAMMAS) -> list[GammaPoint]:
    """Predicted (and measured, where a session ran it) speedup and arithmetic for each γ.

    Every prediction is checked against γ+1 (engine.analysis.bounds); a measured speedup that
    breaks its bound carries `measured_flag`. `verify_extrapolated` marks γ+1 beyond the largest
    measured k.
    """
    cal = calibration(m)
    rejected = measurement_flags(m)
    source = "agreement_runs" if runs_usable(m) else "positional"
    top_k = largest_measured_k(m.verify_cost)
    rows: list[GammaPoint] = []
    for gamma in gammas:
        gamma = int(gamma)
        if gamma < 1:
            raise ValueError(f"gammas must be >= 1, got {gamma}")
        expected = expected_tokens(m, gamma)
        v = verify_cost_per_call(m.verify_cost, gamma + 1, m.drafting_fraction)
        flags: list[str] = []
        predicted = _bounded(expected / (gamma * m.c + v), gamma, flags)
        ops = (gamma * m.c_hat + gamma + 1.0) / expected if expected > 0 else math.inf
        if cal is None:
            estimate = predicted
        else:
            estimate = _bounded(min(cal.scale * expected, gamma + 1.0) / (gamma * cal.c + v), gamma, flags)
        measured = m.measured_speedup.get(gamma)
        flag = rejected.get(gamma)
        rows.append(
            GammaPoint(
                gamma=gamma,
                expected_tokens=expected,
                expected_tokens_one_alpha=expected_tokens_per_call(m.alpha, gamma),
                speedup_predicted=predicted,
                speedup_one_alpha=walltime_improvement(m.alpha, gamma, m.c),
                ops_multiplier=ops,
                measured_speedup=None if measured is None else float(measured),
                verify_cost=v,
                speedup_estimate=estimate,
                expected_tokens_source=source,
                verify_extrapolated=top_k is not None and gamma + 1 > top_k,
                measured_flag=None if flag is None else flag.message,
                flags=flags,
            )
        )
    return rows


def crossover_from_curve(rows: Sequence[GammaPoint]) -> int | None:
    """First γ of the curve where the ops multiplier exceeds the (estimated) speedup, else None."""
    for row in rows:
        if row.ops_multiplier > row.speedup_estimate:
            return row.gamma
    return None
