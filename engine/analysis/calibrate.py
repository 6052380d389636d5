"""The measured speedups a draft may be calibrated to, and its cost c fitted to them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.analysis.bounds import BoundFlag, check_measured_speedup
from engine.analysis.prediction import CostModel, Prediction
from engine.analysis.predictor import predict
from engine.analysis.recommend_types import DraftMeasurement, MeasuredCheck
from engine.analysis.theory import MEMORY_BOUND
from engine.core.policy import FixedGamma
from engine.drafts.kinds import kind_of_method


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


def measurement_flags(m: DraftMeasurement) -> dict[int, BoundFlag]:
    """γ -> why its measured speedup is impossible: above the run's own tokens per call ÷ (v_min + the draft's
    share of a call, c · draft forwards per step), or above γ+1; v_min: the cheapest verify up to γ+1
    (VerifyFit.floor). A stored run's own flag (`run_flags`) is its verdict, judged once when it was summarised."""
    flags: dict[int, BoundFlag] = {}
    for gamma, measured in m.measured_speedup.items():
        gamma = int(gamma)
        if gamma < 1:
            continue
        if gamma in m.run_flags:  # the run's own verdict, decided once (engine.session.summarise.speedup_flag)
            if (message := m.run_flags[gamma]) is not None:
                flags[gamma] = BoundFlag("measured speedup", float(measured), float("nan"), message)
            continue
        at = _at_c(m, gamma, 0.0)
        share = m.c * at.draft_calls_per_step if kind_of_method(m.method).costs_forwards else 0.0
        flag = check_measured_speedup(
            float(measured), gamma, m.measured_tokens_per_call.get(gamma), share, at.verify_floor
        )
        if flag is not None:
            flags[gamma] = flag
    return flags


LOST_EVERYWHERE = "lost at every γ measured"  # measured_loss's reason starts so


def speedups_at(m: DraftMeasurement, batch: int) -> dict[int, tuple[float, bool]]:
    """γ -> (measured speedup, too noisy to tell) at this serving batch: level 1 from the session's runs (those
    that break a bound left out), a larger batch from a batching engine's surface; {} where none was measured."""
    if batch != 1:
        return dict(m.level_speedups.get(int(batch), {}))
    rejected = measurement_flags(m)
    return {
        int(g): (float(s), int(g) in m.noisy_speedup)
        for g, s in m.measured_speedup.items()
        if int(g) >= 1 and int(g) not in rejected
    }


def measured_loss(m: DraftMeasurement, batch: int) -> str:
    """Why nothing of this draft may be recommended at this batch: every γ measured there lost (≤ 1×) and at least
    one clearly (not too noisy to tell); '' otherwise. A prediction never overrules such a measurement, neither at
    an unmeasured γ between or beyond the measured ones nor for a policy of the same draft."""
    points = speedups_at(m, batch)
    if not points or any(s > 1.0 for s, _ in points.values()) or all(noisy for _, noisy in points.values()):
        return ""
    listed = ", ".join(
        f"γ={g} {s:.2f}×{' (too noisy to tell)' if noisy else ''}" for g, (s, noisy) in sorted(points.items())
    )
    return f"{LOST_EVERYWHERE} at batch {batch} ({listed})"


def measured_check(m: DraftMeasurement, gamma: int, batch: int, predicted: float) -> MeasuredCheck | None:
    """The run measured at this γ and serving batch beside the prediction for it (None where none was measured, or
    its speedup breaks its bound: a measurement error is no measurement): its noise band is the run's lowest and
    highest per-prompt speedup at batch 1 widened to take in the speedup itself, the speedup alone elsewhere."""
    point = speedups_at(m, batch).get(int(gamma))
    if point is None:
        return None
    speedup, noisy = point
    low, high = m.measured_band.get(int(gamma), (speedup, speedup)) if batch == 1 else (speedup, speedup)
    return MeasuredCheck(int(gamma), speedup, min(low, speedup), max(high, speedup), float(predicted), noisy)


def _at_c(m: DraftMeasurement, gamma: int, c: float) -> Prediction:
    return predict(m, FixedGamma(gamma), cost_of(m, c=c))


@dataclass(frozen=True)
class Calibration:
    """The draft cost the one model uses: c fitted to the measured speedups, or the profiled c (with why)."""

    c: float
    source: str  # "fitted" (to the measured speedups) | "profiled" (the fit was impossible: see `flag`)
    flag: str | None = None  # why the measurements were not calibrated to


def calibration(m: DraftMeasurement) -> Calibration | None:
    """c fitted to the measured speedups, or None when nothing (possible) was measured, there is no draft
    forward to charge (n-gram lookup), or c was measured inside the engine's loop with its step overhead (llama.cpp:
    what the fit would absorb is measured, and a fit to one noisy γ would only bend the other γs).

    Measured speedups include overheads the model leaves out (scheduling, KV bookkeeping, a draft slower in the
    loop than alone). Charging them to c keeps the model's shape while passing through the measurements: per
    token, 1/S = c·F + V (F draft forwards and V verify cost per token, from the prediction at c = 0), so c is the
    least-squares fit of F·c ≈ 1/S − V over the measured γ. A fit below 0 means the measurements beat the model
    even with a free draft: a measurement problem (load, noise, prompts unlike the recorded ones), flagged and
    not calibrated to — the expected tokens are never scaled. Measurements that break a bound never count.
    """
    if not kind_of_method(m.method).costs_forwards or m.c_in_loop:
        return None
    rejected = measurement_flags(m)
    num = den = 0.0
    seen = []
    for gamma, measured in sorted(m.measured_speedup.items()):
        gamma = int(gamma)
        if gamma < 1 or measured <= 0 or gamma in rejected or gamma in m.noisy_speedup:
            continue
        free = _at_c(m, gamma, 0.0)
        if free.tokens <= 0:
            continue
        forwards = free.draft_calls / free.tokens
        verify = 1.0 / free.predicted_speedup if free.predicted_speedup > 0 else 0.0
        num += forwards * (1.0 / float(measured) - verify)
        den += forwards * forwards
        seen.append(f"{float(measured):.2f}× at γ={gamma}")
    if not seen or den <= 0:
        return None
    c_fit = num / den
    if c_fit >= 0:
        return Calibration(c=c_fit, source="fitted")
    flag = (
        f"the measured {', '.join(seen)} beat the model even with a free draft (it would need c = {c_fit:.3f} < 0): "
        f"a measurement problem (load changed, or the prompts differ from the recorded pass); not calibrated to, "
        f"the profiled c {m.c:.3f} is used"
    )
    return Calibration(c=m.c, source="profiled", flag=flag)


def effective_c(m: DraftMeasurement) -> float | None:
    """The draft cost c the calibration uses (None when no speedup was measured)."""
    cal = calibration(m)
    return None if cal is None else cal.c


def cost_of(m: DraftMeasurement, c: float | None = None, regime: str = MEMORY_BOUND) -> CostModel:
    """The cost model of this draft: c (default: the calibrated one), its v(k) and ĉ."""
    if c is None:
        cal = calibration(m)
        c = m.c if cal is None else cal.c
    return CostModel(c=c, verify_cost=m.verify_cost or None, c_hat=m.c_hat, regime=regime, overhead=m.step_overhead)
