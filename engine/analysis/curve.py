"""A draft's γ curve: the one model's prediction at each fixed γ, the measurement beside it, and its crossover."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.analysis.calibrate import cost_of, measurement_flags
from engine.analysis.prediction import CostModel, bound_flags
from engine.analysis.predictor import predict
from engine.analysis.recommend_types import DEFAULT_GAMMAS, DraftMeasurement, GammaPoint
from engine.analysis.theory import expected_tokens_per_call, largest_measured_k, walltime_improvement
from engine.core.policy import FixedGamma


def gamma_curve(
    m: DraftMeasurement, gammas: Iterable[int] = DEFAULT_GAMMAS, cost: CostModel | None = None
) -> list[GammaPoint]:
    """The predicted (and measured, where a session ran it) speedup and arithmetic at each γ.

    `cost` defaults to the draft's own (c calibrated to its measured speedups, engine.analysis.calibrate.cost_of).
    A measured speedup that breaks its bound carries `measured_flag`; `verify_extrapolated` marks γ+1 beyond the
    largest measured k.
    """
    cost = cost or cost_of(m)
    rejected = measurement_flags(m)
    top_k = largest_measured_k(m.verify_cost)
    alpha = min(max(m.alpha, 0.0), 1.0)
    rows: list[GammaPoint] = []
    for gamma in gammas:
        gamma = int(gamma)
        if gamma < 1:
            raise ValueError(f"gammas must be >= 1, got {gamma}")
        pred = predict(m, FixedGamma(gamma), cost)
        measured = m.measured_speedup.get(gamma)
        flag = rejected.get(gamma)
        rows.append(
            GammaPoint(
                gamma=gamma,
                prediction=pred,
                expected_tokens_one_alpha=expected_tokens_per_call(alpha, gamma),
                speedup_one_alpha=walltime_improvement(alpha, gamma, m.c),
                measured_speedup=None if measured is None else float(measured),
                verify_cost=cost.v(gamma + 1),
                verify_extrapolated=top_k is not None and gamma + 1 > top_k,
                measured_flag=None if flag is None else flag.message,
                measured_noisy=m.noisy_speedup.get(gamma) if measured is not None and flag is None else None,
                flags=bound_flags(pred),
            )
        )
    return rows


def crossover_from_curve(rows: Sequence[GammaPoint]) -> int | None:
    """First γ of the curve where the ops multiplier exceeds the predicted speedup, else None."""
    for row in rows:
        if row.ops_multiplier > row.speedup_predicted:
            return row.gamma
    return None
