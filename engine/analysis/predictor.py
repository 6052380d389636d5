"""The one predictor: a draft's measurement and a policy (a fixed γ is a policy) → one bounded Prediction.

Where the sessions recorded the draft's pass (its trace along the target's output, engine.measure.agreement),
the prediction replays that pass step by step with the policy's own methods (engine.analysis.policy_replay):
exact tokens per call at temperature 0, expected values from β per position above it. Where no pass was
recorded (a llama.cpp n-gram lookup, an older session), a fixed γ is predicted from the per-position acceptance
and the share of calls that drafted (engine.analysis.prediction.positional). Either way the cost is the same:
c per draft forward (calibrated to the measured speedups, engine.analysis.calibrate), v(k) fitted and capped.
"""

from __future__ import annotations

from typing import Any

from engine.analysis.feasibility import EXTRAPOLATION_MARGIN
from engine.analysis.policy_replay import replay, trace_usable
from engine.analysis.prediction import CostModel, Prediction, positional
from engine.analysis.recommend_types import DraftMeasurement
from engine.analysis.theory import largest_measured_k
from engine.core.policy import SpeculationPolicy
from engine.drafts.kinds import kind_of_method


def traces_of(m: DraftMeasurement) -> list[dict[str, Any]]:
    """The recorded passes a replay can use at the measurement's temperature (agreement runs read as passes at
    temperature 0, for sessions that kept only those)."""
    usable = [t for t in m.traces if trace_usable(t)]
    if m.temperature > 0:
        key = f"{m.temperature:g}"
        return [t for t in usable if key in (t.get("beta") or {})]
    if usable:
        return usable
    return [{"method": m.method, "runs": list(r)} for r in m.agreement_runs if r]


def rates_of(m: DraftMeasurement) -> list[float]:
    """The conditional acceptance per draft position on calls that drafted (α alone where nothing else was kept)."""
    return list(m.per_position_acceptance) or [m.alpha]


def predict(m: DraftMeasurement, policy: SpeculationPolicy, cost: CostModel) -> Prediction:
    """What `policy` does with this draft at its temperature, predicted once, the same way for every caller."""
    traces = traces_of(m)
    if traces:
        pred = replay(traces, policy, cost, m.temperature, m.drafting_loop)
    elif (gamma := policy.fixed_gamma()) is not None:
        pred = positional(
            rates_of(m), m.drafting_fraction, gamma, cost, kind_of_method(m.method).costs_forwards, m.temperature
        )
    else:
        raise ValueError(f"{m.name}: a policy other than a fixed γ needs the draft's recorded pass")
    depth = measured_depth(m)
    pred.extrapolated = depth is not None and pred.most_drafted > depth
    return pred


def measured_depth(m: DraftMeasurement) -> int | None:
    """How many draft tokens per step the measurements cover: the acceptance (per-position rates; a recorded pass
    covers any depth) and v(k) (measured to k: k − 1 drafts). None: nothing limits it."""
    limits = []
    if not traces_of(m) and m.per_position_acceptance:  # α alone is the single-α model: no depth was measured
        limits.append(len(m.per_position_acceptance))
    top_k = largest_measured_k(m.verify_cost)
    if top_k is not None:
        limits.append(top_k - 1)
    return min(limits) if limits else None


def allowed_depth(m: DraftMeasurement) -> int | None:
    """The most draft tokens per step a recommendation may reach: the measured depth plus a small margin."""
    depth = measured_depth(m)
    return None if depth is None else depth + EXTRAPOLATION_MARGIN
