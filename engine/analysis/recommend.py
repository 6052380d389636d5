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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from engine.analysis.bounds import BoundFlag, check_measured_speedup, check_predicted_speedup
from engine.analysis.regime import regime_at_width
from engine.analysis.theory import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    REGIMES,
    cost_per_token_multiplier,
    expected_tokens_per_call,
    expected_tokens_per_call_positional,
    largest_measured_k,
    verify_cost_per_call,
    walltime_improvement,
)
from engine.core.acceptance import per_call_rates

METHODS = ("draft_model", "ngram", "none")
OBJECTIVES = ("latency", "cost", "latency_within_budget")
DEFAULT_GAMMAS = range(1, 33)
SCHEDULE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
UNKNOWN = "unknown"  # a regime nothing decided: treated as memory-bound, and said so in the notes
_TIE = 1e-12
GAMMA_TOLERANCE = 0.01  # speedups (or costs) within 1% of the best count as equal; the smallest such γ wins


@dataclass
class DraftMeasurement:
    """What the sessions measured for one draft (or n-gram proposer) against one target on one workload."""

    name: str
    method: str  # "draft_model" | "ngram" | "none"
    model_ref: str | None
    alpha: float
    per_position_acceptance: list[float] = field(default_factory=list)  # conditional a_i at draft position i+1
    c: float = 0.0  # draft forward time / target forward time
    verify_cost: dict[int, float] = field(default_factory=dict)  # k -> v(k); empty = not measured (v ≡ 1 assumed)
    # per prompt, per output position t of the target's greedy output: how many consecutive draft tokens from t
    # match the target output (may be empty)
    agreement_runs: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    measured_speedup: dict[int, float] = field(default_factory=dict)  # γ -> measured speedup
    session_ids: list[int] = field(default_factory=list)
    c_hat: float = 0.0  # draft arithmetic / target arithmetic (≈ parameter ratio); 0 reproduces the chapter
    ngram_max: int = 4  # n-gram window the session used (method == "ngram" only)
    ngram_min: int = 1
    measured_tokens_per_call: dict[int, float] = field(default_factory=dict)  # γ -> the run's mean acceptance length
    c_hat_source: str = ""  # where ĉ came from ("parameter counts …", "measured c"), for the notes
    # share of target calls that verified a draft at all: below 1 where the proposer drafts only sometimes
    # (llama.cpp's n-gram lookup, when it finds a match); its per-position acceptance counts only those calls
    drafting_fraction: float = 1.0


@dataclass
class GammaPoint:
    """One row of a draft's γ curve."""

    gamma: int
    expected_tokens: float  # from agreement runs when usable, else the positional model
    expected_tokens_one_alpha: float  # single-α model (Theorem 3.8's numerator)
    speedup_predicted: float  # positional/runs E with the draft's c and v(γ+1)
    speedup_one_alpha: float  # Theorem 3.8 with the measured α and c (v = 1)
    ops_multiplier: float
    measured_speedup: float | None
    verify_cost: float  # v(γ+1) used
    speedup_estimate: float  # speedup_predicted, or calibrated to measured speedups when there are any
    expected_tokens_source: str  # "agreement_runs" | "positional"
    verify_extrapolated: bool = False  # γ+1 lies beyond the largest measured k: v(γ+1) is extrapolated
    measured_flag: str | None = None  # the measured speedup breaks a physical bound: shown, never calibrated to
    flags: list[str] = field(default_factory=list)  # predictions that broke a bound (capped at it)


@dataclass
class DraftSummary:
    """One row of the per-draft comparison (the chapter's T5 table, plus what we decided)."""

    name: str
    method: str
    model_ref: str | None
    alpha: float
    c: float
    c_effective: float | None  # c fitted to measured speedups, when there were any
    best_gamma: int
    best_speedup: float
    ops_multiplier: float
    cost_change: float
    crossover_gamma: int | None
    measured_speedup: dict[int, float]
    pays: bool
    measured_flags: dict[int, str] = field(default_factory=dict)  # γ -> why that measured speedup is impossible


