"""Choosing γ on a curve: the regime per γ, what pays under each objective, and the best row."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.analysis.curve import crossover_from_curve
from engine.analysis.recommend_types import GAMMA_TOLERANCE, OBJECTIVES, TIE, UNKNOWN, GammaPoint
from engine.analysis.regime import regime_at_width
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, REGIMES, cost_per_token_multiplier

RegimeOf = Callable[[int], str]  # γ -> the regime a verify step at that γ runs in


def check_args(objective: str, regime: str, budget: float | None) -> None:
    """Raise ValueError for an unknown objective or regime, or a budget objective without a budget."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if regime not in (*REGIMES, UNKNOWN):
        raise ValueError(f"regime must be one of {(*REGIMES, UNKNOWN)}, got {regime!r}")
    if objective == "latency_within_budget" and budget is None:
        raise ValueError("objective 'latency_within_budget' needs a budget (e.g. 0.20 for +20% cost per token)")


def regime_of(regime: str, batch_size: int, knee_batch: int | None) -> RegimeOf:
    """γ -> regime at this batch: from the knee at width batch·(γ+1) when there is one, else `regime`."""
    fixed = MEMORY_BOUND if regime == UNKNOWN else regime
    if knee_batch is None:
        return lambda gamma: fixed
    return lambda gamma: regime_at_width(batch_size * (gamma + 1), knee_batch)


def cost_multiplier(row: GammaPoint, regime: str) -> float:
    """What this row multiplies cost per token by in this regime."""
    return cost_per_token_multiplier(row.speedup_estimate, row.ops_multiplier, regime)


def _feasible(row: GammaPoint, objective: str, regime: str, budget: float | None, cross: int | None) -> bool:
    """Does this (draft, γ) pay under the objective, in the regime its verify step runs in?

    Compute-bound, γ must stay below the crossover (past it the arithmetic grows faster than the
    speed) whatever the objective; memory-bound, the crossover does not matter.
    """
    if regime == COMPUTE_BOUND and cross is not None and row.gamma >= cross:
        return False
    if objective == "cost":
        return cost_multiplier(row, regime) < 1.0 - TIE
    if row.speedup_estimate <= 1.0 + TIE:
        return False
    if objective == "latency_within_budget":
        assert budget is not None
        return cost_multiplier(row, regime) - 1.0 <= budget + TIE
    return True


def objective_key(row: GammaPoint, objective: str, regime: str) -> tuple[float, float]:
    """Larger is better: speed first for latency objectives, cheapness first for cost."""
    if objective == "cost":
        return (-cost_multiplier(row, regime), row.speedup_estimate)
    return (row.speedup_estimate, -row.ops_multiplier)


def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a strictly better than b (ties keep the earlier, i.e. smaller, γ)."""
    if abs(a[0] - b[0]) > TIE:
        return a[0] > b[0]
    return a[1] > b[1] + TIE


def best_row(
    rows: Sequence[GammaPoint], objective: str, regime_at: RegimeOf, budget: float | None
) -> tuple[GammaPoint | None, bool]:
    """Best row among those that pay; if none pays, the best row regardless (flagged False).

    Each row is judged in its own regime (regime_at(γ)). Among rows within GAMMA_TOLERANCE
    (relative) of the best on the objective's metric, the smallest γ wins: differences that small
    are below run-to-run noise, while a smaller γ wastes less arithmetic on rejected guesses (with
    c ≈ 0 and free verification the speedup creeps up forever and a strict argmax would always say
    γ = max).
    """
    cross = crossover_from_curve(rows)

    def key(r: GammaPoint) -> tuple[float, float]:
        """The objective's key for this row, in the regime its verify step runs in."""
        return objective_key(r, objective, regime_at(r.gamma))

    for feasible_only in (True, False):
        pool = [r for r in rows if not feasible_only or _feasible(r, objective, regime_at(r.gamma), budget, cross)]
        if not pool:
            continue
        best = pool[0]
        for row in pool[1:]:
            if better(key(row), key(best)):
                best = row
        top = key(best)[0]
        margin = GAMMA_TOLERANCE * abs(top)
        near = [r for r in pool if key(r)[0] >= top - margin]
        return min(near, key=lambda r: r.gamma), feasible_only
    return None, False
