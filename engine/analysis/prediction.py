"""The one prediction model's arithmetic: what a step costs, and the figures of a predicted configuration.

Every predicted number spectune shows or exports (the recommender's γ curve, the policy table, a stored run's
predicted speedup, every export) is a Prediction built here, from steps a decoding loop would take:

* a step drafts `drafted` tokens with `forwards` draft forwards, then verifies them in one target call;
* it costs c·forwards + v(drafted + 1) target-step units (c: the draft's cost, v(k): the fitted verify cost,
  capped at k, below 1 only where a k-token forward measured cheaper than a one-token one,
  engine.analysis.theory.fit_verify_cost), plus the engine's step overhead where its loop measured
  one (engine.analysis.step_overhead: llama-server's); the target alone costs 1 per token;
* its arithmetic is ĉ·forwards + drafted + 1 target positions (Theorem 3.11's count, step by step);
* predicted speedup = tokens ÷ Σ step costs; ops multiplier = Σ arithmetic ÷ tokens;
  cost multiplier = 1/speedup memory-bound, the ops multiplier compute-bound.

Bounds hold by construction and are checked again (`bound_flags`): 1 ≤ tokens per call ≤ most drafted + 1,
speedup ≤ tokens per call ÷ (v_min + the draft's share c·draft calls per step), v_min the cheapest verify the
configuration may take (1 unless measured below), ops multiplier ≥ 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.step_overhead import StepOverhead
from engine.analysis.theory import MEMORY_BOUND, VerifyFit, cost_per_token_multiplier, fit_verify_cost

BASES = ("exact", "estimated", "positional")  # replayed step by step at T=0; in expectation at T>0; per-position
_EXACT = 1e-9


@dataclass(frozen=True)
class DraftingLoop:
    """How an engine's drafting loop reads a draft's confidence and counts its calls, as the replay models it.

    `confidence`: "full" (the draft's own distribution) or "top10" (p over the draft's top 10 logits, as a
    server's draft sampler reads it); `prompt_call`: the first output token comes from the prompt's forward and
    counts as a target call (a server's n_decode counter); `one_ngram_length`: its n-gram lookup matches only the
    window's longest length, with no shorter fallback. The defaults are spectune's own loop."""

    confidence: str = "full"
    prompt_call: bool = False
    one_ngram_length: bool = False


IN_PROCESS_LOOP = DraftingLoop()  # spectune's own loop: the draft's full distribution, every call counted


@dataclass(frozen=True)
class CostModel:
    """What a step costs: c per draft forward and v(k) per k-token verify, in units of one target step."""

    c: float = 0.0
    verify_cost: Mapping[int, float] | None = None  # k -> v(k); None or empty: verification free (v ≡ 1)
    c_hat: float = 0.0  # draft arithmetic ÷ target arithmetic, for the ops multiplier
    regime: str = MEMORY_BOUND  # the regime the cost multiplier is quoted in (a comparison may judge per width)
    overhead: StepOverhead = StepOverhead()  # what a drafting step costs the engine beyond its forwards

    def fit(self) -> VerifyFit | None:
        return fit_verify_cost(self.verify_cost) if self.verify_cost else None

    def v(self, k: int) -> float:
        fit = self.fit()
        return 1.0 if fit is None or k <= 1 else fit.at(k)


@dataclass
class Tally:
    """The steps of a (replayed or expected) decode: weights are 1 for a replayed step, a probability in
    expectation."""

    steps: float = 0.0
    drafted: float = 0.0
    forwards: float = 0.0
    time: float = 0.0
    ops: float = 0.0
    tokens: float = 0.0
    truncated: bool = False
    most_drafted: int = 0

    def step(self, weight: float, drafted: float, forwards: float, cost: CostModel, fit: VerifyFit | None) -> None:
        """One target call that verifies `drafted` tokens after `forwards` draft forwards."""
        v = 1.0 if drafted <= 0 or fit is None else fit.at(int(drafted) + 1)
        self.steps += weight
        self.drafted += weight * drafted
        self.forwards += weight * forwards
        self.time += weight * (cost.c * forwards + v + cost.overhead.at(drafted))
        self.ops += weight * (cost.c_hat * forwards + drafted + 1)
        if weight > 0:
            self.most_drafted = max(self.most_drafted, int(drafted))


@dataclass
class Prediction:
    """One configuration (a fixed γ is a policy) predicted over a draft's recorded pass or per-position rates."""

    policy: str  # the spec string (engine.core.policy.parse_policy reads it back)
    kind: str
    setting: str
    temperature: float
    tokens: float
    steps: float  # target calls
    draft_calls: float  # draft forwards
    drafted: float  # draft tokens sent to verification
    tokens_per_call: float
    draft_calls_per_step: float
    drafted_per_step: float
    predicted_speedup: float
    ops_multiplier: float
    cost_multiplier: float  # in `regime`
    exact: bool  # tokens per call exactly what the loop does
    calls_exact: bool  # draft calls per step exactly what the loop does
    most_drafted: int = 0  # the widest step it may take (the policy's max draft): its verify width is this + 1
    c: float = 0.0  # the draft cost it was predicted with
    verify_floor: float = 1.0  # the cheapest verify it may take, in one-token forwards (VerifyFit.floor)
    regime: str = MEMORY_BOUND
    confidence: str = "full"  # "full" (spectune, transformers) or "top10" (llama.cpp's p)
    basis_name: str = ""  # "" → exact/estimated from `exact`; "positional" from per-position rates
    extrapolated: bool = False  # beyond the measured depth (acceptance or v(k)): a line, not a measurement
    feasible: bool = True  # passes the objective, budget, crossover and width rules it was judged by
    infeasible_why: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def basis(self) -> str:
        return self.basis_name or ("exact" if self.exact else "estimated")

    @property
    def speedup(self) -> float:
        return self.predicted_speedup

    @property
    def draft_share(self) -> float:
        """The draft's share of a target call's time: c · draft forwards per step."""
        return self.c * self.draft_calls_per_step

    def cost_in(self, regime: str) -> float:
        """The cost multiplier in this regime."""
        if self.predicted_speedup <= 0:
            return math.inf
        return cost_per_token_multiplier(self.predicted_speedup, self.ops_multiplier, regime)

    def judged_in(self, regime: str) -> Prediction:
        """This prediction with its cost multiplier quoted in `regime` (in place; returns self)."""
        self.regime = regime
        self.cost_multiplier = self.cost_in(regime)
        return self

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "basis_name"}
        data["basis"] = self.basis
        return data


def finish(
    tally: Tally,
    policy: Any,
    cost: CostModel,
    temperature: float,
    exact: bool,
    calls_exact: bool,
    confidence: str = "full",
    notes: Sequence[str] = (),
    basis: str = "",
) -> Prediction:
    """The Prediction of a tallied decode under `policy` (an engine.core.policy policy)."""
    from engine.core.policy import describe

    steps = tally.steps or 1.0
    speedup = tally.tokens / tally.time if tally.time > 0 else 0.0
    ops = tally.ops / tally.tokens if tally.tokens else math.inf
    pred = Prediction(
        policy=policy.spec(),
        kind=policy.kind,
        setting=describe(policy),
        temperature=float(temperature),
        tokens=tally.tokens,
        steps=tally.steps,
        draft_calls=tally.forwards,
        drafted=tally.drafted,
        tokens_per_call=tally.tokens / steps,
        draft_calls_per_step=tally.forwards / steps,
        drafted_per_step=tally.drafted / steps,
        predicted_speedup=speedup,
        ops_multiplier=ops,
        cost_multiplier=math.inf,
        exact=exact,
        calls_exact=calls_exact,
        most_drafted=int(policy.max_draft()),
        c=cost.c,
        confidence=confidence,
        basis_name=basis,
        notes=list(notes),
        verify_floor=fit.floor(int(policy.max_draft()) + 1) if (fit := cost.fit()) is not None else 1.0,
    )
    return pred.judged_in(cost.regime)


def positional(
    rates: Sequence[float],
    drafting_fraction: float,
    gamma: int,
    cost: CostModel,
    draft_forwards: bool,
    temperature: float = 0.0,
) -> Prediction:
    """Fixed γ from per-position acceptance alone (no recorded pass): a share `drafting_fraction` of target calls
    drafts γ tokens (accepted position by position at the conditional `rates`, the last rate reused past the
    measured depth), the rest run the target alone. `draft_forwards`: the draft costs a forward per token (a
    model), or nothing (a lookup)."""
    from engine.core.policy import FixedGamma

    share = min(max(drafting_fraction, 0.0), 1.0)
    accepted, reach = 0.0, 1.0
    for i in range(gamma):
        reach *= float(rates[min(i, len(rates) - 1)]) if rates else 0.0
        accepted += reach
    fit = cost.fit()
    tally = Tally(tokens=share * (1.0 + accepted) + (1.0 - share))
    tally.step(share, gamma, gamma if draft_forwards else 0, cost, fit)
    tally.step(1.0 - share, 0, 0, cost, fit)
    return finish(tally, FixedGamma(gamma), cost, temperature, exact=False, calls_exact=True, basis="positional")


def bound_flags(pred: Prediction) -> list[str]:
    """Which physical bound a prediction breaks (none, by construction: a breach is a model bug, shown)."""
    flags = []
    top = pred.most_drafted + 1.0
    if not 1.0 - _EXACT <= pred.tokens_per_call <= top + _EXACT:
        flags.append(f"model error: {pred.tokens_per_call:.2f} tokens per call outside 1…{top:.0f}")
    bound = pred.tokens_per_call / (pred.verify_floor + pred.draft_share)
    if pred.predicted_speedup > bound + 1e-6:
        flags.append(
            f"model error: {pred.predicted_speedup:.2f}× exceeds tokens per call ÷ (v_min + draft share) = {bound:.2f}×"
        )
    if pred.ops_multiplier < 1.0 - 1e-6:
        flags.append(f"model error: ops multiplier {pred.ops_multiplier:.2f} below 1")
    return flags
