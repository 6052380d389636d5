"""Expected tokens per call for a draft, and the calibration of its cost c to the measured speedups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.analysis.bounds import BoundFlag, check_measured_speedup
from engine.analysis.recommend_types import DraftMeasurement
from engine.analysis.theory import expected_tokens_per_call_positional, verify_cost_per_call
from engine.core.counters import per_call_rates


def accepted_curve_from_runs(runs_per_prompt: Sequence[Sequence[int]], gamma: int) -> float:
    """Mean tokens per target call if each prompt were decoded greedily at this γ.

    Greedy speculation is deterministic given the target's output, so the runs replay it exactly:
    at position t the draft proposes γ tokens, min(run[t], γ) are accepted, the target adds one
    more, and decoding resumes at t + accepted + 1 (the last call is capped at the remaining
    length). This captures the real correlation between positions that a single α cannot.
    Returns 0.0 when there are no tokens at all.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    tokens = calls = 0
    for run in runs_per_prompt:
        length, t = len(run), 0
        while t < length:
            accepted = min(max(int(run[t]), 0), gamma)
            t += min(accepted + 1, length - t)
            calls += 1
        tokens += length
    return tokens / calls if calls else 0.0


def _acceptance(m: DraftMeasurement) -> list[float]:
    """Acceptance per draft position, per target call: a call without a draft accepts nothing at position 1."""
    return per_call_rates(list(m.per_position_acceptance) or [m.alpha], m.drafting_fraction)


def runs_usable(m: DraftMeasurement) -> bool:
    """Are the agreement runs usable? They are against the target's greedy output: under sampling they overstate E."""
    return m.temperature <= 0.0 and any(len(r) for r in m.agreement_runs)


def expected_tokens(m: DraftMeasurement, gamma: int) -> float:
    """Tokens per target call at this γ: replayed from the agreement runs when usable, else the positional model."""
    if runs_usable(m):
        return accepted_curve_from_runs(m.agreement_runs, gamma)
    return expected_tokens_per_call_positional(_acceptance(m), gamma)


def measurement_flags(m: DraftMeasurement) -> dict[int, BoundFlag]:
    """γ -> why its measured speedup is impossible (above the run's tokens per call, or above γ+1)."""
    flags: dict[int, BoundFlag] = {}
    for gamma, measured in m.measured_speedup.items():
        gamma = int(gamma)
        if gamma < 1:
            continue
        flag = check_measured_speedup(float(measured), gamma, m.measured_tokens_per_call.get(gamma))
        if flag is not None:
            flags[gamma] = flag
    return flags


@dataclass(frozen=True)
class Calibration:
    """How predictions are bent to pass through measured speedups: S_est = min(scale·E, γ+1)/(γ·c + v(γ+1))."""

    c: float  # effective draft cost
    scale: float  # multiplier on expected tokens (1 unless the measurements beat the model even at c = 0)
    source: str  # "overhead" (c fitted) | "acceptance" (E scaled, profiled c kept)


def calibration(m: DraftMeasurement) -> Calibration | None:
    """Fit the model to the measured speedups, or None when nothing (possible) was measured.

    Measured speedups include overheads the formula leaves out (scheduling, KV bookkeeping, a draft
    slower in practice than its profile). Charging them to c keeps the curve's shape while passing
    through the measurements: S = E/(γc + v) ⇒ γc = E/S − v, least squares over measured γ. When
    the fit would need c < 0 the measurements beat the model even with a free draft, so the
    expected tokens are underestimated instead (e.g. runs from other prompts): keep the profiled c
    and scale E by the mean ratio measured/predicted — never past γ+1 tokens per call.
    Measurements that break a physical bound (measurement_flags) are never calibrated to.
    """
    rejected = measurement_flags(m)
    num = den = 0.0
    points: list[tuple[int, float, float, float]] = []
    for gamma, measured in m.measured_speedup.items():
        gamma = int(gamma)
        if gamma < 1 or measured <= 0 or gamma in rejected:
            continue
        expected = expected_tokens(m, gamma)
        if expected <= 0:
            continue
        v = verify_cost_per_call(m.verify_cost, gamma + 1, m.drafting_fraction)
        points.append((gamma, float(measured), expected, v))
        num += gamma * (expected / measured - v)
        den += gamma * gamma
    if not points:
        return None
    c_fit = num / den
    if c_fit >= 0:
        return Calibration(c=c_fit, scale=1.0, source="overhead")
    ratios = [measured * (gamma * m.c + v) / expected for gamma, measured, expected, v in points]
    return Calibration(c=m.c, scale=sum(ratios) / len(ratios), source="acceptance")


def effective_c(m: DraftMeasurement) -> float | None:
    """The draft cost c the calibration uses (None when no speedup was measured)."""
    cal = calibration(m)
    return None if cal is None else cal.c
