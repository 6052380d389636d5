"""Choosing γ on a curve with the one set of rules (engine.analysis.feasibility): the regime per width, the judge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from engine.analysis.calibrate import measured_loss
from engine.analysis.feasibility import Judge, RegimeOf, check_objective
from engine.analysis.predictor import allowed_depth
from engine.analysis.recommend_types import UNKNOWN, DraftMeasurement, GammaPoint
from engine.analysis.regime import regime_at_width
from engine.analysis.theory import MEMORY_BOUND, REGIMES, cost_per_token_multiplier

__all__ = ["Judge", "RegimeOf", "best_row", "check_args", "cost_multiplier", "judge_for", "regime_of"]


def check_args(objective: str, regime: str, budget: float | None) -> None:
    """Raise ValueError for an unknown objective or regime, or a budget objective without a budget."""
    check_objective(objective, budget)
    if regime not in (*REGIMES, UNKNOWN):
        raise ValueError(f"regime must be one of {(*REGIMES, UNKNOWN)}, got {regime!r}")


def regime_of(regime: str, batch_size: int, knee_batch: int | None) -> RegimeOf:
    """Most drafted per step -> regime at this batch: from the knee at width batch·(drafted+1) when there is one,
    else `regime` (unknown: memory-bound, said so in the notes)."""
    fixed = MEMORY_BOUND if regime == UNKNOWN else regime
    if knee_batch is None:
        return lambda drafted: fixed
    return lambda drafted: regime_at_width(batch_size * (drafted + 1), knee_batch)


def judge_for(
    m: DraftMeasurement | None,
    objective: str,
    budget: float | None,
    regime: str,
    batch_size: int = 1,
    knee_batch: int | None = None,
) -> Judge:
    """The rules one recommendation applies to this draft: its objective, budget, regime per width, the depth
    its measurements allow and what was measured at this batch."""
    judge = Judge(objective, budget, regime_of(regime, batch_size, knee_batch))
    return judge if m is None else replace(judge, depth=allowed_depth(m), lost=measured_loss(m, batch_size))


def cost_multiplier(row: GammaPoint, regime: str) -> float:
    """What this row multiplies cost per token by in this regime."""
    return cost_per_token_multiplier(row.speedup_predicted, row.ops_multiplier, regime)


def best_row(rows: Sequence[GammaPoint], judge: Judge) -> tuple[GammaPoint | None, bool]:
    """The best row that may be recommended, and True; if none may, the best row regardless, and False."""
    best = judge.best(rows)
    if best is not None:
        return best, True  # type: ignore[return-value]
    within = [r for r in rows if judge.depth is None or r.most_drafted <= judge.depth]
    return judge.pick(within or list(rows)), False  # type: ignore[return-value]
