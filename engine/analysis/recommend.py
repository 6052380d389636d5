"""Which draft, which γ, or none at all: the recommender, on plain measured numbers (no database).

Why it exists: the chapter's lesson is that the best *balance* of α and c wins, not the best α,
and that whether the extra arithmetic is free depends on the regime. This module turns measured
sessions (α per position, c, v(k), greedy agreement runs, measured speedups) into one decision
and one sentence explaining it.

Conventions:

* speedup — latency multiple against the target alone (>1 is faster);
* ops multiplier — Theorem 3.11's arithmetic bill (γĉ + γ + 1)/E;
* cost multiplier — what cost per token is multiplied by: 1/speedup when memory-bound, the ops
  multiplier when compute-bound (see engine.analysis.theory.cost_per_token_multiplier);
* gamma 0 means speculation off;
* regime per γ: with a knee from the batch sweep, a verify step at batch b processes b·(γ+1) token
  rows, so each γ is judged at that width (engine.analysis.regime.regime_at_width); a compute-bound
  γ must stay below the crossover (the chapter's configuration limit) whatever the objective;
* every figure is checked against its physical bound (engine.analysis.bounds) before it is used:
  a measured speedup that breaks one is a measurement error, flagged and never calibrated to.

The parts live beside it: the data (recommend_types), expected tokens and calibration (calibrate), the
γ curve (curve), the choice of γ (choice), the γ-by-batch schedule (schedule) and the words (explain);
every name they export that callers use is importable from here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.analysis.calibrate import (
    Calibration,
    accepted_curve_from_runs,
    calibration,
    effective_c,
    measured_check,
    measurement_flags,
)
from engine.analysis.choice import Judge, RegimeOf, best_row, check_args, judge_for, regime_of
from engine.analysis.curve import crossover_from_curve, gamma_curve
from engine.analysis.explain import explain_off, explain_on, notes
from engine.analysis.feasibility import TIE
from engine.analysis.feasibility import TOLERANCE as GAMMA_TOLERANCE
from engine.analysis.recommend_types import (
    DEFAULT_GAMMAS,
    OBJECTIVES,
    SCHEDULE_BATCHES,
    UNKNOWN,
    DraftMeasurement,
    DraftSummary,
    GammaPoint,
    Recommendation,
)
from engine.analysis.schedule import gamma_schedule, schedule_batches_for
from engine.drafts.kinds import draft_kinds, kind_of_method

__all__ = [
    "DEFAULT_GAMMAS",
    "GAMMA_TOLERANCE",
    "OBJECTIVES",
    "SCHEDULE_BATCHES",
    "UNKNOWN",
    "Calibration",
    "DraftMeasurement",
    "DraftSummary",
    "GammaPoint",
    "Recommendation",
    "RegimeOf",
    "accepted_curve_from_runs",
    "calibration",
    "crossover_from_curve",
    "effective_c",
    "gamma_curve",
    "gamma_schedule",
    "judge_for",
    "measurement_flags",
    "recommend",
    "regime_of",
]


@dataclass(frozen=True)
class _Ask:
    """What recommend() was asked: the objective, the regime as given, and the serving batch."""

    objective: str
    regime: str  # as given: may be UNKNOWN
    budget: float | None
    batch_size: int
    knee_batch: int | None
    votes: Mapping[str, str] | None = None  # what each regime source said, for the notes (None: not known)


@dataclass
class _Table:
    """The per-draft comparison, index-aligned with the candidates (the same draft may be measured twice)."""

    candidates: list[DraftMeasurement]
    curves: list[list[GammaPoint]]
    rows: list[GammaPoint]  # each candidate's chosen row
    summaries: list[DraftSummary]
    judges: list[Judge]


def _validated_gammas(measurements: Sequence[DraftMeasurement], ask: _Ask, gammas: Iterable[int]) -> list[int]:
    """Raise ValueError for any argument recommend() cannot use; the γs to try, as a list."""
    check_args(ask.objective, ask.regime, ask.budget)
    if ask.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {ask.batch_size}")
    if ask.knee_batch is not None and ask.knee_batch < 1:
        raise ValueError(f"knee_batch must be >= 1, got {ask.knee_batch}")
    methods = tuple(kind.method for kind in draft_kinds())
    for m in measurements:
        if m.method not in methods:
            raise ValueError(f"{m.name}: method must be one of {methods}, got {m.method!r}")
    gamma_list = list(gammas)
    if not gamma_list:
        raise ValueError("gammas must not be empty")
    return gamma_list


def _summary(m: DraftMeasurement, rows: list[GammaPoint], row: GammaPoint, pays: bool, judge: Judge) -> DraftSummary:
    """One draft's row of the comparison table, at its chosen γ."""
    cal = calibration(m)
    return DraftSummary(
        name=m.name,
        method=m.method,
        model_ref=m.model_ref,
        alpha=m.alpha,
        c=m.c,
        c_effective=None if cal is None else cal.c,
        best_gamma=row.gamma,
        best_speedup=row.speedup_predicted,
        ops_multiplier=row.ops_multiplier,
        cost_change=judge.cost(row) - 1.0,
        crossover_gamma=crossover_from_curve(rows),
        measured_speedup=dict(m.measured_speedup),
        pays=pays,
        measured_flags={g: f.message for g, f in measurement_flags(m).items()},
        measured_noisy={g: why for g, why in m.noisy_speedup.items() if g in m.measured_speedup},
        why_not=judge.why_not(row),
        regime=judge.regime(row),
        calibration_flag=None if cal is None else cal.flag,
        curve=rows,
    )


