"""Physical bounds every figure must respect before it is shown, stored as evidence or calibrated to.

Why: a loaded machine produces impossible numbers — a measured 3.07× from a run that delivered
1.35 tokens per target call, a step at 515% of "peak" FLOP/s — and a recommender that believes
them scales its model to match and predicts more than γ+1 tokens per call. Each function checks
one bound and returns None when the figure is possible, or a BoundFlag saying which bound broke
and the likely cause. A flagged figure is a measurement error: shown as such, never used.

The bounds (Leviathan et al. 2023, Theorem 3.8 and its reading):

* one target call yields at most γ+1 tokens, so tokens per call ≤ γ+1;
* a speculative step costs at least its verify plus the drafting, so speedup ≤ tokens per call ÷
  (v_min + drafting cost share), v_min the cheapest verify it could take in one-token forwards: 1, unless the
  engine measured a k-token forward cheaper than a one-token one (theory.VerifyFit.floor) — for a measured
  speedup, in practice ≤ the run's own mean acceptance length (tokens per target call); for a prediction ≤ γ+1;
* no kernel runs faster than the measured peak: achieved ≤ peak (roofline);
* verifying k tokens in one forward costs at most what k one-token forwards cost: v(k) ≤ k, and no less than
  theory.VERIFY_FLOOR of one.

Measured figures get MEASURED_SLACK of relative slack (timing noise); predictions get none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.analysis.theory import VERIFY_FLOOR, measured_verify_points

MEASURED_SLACK = 0.05  # measured figures may exceed a bound by 5% before they are called impossible
_EXACT = 1e-9

VERIFY_SLACK = 0.10  # v(k) may exceed k by 10% (a batched kernel a little slower than k single ones)
LOAD_CAUSE = "load changed between runs (the baseline and the speculative run were timed under different load)"
PEAK_CAUSE = (
    "load changed between the peak micro-benchmark and the step timing (the peak was measured on a busy machine)"
)


@dataclass(frozen=True)
class BoundFlag:
    """A figure that breaks a physical bound: a measurement (or model) error, not a result."""

    quantity: str
    value: float
    bound: float
    message: str

    def __str__(self) -> str:
        return self.message


def _over(value: float, bound: float, slack: float) -> bool:
    return not math.isfinite(value) or value > bound * (1.0 + slack) + _EXACT


def check_tokens_per_call(tokens_per_call: float, gamma: int, measured: bool = True) -> BoundFlag | None:
    """Tokens per target call ≤ γ+1 (and ≥ 1: every call yields at least the target's own token)."""
    bound = gamma + 1.0
    slack = MEASURED_SLACK if measured else 0.0
    if _over(tokens_per_call, bound, slack) or tokens_per_call < 1.0 - slack - _EXACT:
        what = "measurement error" if measured else "model error"
        return BoundFlag(
            "tokens per call",
            float(tokens_per_call),
            bound,
            f"{what}: {tokens_per_call:.2f} tokens per target call at γ={gamma} is impossible (between 1 and "
            f"γ+1 = {gamma + 1}); not used",
        )
    return None


def check_measured_speedup(
    speedup: float,
    gamma: int,
    tokens_per_call: float | None = None,
    draft_share: float = 0.0,
    verify_floor: float = 1.0,
    whole_run: bool = False,
) -> BoundFlag | None:
    """Measured speedup ≤ tokens per call ÷ (v_min + drafting share), v_min = `verify_floor` (the cheapest verify
    measured, held between VERIFY_FLOOR and 1: theory.VerifyFit.floor); γ+1 tokens per call when the run's own are
    unknown. `whole_run`: the speedup is the whole run's (said in the message), not a median of per-prompt ratios.

    `tokens_per_call` is the run's own mean acceptance length; one that breaks its own bound is
    ignored (γ+1 is used instead). γ 0 is a deployment drafting with a γ of its own, unknown here
    (engine.session.runner.RunKey): only the tokens per call it reported bound it, and nothing where it reported none.
    """
    if gamma <= 0:
        if tokens_per_call is None or not tokens_per_call >= 1.0:
            return None
        usable = True
    else:
        usable = tokens_per_call is not None and check_tokens_per_call(tokens_per_call, gamma) is None
    per_call = float(tokens_per_call) if usable else gamma + 1.0  # type: ignore[arg-type]
    bound = per_call / (min(max(verify_floor, VERIFY_FLOOR), 1.0) + max(draft_share, 0.0))
    if not _over(speedup, bound, MEASURED_SLACK):
        return None
    basis = (
        f"that run delivered {per_call:.2f} tokens per target call"
        if usable
        else f"at γ={gamma} at most γ+1 = {gamma + 1} tokens come per target call"
    )
    return BoundFlag(
        "measured speedup",
        float(speedup),
        bound,
        f"measurement error: the measured {speedup:.2f}×{' over the whole run' if whole_run else ''}"
        f"{f' at γ={gamma}' if gamma > 0 else ''} is impossible — {basis}, so no speedup above "
        f"{bound:.2f}× can happen; likely cause: {LOAD_CAUSE}. Shown, never calibrated to.",
    )


def check_predicted_speedup(speedup: float, gamma: int) -> BoundFlag | None:
    """Predicted speedup ≤ γ+1: at most γ+1 tokens per target call, and a call costs at least one forward."""
    bound = gamma + 1.0
    if not _over(speedup, bound, 0.0):
        return None
    return BoundFlag(
        "predicted speedup",
        float(speedup),
        bound,
        f"model error: a predicted {speedup:.2f}× at γ={gamma} exceeds γ+1 = {gamma + 1}; capped at {bound:.0f}×",
    )


def check_fraction_of_peak(achieved: float, peak: float, what: str) -> BoundFlag | None:
    """Achieved ≤ measured peak (`what`: "bandwidth" or "FLOP/s"); above it the peak or the timing is wrong."""
    if peak > 0 and not _over(achieved, peak, MEASURED_SLACK):
        return None
    fraction = achieved / peak if peak > 0 else math.inf
    return BoundFlag(
        f"achieved {what}",
        float(achieved),
        float(peak),
        f"measurement error: achieved {what} is {fraction:.0%} of the measured peak — impossible; likely cause: "
        f"{PEAK_CAUSE}. Not used as evidence.",
    )


def usable_verify_points(verify_cost: Mapping[int, float] | None) -> tuple[dict[int, float], list[BoundFlag]]:
    """The measured v(k) points (k ≥ 2) a prediction may use, and the flags of those it may not: a v(k) outside
    its bound is a measurement error, never evidence (the fit would clamp it to k and predict from that)."""
    usable: dict[int, float] = {}
    flags: list[BoundFlag] = []
    for k, v in sorted(measured_verify_points(verify_cost).items()):
        flag = check_verify_cost(v, k)
        if flag is None:
            usable[k] = v
        else:
            flags.append(flag)
    return usable, flags


def check_verify_cost(v_k: float, k: int) -> BoundFlag | None:
    """v(k) ≤ k: a k-token forward does the work of k one-token forwards at most (and costs no less than
    VERIFY_FLOOR of one: a one-token kernel may be the slower one)."""
    if _over(v_k, float(k), VERIFY_SLACK) or v_k < VERIFY_FLOOR * (1.0 - MEASURED_SLACK):
        return BoundFlag(
            "verify cost",
            float(v_k),
            float(k),
            f"measurement error: v({k}) = {v_k:.2f} is outside {VERIFY_FLOOR:g}…{k} (a {k}-token forward costing "
            f"more than {k} one-token forwards, or far less than one); the machine's load changed while it was "
            f"timed, or the engine's batched kernel is slower than its one-token one; not evidence",
        )
    return None
