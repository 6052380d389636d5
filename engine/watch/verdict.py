"""Verdicts on a window: does the deployed configuration still pay at the observed acceptance and load?

The predicted speedup is the one predictor's (engine.analysis.predictor): the stored session's draft measurement
with its acceptance replaced by the window's (per-position rates where the engine counts them, else the single α
read off the mean acceptance length), its c and v(k) kept, judged in the regime at the observed batch. Memory-bound,
the gain is the predicted speedup; compute-bound, the extra arithmetic displaces real work, so the gain is
1 ÷ the operations multiplier (engine.analysis.theory.cost_per_token_multiplier). Pure functions of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from engine.analysis.calibrate import cost_of
from engine.analysis.predictor import predict
from engine.analysis.recommend_types import DraftMeasurement
from engine.analysis.theory import MEMORY_BOUND, REGIMES, alpha_from_mean_accepted
from engine.core.policy import FixedGamma
from engine.watch.window import OK, Window

PAYING, COSTING, COLLAPSED, DRIFTED = "paying", "costing you", "acceptance collapsed", "traffic drifted"
BELOW = "below 1×"  # predicted below 1× for fewer than the windows that make it "costing you"
VERDICTS = (PAYING, COSTING, COLLAPSED, DRIFTED, BELOW)
COLLAPSE_MARGIN = 0.05  # mean acceptance length within this of 1.00 while drafting: the draft accepts nothing
COSTING_WINDOWS = 3  # consecutive windows predicted below 1× before "costing you"
BAND_MARGIN = 0.05  # α this far outside the session's measured α is drift, not noise


@dataclass(frozen=True)
class Deployment:
    """The deployed configuration and what the stored session measured of it."""

    measurement: DraftMeasurement
    gamma: int
    alpha_band: tuple[float, float]  # the lowest and highest α the session measured for this draft
    regime_at: Callable[[int, int], str] = lambda batch, gamma: MEMORY_BOUND  # the regime at a batch and a γ
    costing_windows: int = COSTING_WINDOWS
    session_id: int | None = None  # the stored session that measured it


@dataclass(frozen=True)
class Verdict:
    """What one window says: a verdict (or the window's state), the predicted gain, and what to do."""

    verdict: str
    predicted_speedup: float | None = None
    alpha: float | None = None
    batch: int | None = None
    regime: str | None = None
    action: str = ""
    why: str = ""


def observed_alpha(window: Window, gamma: int) -> float | None:
    """The single α of the window, read off its mean acceptance length at the deployed γ (as a session reads it)."""
    mal = window.mean_acceptance_length
    if mal is None or gamma < 1:
        return None
    return alpha_from_mean_accepted(min(max(mal, 1.0), gamma + 1.0), gamma)


def observed_batch(window: Window) -> int:
    """The serving batch of the window: the requests running on average, at least 1."""
    running = window.requests_running
    return max(int(round(running)), 1) if running is not None and math.isfinite(running) else 1


def predicted_speedup(
    m: DraftMeasurement, gamma: int, rates: Sequence[float], drafting: float | None, regime: str
) -> float:
    """The gain of γ over no speculation with this draft's c and v(k) at conditional acceptance `rates`: the
    predicted speedup memory-bound, 1 ÷ the operations multiplier compute-bound."""
    if regime not in REGIMES:
        regime = MEMORY_BOUND
    live = replace(
        m,
        per_position_acceptance=[float(r) for r in rates],
        alpha=float(rates[0]) if rates else 0.0,
        traces=[],
        agreement_runs=[],
        drafting_fraction=m.drafting_fraction if drafting is None else drafting,
    )
    c = cost_of(m).c  # calibrated to the session's own acceptance and speedups, once
    pred = predict(live, FixedGamma(gamma), cost_of(live, c=c, regime=regime))
    return 1.0 / pred.cost_in(regime)


def best_gamma(dep: Deployment, rates: Sequence[float], drafting: float | None, batch: int) -> tuple[int, float]:
    """The γ (1 … the deployed γ) with the highest predicted gain at `batch`, and that gain; (0, 1.0) where no γ is
    predicted above 1×, each γ in the regime its verify width meets at `batch`. `rates`: the window's conditional
    acceptance per position (or its single α)."""
    gains = {
        g: predicted_speedup(dep.measurement, g, rates, drafting, dep.regime_at(batch, g))
        for g in range(1, dep.gamma + 1)
    }
    gamma = max(gains, key=lambda g: (gains[g], -g))
    return (gamma, gains[gamma]) if gains[gamma] > 1.0 else (0, 1.0)


def collapsed(window: Window) -> bool:
    """Drafts were proposed and the mean acceptance length is within the margin of 1.00."""
    mal = window.mean_acceptance_length
    return bool(window.num_drafts) and mal is not None and mal <= 1.0 + COLLAPSE_MARGIN


def judge(window: Window, dep: Deployment, earlier: Sequence[float | None] = ()) -> Verdict:
    """The verdict on `window`; `earlier`: the predicted speedups of the windows before it, oldest first."""
    if window.state != OK:
        return Verdict(window.state, why=window.message)
    batch = observed_batch(window)
    regime = dep.regime_at(batch, dep.gamma)
    said = regime if regime in REGIMES else f"regime {regime}: read as {MEMORY_BOUND}"
    alpha = observed_alpha(window, dep.gamma)
    if collapsed(window):
        return Verdict(
            COLLAPSED,
            None,
            alpha,
            batch,
            regime,
            action="turn speculation off",
            why=f"mean acceptance length {window.mean_acceptance_length:.2f} with "
            f"{window.num_drafts:.0f} drafts proposed: the draft accepts nothing",
        )
    rates = window.per_position_acceptance or ([alpha] if alpha is not None else [])
    gain = predicted_speedup(dep.measurement, dep.gamma, rates, window.drafting_fraction, regime)
    run = [*list(earlier)[-(dep.costing_windows - 1) :], gain] if dep.costing_windows > 1 else [gain]
    if len(run) >= dep.costing_windows and all(g is not None and g < 1.0 for g in run):
        return Verdict(
            COSTING,
            gain,
            alpha,
            batch,
            regime,
            action=_instead(dep, rates, window, batch),
            why=f"predicted {gain:.2f}× at batch {batch} ({said}) for {dep.costing_windows} windows in a row",
        )
    lo, hi = dep.alpha_band
    if alpha is not None and not lo - BAND_MARGIN <= alpha <= hi + BAND_MARGIN:
        return Verdict(
            DRIFTED,
            gain,
            alpha,
            batch,
            regime,
            action="measure a new session on today's traffic",
            why=f"α {alpha:.2f} is outside the session's measured {lo:.2f}–{hi:.2f}",
        )
    if gain < 1.0:
        below = next((i for i, g in enumerate(reversed(run)) if g is None or g >= 1.0), len(run))
        return Verdict(
            BELOW,
            gain,
            alpha,
            batch,
            regime,
            why=f"predicted {gain:.2f}× at batch {batch} ({said}): {below} of {dep.costing_windows} windows below 1×",
        )
    return Verdict(PAYING, gain, alpha, batch, regime, why=f"predicted {gain:.2f}× at batch {batch} ({said})")


def _instead(dep: Deployment, rates: Sequence[float], window: Window, batch: int) -> str:
    """What to do where the deployed γ costs: a smaller γ that the predictor still puts above 1× here, or off."""
    gamma, gain = best_gamma(dep, rates, window.drafting_fraction, batch)
    if gamma == 0:
        return f"turn speculation off at batch {batch}"
    return f"draft γ={gamma} at batch {batch} instead (predicted {gain:.2f}×)"