def _compare(candidates: list[DraftMeasurement], gammas: list[int], ask: _Ask) -> _Table:
    """Each candidate's γ curve, its best row under the objective, and its summary."""
    table = _Table(candidates=candidates, curves=[], rows=[], summaries=[], judges=[])
    for m in candidates:
        judge = judge_for(m, ask.objective, ask.budget, ask.regime, ask.batch_size, ask.knee_batch)
        rows = gamma_curve(m, gammas)
        row, pays = best_row(rows, judge)
        assert row is not None  # gammas is non-empty
        table.curves.append(rows)
        table.rows.append(row)
        table.judges.append(judge)
        table.summaries.append(_summary(m, rows, row, pays, judge))
    return table


def _winner(table: _Table) -> int | None:
    """Index of the best candidate that pays (the earlier one on a tie), or None when none does."""
    win: int | None = None
    for i, s in enumerate(table.summaries):
        score = table.judges[i].score(table.rows[i])
        if s.pays and (win is None or score > table.judges[win].score(table.rows[win]) + TIE):
            win = i
    return win


def _baseline_money(price_per_hour: float | None, baseline_tokens_per_s: float | None, batch_size: int) -> float | None:
    """Money per million tokens without speculation, when the price and the baseline rate are known."""
    if price_per_hour is not None and baseline_tokens_per_s:
        return price_per_hour / (baseline_tokens_per_s * batch_size * 3600.0) * 1e6
    return None


def _notes(ask: _Ask, table: _Table, m: DraftMeasurement | None, row: GammaPoint | None, regime: str) -> list[str]:
    """The notes of a recommendation (engine.analysis.explain.notes) from what recommend() was asked and compared."""
    return notes(
        m,
        row,
        regime,
        ask.regime,
        ask.batch_size,
        ask.knee_batch,
        table.candidates,
        ask.objective,
        ask.votes,
        table.summaries,
    )


def _off(ask: _Ask, table: _Table, regime_at: RegimeOf, baseline_money: float | None) -> Recommendation:
    """The recommendation when no candidate pays: speculation off, and why."""
    off_regime = regime_at(0)
    return Recommendation(
        objective=ask.objective,
        regime=off_regime,
        budget=ask.budget,
        batch_size=ask.batch_size,
        draft_name=None,
        method="none",
        model_ref=None,
        gamma=0,
        predicted_speedup=1.0,
        ops_multiplier=1.0,
        cost_change=0.0,
        crossover={s.name: s.crossover_gamma for s in table.summaries},
        comparison=table.summaries,
        explanation=explain_off(table.summaries, ask.objective, ask.budget),
        temperature=min((m.temperature for m in table.candidates), default=0.0),
        cost_per_million_baseline=baseline_money,
        cost_per_million=baseline_money,
        notes=_notes(ask, table, None, None, off_regime),
        knee_batch=ask.knee_batch,
        regime_given=ask.regime,
    )