@dataclass
class Recommendation:
    """The decision: a draft and γ (or off), what it predicts, and why."""

    objective: str
    regime: str
    budget: float | None
    batch_size: int
    draft_name: str | None
    method: str  # "draft_model" | "ngram" | "none" (off)
    model_ref: str | None
    gamma: int  # 0 = speculation off
    predicted_speedup: float
    ops_multiplier: float
    cost_change: float  # fractional change in cost per token under the regime (+0.4 = +40%)
    crossover: dict[str, int | None]
    comparison: list[DraftSummary]
    explanation: str
    temperature: float = 0.0
    measurement: DraftMeasurement | None = None
    curve: list[GammaPoint] = field(default_factory=list)
    cost_per_million_baseline: float | None = None
    cost_per_million: float | None = None
    schedule: dict[int, int] | None = None  # batch size -> γ from gamma_schedule(); schedule[batch_size] == gamma
    notes: list[str] = field(default_factory=list)
    knee_batch: int | None = None  # the batch sweep's knee the regime per γ was judged against, if any

    @property
    def off(self) -> bool:
        return self.gamma == 0


# ---------------------------------------------------------------------------------------------- curves


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


def _runs_usable(m: DraftMeasurement) -> bool:
    # agreement runs are against the target's *greedy* output; under sampling they would overstate E
    return m.temperature <= 0.0 and any(len(r) for r in m.agreement_runs)


def _expected_tokens(m: DraftMeasurement, gamma: int) -> float:
    if _runs_usable(m):
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
        expected = _expected_tokens(m, gamma)
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


def _bounded(speedup: float, gamma: int, flags: list[str]) -> float:
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
    source = "agreement_runs" if _runs_usable(m) else "positional"
    top_k = largest_measured_k(m.verify_cost)
    rows: list[GammaPoint] = []
    for gamma in gammas:
        gamma = int(gamma)
        if gamma < 1:
            raise ValueError(f"gammas must be >= 1, got {gamma}")
        expected = _expected_tokens(m, gamma)
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


# ---------------------------------------------------------------------------------------------- choice


RegimeOf = Callable[[int], str]  # γ -> the regime a verify step at that γ runs in


def _check_args(objective: str, regime: str, budget: float | None) -> None:
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


def _cost_multiplier(row: GammaPoint, regime: str) -> float:
    return cost_per_token_multiplier(row.speedup_estimate, row.ops_multiplier, regime)


def _feasible(row: GammaPoint, objective: str, regime: str, budget: float | None, cross: int | None) -> bool:
    """Does this (draft, γ) pay under the objective, in the regime its verify step runs in?

    Compute-bound, γ must stay below the crossover (past it the arithmetic grows faster than the
    speed) whatever the objective; memory-bound, the crossover does not matter.
    """
    if regime == COMPUTE_BOUND and cross is not None and row.gamma >= cross:
        return False
    if objective == "cost":
        return _cost_multiplier(row, regime) < 1.0 - _TIE
    if row.speedup_estimate <= 1.0 + _TIE:
        return False
    if objective == "latency_within_budget":
        assert budget is not None
        return _cost_multiplier(row, regime) - 1.0 <= budget + _TIE
    return True


def _key(row: GammaPoint, objective: str, regime: str) -> tuple[float, float]:
    """Larger is better: speed first for latency objectives, cheapness first for cost."""
    if objective == "cost":
        return (-_cost_multiplier(row, regime), row.speedup_estimate)
    return (row.speedup_estimate, -row.ops_multiplier)


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """a strictly better than b (ties keep the earlier, i.e. smaller, γ)."""
    if abs(a[0] - b[0]) > _TIE:
        return a[0] > b[0]
    return a[1] > b[1] + _TIE


def _best_row(
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
        return _key(r, objective, regime_at(r.gamma))

    for feasible_only in (True, False):
        pool = [r for r in rows if not feasible_only or _feasible(r, objective, regime_at(r.gamma), budget, cross)]
        if not pool:
            continue
        best = pool[0]
        for row in pool[1:]:
            if _better(key(row), key(best)):
                best = row
        top = key(best)[0]
        margin = GAMMA_TOLERANCE * abs(top)
        near = [r for r in pool if key(r)[0] >= top - margin]
        return min(near, key=lambda r: r.gamma), feasible_only
    return None, False


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def _explain_on(winner: DraftSummary, others: list[DraftSummary]) -> str:
    """One sentence on why this draft: the balance of α and c, named against the best-α alternative."""
    calib = ""
    usable = {g: v for g, v in winner.measured_speedup.items() if int(g) not in winner.measured_flags}
    if winner.c_effective is not None and usable:
        g_meas = min(usable, key=lambda g: abs(int(g) - winner.best_gamma))
        calib = f" (calibrated to the measured {usable[g_meas]:.2f}× at γ={g_meas})"
    head = f"α {winner.alpha:.2f} at c {winner.c:.2f} gives {winner.best_speedup:.2f}× at γ={winner.best_gamma}{calib}"
    drafts_not_paying = [o for o in others if o.method == "draft_model" and not o.pays]
    if winner.method == "ngram" and drafts_not_paying:
        d = max(drafts_not_paying, key=lambda o: o.best_speedup)
        return (
            f"n-gram lookup ({winner.name}) wins: {winner.best_speedup:.2f}× at γ={winner.best_gamma} with no second "
            f"model, while the draft model {d.name} (α {d.alpha:.2f} at c {d.c:.2f}) predicts only "
            f"{d.best_speedup:.2f}×."
        )
    higher_alpha = [o for o in others if o.alpha > winner.alpha + _TIE]
    if higher_alpha:
        b = max(higher_alpha, key=lambda o: o.alpha)
        return (
            f"{winner.name} wins: {head}; {b.name} has the best α ({b.alpha:.2f}) but c {b.c:.2f} cuts it to "
            f"{b.best_speedup:.2f}×."
        )
    if others:
        r = max(others, key=lambda o: o.best_speedup)
        return (
            f"{winner.name} wins: {head}; it also has the best α, and the runner-up {r.name} reaches "
            f"{r.best_speedup:.2f}×."
        )
    return f"{winner.name}: {head}."


def _explain_off(summaries: list[DraftSummary], objective: str, regime: str, budget: float | None) -> str:
    if not summaries:
        return "Speculation off: there is no draft or n-gram measurement to base a recommendation on."
    best = max(summaries, key=lambda s: (s.best_speedup, -s.ops_multiplier))
    if objective == "cost" and regime == COMPUTE_BOUND:
        cheapest = min(summaries, key=lambda s: s.ops_multiplier)
        return (
            f"Speculation off: the server is compute-bound, so every rejected guess displaces real work — even the "
            f"cheapest option ({cheapest.name} at γ={cheapest.best_gamma}) costs {_pct(cheapest.cost_change)} per "
            f"token."
        )
    if regime == COMPUTE_BOUND and best.crossover_gamma == 1 and best.best_speedup > 1.0:
        return (
            f"Speculation off: the server is compute-bound and even γ=1 is past the crossover for the best candidate "
            f"({best.name}): its arithmetic grows faster than its speed ({best.best_speedup:.2f}× at "
            f"{_pct(best.cost_change)} per token)."
        )
    if objective == "latency_within_budget" and best.best_speedup > 1.0:
        return (
            f"Speculation off: nothing fits the {_pct(budget or 0.0)} cost-per-token budget — {best.name}'s "
            f"{best.best_speedup:.2f}× at γ={best.best_gamma} costs {_pct(best.cost_change)} per token."
        )
    return (
        f"Speculation off: the best candidate ({best.name}: α {best.alpha:.2f} at c {best.c:.2f}) predicts only "
        f"{best.best_speedup:.2f}× at γ={best.best_gamma}, so speculating would not make decoding faster."
    )


def _notes(
    m: DraftMeasurement | None,
    row: GammaPoint | None,
    regime: str,
    given: str,
    batch_size: int,
    knee_batch: int | None,
    candidates: Sequence[DraftMeasurement],
) -> list[str]:
    """What the decision rests on and what it assumed, one sentence each (every export carries them)."""
    notes: list[str] = []
    if given == UNKNOWN:
        notes.append(
            "Regime unknown (no batch sweep, v(k) or roofline decided it): assumed memory-bound, i.e. the extra "
            "arithmetic is treated as free — if the server is compute-bound the cost per token is understated. "
            "Run a batch sweep at the serving batch."
        )
    if regime == MEMORY_BOUND:
        notes.append(
            "Memory-bound: the extra arithmetic runs in idle capacity, so cost per token falls by the speedup."
        )
    else:
        notes.append(
            "Compute-bound: the extra arithmetic displaces real work, so cost per token rises by the ops "
            "multiplier; keep γ below the crossover."
        )
    if knee_batch is not None:
        gamma = 0 if row is None else row.gamma
        width = batch_size * (gamma + 1)
        side = "at or past" if width >= knee_batch else "below"
        notes.append(
            f"A verify step at batch {batch_size} with γ = {gamma} processes {batch_size} × {gamma + 1} = {width} "
            f"token rows, {side} the knee at batch {knee_batch}: {regime}."
        )
    for cand in candidates:
        for _gamma, flag in sorted(measurement_flags(cand).items()):
            notes.append(f"{cand.name}: {flag.message}")
    if m is None or row is None:
        return notes
    if m.temperature > 0:
        notes.append(f"Sampling at temperature {m.temperature:g}: acceptance is lower than under greedy decoding.")
    top_k = largest_measured_k(m.verify_cost)
    if top_k is None:
        notes.append(
            "No v(k) measured: verification is assumed free (v ≡ 1)"
            + (
                "; at a compute-bound batch a (γ+1)-token verify costs more, so measure v(k) at the serving batch."
                if regime == COMPUTE_BOUND
                else "."
            )
        )
    elif row.verify_extrapolated:
        notes.append(
            f"v(γ+1) = v({row.gamma + 1}) = {row.verify_cost:.2f} is extrapolated beyond the largest measured "
            f"k = {top_k} (monotone fit, slope ≥ 0): measure v(k) up to k = {row.gamma + 1} to confirm."
        )
    if regime == COMPUTE_BOUND and m.method == "draft_model":
        if m.c_hat > 0:
            source = f" ({m.c_hat_source})" if m.c_hat_source else ""
            notes.append(
                f"ĉ (draft arithmetic ÷ target arithmetic) = {m.c_hat:.3f}{source}, charged in the ops multiplier "
                "(Theorem 3.11)."
            )
        else:
            notes.append(
                "ĉ (draft arithmetic ÷ target arithmetic) is unknown and taken as 0, so the ops multiplier "
                "understates the draft's own arithmetic."
            )
    for flag in row.flags:
        notes.append(f"{m.name}: {flag}")
    cal = calibration(m)
    if cal is not None and cal.source == "overhead":
        notes.append(f"{m.name}: c fitted to the measured speedups is {cal.c:.3f} (profiled {m.c:.3f}).")
    elif cal is not None:
        notes.append(
            f"{m.name}: measured speedups beat the model even with a free draft; expected tokens scaled "
            f"×{cal.scale:.2f} to match them (never past γ+1 per call)."
        )
    return notes


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
    with method "none" (baselines) are not candidates.
    """
    _check_args(objective, regime, budget)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if knee_batch is not None and knee_batch < 1:
        raise ValueError(f"knee_batch must be >= 1, got {knee_batch}")
    for m in measurements:
        if m.method not in METHODS:
            raise ValueError(f"{m.name}: method must be one of {METHODS}, got {m.method!r}")
    gammas = list(gammas)
    if not gammas:
        raise ValueError("gammas must not be empty")
    candidates = [m for m in measurements if m.method != "none"]
    regime_at = regime_of(regime, batch_size, knee_batch)

    # index-aligned with candidates (names need not be unique: the same draft may be measured twice)
    summaries: list[DraftSummary] = []
    chosen_rows: list[GammaPoint] = []
    curves: list[list[GammaPoint]] = []
    for m in candidates:
        rows = gamma_curve(m, gammas)
        row, pays = _best_row(rows, objective, regime_at, budget)
        assert row is not None  # gammas is non-empty
        curves.append(rows)
        chosen_rows.append(row)
        summaries.append(
            DraftSummary(
                name=m.name,
                method=m.method,
                model_ref=m.model_ref,
                alpha=m.alpha,
                c=m.c,
                c_effective=effective_c(m),
                best_gamma=row.gamma,
                best_speedup=row.speedup_estimate,
                ops_multiplier=row.ops_multiplier,
                cost_change=_cost_multiplier(row, regime_at(row.gamma)) - 1.0,
                crossover_gamma=crossover_from_curve(rows),
                measured_speedup=dict(m.measured_speedup),
                pays=pays,
                measured_flags={g: f.message for g, f in measurement_flags(m).items()},
            )
        )

    crossover = {s.name: s.crossover_gamma for s in summaries}
    win: int | None = None
    for i, s in enumerate(summaries):
        if s.pays and (
            win is None
            or _better(
                _key(chosen_rows[i], objective, regime_at(chosen_rows[i].gamma)),
                _key(chosen_rows[win], objective, regime_at(chosen_rows[win].gamma)),
            )
        ):
            win = i

    baseline_money = None
    if price_per_hour is not None and baseline_tokens_per_s:
        baseline_money = price_per_hour / (baseline_tokens_per_s * batch_size * 3600.0) * 1e6

    if win is None:
        off_regime = regime_at(0)
        return Recommendation(
            objective=objective,
            regime=off_regime,
            budget=budget,
            batch_size=batch_size,
            draft_name=None,
            method="none",
            model_ref=None,
            gamma=0,
            predicted_speedup=1.0,
            ops_multiplier=1.0,
            cost_change=0.0,
            crossover=crossover,
            comparison=summaries,
            explanation=_explain_off(summaries, objective, off_regime, budget),
            temperature=min((m.temperature for m in candidates), default=0.0),
            cost_per_million_baseline=baseline_money,
            cost_per_million=baseline_money,
            notes=_notes(None, None, off_regime, regime, batch_size, knee_batch, candidates),
            knee_batch=knee_batch,
        )

    m, row, winner = candidates[win], chosen_rows[win], summaries[win]
    others = [s for i, s in enumerate(summaries) if i != win]
    chosen_regime = regime_at(row.gamma)
    multiplier = _cost_multiplier(row, chosen_regime)
    batches = sorted({*schedule_batches, batch_size, *([knee_batch] if knee_batch else [])})
    schedule = gamma_schedule(m, batches, knee_batch, gammas, objective, budget, regime)
    assert schedule[batch_size] == row.gamma, "the schedule and the headline must agree at the serving batch"
    return Recommendation(
        objective=objective,
        regime=chosen_regime,
        budget=budget,
        batch_size=batch_size,
        draft_name=m.name,
        method=m.method,
        model_ref=m.model_ref,
        gamma=row.gamma,
        predicted_speedup=row.speedup_estimate,
        ops_multiplier=row.ops_multiplier,
        cost_change=multiplier - 1.0,
        crossover=crossover,
        comparison=summaries,
        explanation=_explain_on(winner, others),
        temperature=m.temperature,
        measurement=m,
        curve=curves[win],
        cost_per_million_baseline=baseline_money,
        cost_per_million=None if baseline_money is None else baseline_money * multiplier,
        schedule=schedule,
        notes=_notes(m, row, chosen_regime, regime, batch_size, knee_batch, candidates),
        knee_batch=knee_batch,
    )


def gamma_schedule(
    measurement: DraftMeasurement,
    batch_sizes: Sequence[int] = SCHEDULE_BATCHES,
    knee_batch: int | None = None,
    gammas: Iterable[int] = DEFAULT_GAMMAS,
    objective: str = "latency",
    budget: float | None = None,
    regime: str = MEMORY_BOUND,
) -> dict[int, int]:
    """γ per serving batch size: at each batch, the choice recommend() makes there for this measurement.

    The same objective and budget at every batch; the regime per γ follows from the knee at the
    verify width b·(γ+1) (memory-bound below it, compute-bound at or past it), or is `regime`
    everywhere when there is no knee (e.g. a regime set by hand, or decided by v(k) alone).
    Compute-bound caps γ below the crossover; γ is 0 (off) only where nothing pays under the
    objective (speedup ≤ 1, cost not reduced, over the budget, or even γ = 1 past the crossover).
    """
    _check_args(objective, regime, budget)
    rows = gamma_curve(measurement, gammas)
    schedule: dict[int, int] = {}
    for b in sorted({int(x) for x in batch_sizes}):
        if b < 1:
            raise ValueError(f"batch sizes must be >= 1, got {b}")
        best, pays = _best_row(rows, objective, regime_of(regime, b, knee_batch), budget)
        schedule[b] = best.gamma if best is not None and pays else 0
    return schedule