def _on(
    ask: _Ask,
    table: _Table,
    win: int,
    regime_at: RegimeOf,
    baseline_money: float | None,
    schedule: dict[int, int],
) -> Recommendation:
    """The recommendation for the winning candidate at its chosen γ, with its schedule and why."""
    m, row, winner = table.candidates[win], table.rows[win], table.summaries[win]
    others = [s for i, s in enumerate(table.summaries) if i != win]
    chosen_regime = regime_at(row.gamma)
    multiplier = table.judges[win].cost(row)
    return Recommendation(
        objective=ask.objective,
        regime=chosen_regime,
        budget=ask.budget,
        batch_size=ask.batch_size,
        draft_name=m.name,
        method=m.method,
        model_ref=m.model_ref,
        gamma=row.gamma,
        predicted_speedup=row.speedup_predicted,
        ops_multiplier=row.ops_multiplier,
        cost_change=multiplier - 1.0,
        crossover={s.name: s.crossover_gamma for s in table.summaries},
        comparison=table.summaries,
        explanation=explain_on(winner, others),
        temperature=m.temperature,
        measurement=m,
        curve=table.curves[win],
        cost_per_million_baseline=baseline_money,
        cost_per_million=None if baseline_money is None else baseline_money * multiplier,
        schedule=schedule,
        notes=_notes(ask, table, m, row, chosen_regime),
        knee_batch=ask.knee_batch,
        regime_given=ask.regime,
        measured_check=measured_check(m, row.gamma, ask.batch_size, row.speedup_predicted),
    )


def recommend(
    measurements: Sequence[DraftMeasurement],
    objective: str,
    regime: str,
    budget: float | None = None,
    batch_size: int = 1,
    price_per_hour: float | None = None,
    baseline_tokens_per_s: float | None = None,
    gammas: Iterable[int] = DEFAULT_GAMMAS,
    knee_batch: int | None = None,
    schedule_batches: Sequence[int] = SCHEDULE_BATCHES,
    regime_votes: Mapping[str, str] | None = None,
) -> Recommendation:
    """Pick the draft and γ that best serve the objective in this regime, or recommend speculation off.

    Objectives: "latency" maximises speedup; "cost" minimises cost per token (memory-bound: the
    same as latency; compute-bound: the ops multiplier is ≥ 1 for every γ, so it is off unless a
    candidate really gets cheaper); "latency_within_budget" maximises speedup subject to a
    cost-per-token increase ≤ budget. Compute-bound, every objective keeps γ below the crossover.
    A candidate that does not pay (speedup ≤ 1, or cost not reduced for "cost") is never chosen:
    if no draft model pays but an n-gram measurement does, n-gram is chosen; if nothing pays,
    gamma is 0.

    `regime` is "memory-bound", "compute-bound" or "unknown" (treated as memory-bound, and said so
    in the notes). With `knee_batch` (the batch sweep's knee) the regime is judged per γ at the
    verify width batch_size·(γ+1) instead, and `regime` is not used. The γ-by-batch schedule
    (`schedule`, at `schedule_batches` plus the serving batch and the knee) comes from the same
    objective, budget and regime rule at each batch, so schedule[batch_size] == gamma.

    `baseline_tokens_per_s` is the per-stream decode rate without speculation at `batch_size`
    streams; with `price_per_hour` it gives money per million tokens before and after. Measurements
    with method "none" (baselines) are not candidates. `regime_votes` (engine.analysis.regime's RegimeReport.votes)
    let the notes say which evidence decided the regime and which took no side.
    """
    ask = _Ask(
        objective=objective,
        regime=regime,
        budget=budget,
        batch_size=batch_size,
        knee_batch=knee_batch,
        votes=regime_votes,
    )
    gamma_list = _validated_gammas(measurements, ask, gammas)
    regime_at = regime_of(regime, batch_size, knee_batch)
    table = _compare([m for m in measurements if kind_of_method(m.method).speculates], gamma_list, ask)
    win = _winner(table)
    baseline_money = _baseline_money(price_per_hour, baseline_tokens_per_s, batch_size)
    if win is None:
        return _off(ask, table, regime_at, baseline_money)
    batches = schedule_batches_for(schedule_batches, batch_size, knee_batch)
    schedule = gamma_schedule(table.candidates[win], batches, knee_batch, gamma_list, objective, budget, regime)
    chosen_gamma = table.rows[win].gamma
    assert schedule[batch_size] == chosen_gamma, "the schedule and the headline must agree at the serving batch"
    return _on(ask, table, win, regime_at, baseline_money, schedule)
