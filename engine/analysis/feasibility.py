"""What may be recommended, and which of it is best: one set of rules for a fixed γ and for every policy.

A configuration (a fixed γ is a policy) is judged in the regime its widest verify step runs in — at serving
batch b a step that verifies d draft tokens processes b·(d+1) token rows, compared with the batch sweep's knee
(engine.analysis.regime.regime_at_width) — and is feasible when:

* its draft did not lose at every γ measured at this batch (engine.analysis.calibrate.measured_loss: a
  prediction never overrules a clear measured loss);
* it lies within the measured depth plus EXTRAPOLATION_MARGIN (acceptance and v(k) measured that far);
* compute-bound, it is not past its crossover (its arithmetic multiplier does not exceed its speedup);
* it pays under the objective: "latency" and "latency_within_budget" need a speedup > 1 (the latter also a
  cost-per-token increase ≤ the budget); "cost" needs a lower cost per token.

Among the feasible, the best on the objective wins; within TOLERANCE of it (below run-to-run noise) the simpler
kind, then the narrower step, then fewer draft calls. The recommender's headline, its γ-by-batch schedule, the
policy table and every export read `Judge.best`, so one question has one answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, cost_per_token_multiplier
from engine.core.policy import simplicity

OBJECTIVES = ("latency", "cost", "latency_within_budget")
TOLERANCE = 0.01  # within 1% of the best counts as equal
EXTRAPOLATION_MARGIN = 2  # draft tokens past the measured depth a recommendation may reach
TIE = 1e-12

RegimeOf = Callable[[int], str]  # most drafted per step -> the regime that verify step runs in


class Row(Protocol):
    """What the rules read of a configuration's prediction."""

    kind: str
    most_drafted: int
    draft_calls_per_step: float

    @property
    def speedup(self) -> float: ...

    @property
    def ops_multiplier(self) -> float: ...


def fixed_regime(regime: str) -> RegimeOf:
    return lambda drafted: regime


@dataclass(frozen=True)
class Judge:
    """The rules one recommendation applies to every candidate row."""

    objective: str = "latency"
    budget: float | None = None
    regime_at: RegimeOf = fixed_regime(MEMORY_BOUND)
    depth: int | None = None  # the most draft tokens per step allowed (measured depth + margin); None: any
    lost: str = ""  # why nothing of the draft may be recommended: it lost at every γ measured at this batch

    def regime(self, row: Row) -> str:
        return self.regime_at(row.most_drafted)

    def cost(self, row: Row) -> float:
        """What the row multiplies cost per token by, in the regime of its own verify width."""
        if row.speedup <= 0:
            return math.inf
        return cost_per_token_multiplier(row.speedup, row.ops_multiplier, self.regime(row))

    def why_not(self, row: Row) -> str:
        """'' when the row may be recommended; else why not, in a few words."""
        if self.lost:
            return self.lost
        if self.depth is not None and row.most_drafted > self.depth:
            return f"drafts {row.most_drafted} per step, beyond the measured depth (+{EXTRAPOLATION_MARGIN})"
        regime = self.regime(row)
        if regime == COMPUTE_BOUND and row.ops_multiplier > row.speedup + TIE:
            return "past the crossover: compute-bound, its arithmetic grows faster than its speed"
        if self.objective == "cost":
            return "" if self.cost(row) < 1.0 - TIE else "does not lower the cost per token"
        if row.speedup <= 1.0 + TIE:
            return "not faster than the target alone"
        if self.objective == "latency_within_budget" and self.cost(row) - 1.0 > (self.budget or 0.0) + TIE:
            return f"over the {(self.budget or 0.0) * 100:+.0f}% cost budget"
        return ""

    def feasible(self, row: Row) -> bool:
        return not self.why_not(row)

    def score(self, row: Row) -> float:
        """Larger is better: speed for the latency objectives, cheapness for cost."""
        return -self.cost(row) if self.objective == "cost" else row.speedup

    def _simpler(self, row: Row) -> tuple[int, int, float]:
        kind = simplicity(row.kind)  # ties go to the simpler kind
        return kind, row.most_drafted, row.draft_calls_per_step

    def pick(self, rows: Sequence[Row]) -> Row | None:
        """The best of `rows` regardless of feasibility (the simplest within TOLERANCE of the top score)."""
        if not rows:
            return None
        top = max(self.score(r) for r in rows)
        near = [r for r in rows if self.score(r) >= top - TOLERANCE * abs(top) - TIE]
        return min(near, key=self._simpler)

    def best(self, rows: Iterable[Row]) -> Row | None:
        """The best feasible row, None when nothing may be recommended (speculation off)."""
        return self.pick([r for r in rows if self.feasible(r)])

    def ranked(self, rows: Iterable[Row]) -> list[Row]:
        """Feasible rows first, each group best first by `pick`'s order."""
        rows = list(rows)
        out: list[Row] = []
        for group in ([r for r in rows if self.feasible(r)], [r for r in rows if not self.feasible(r)]):
            pool = list(group)
            while pool:
                head = self.pick(pool)
                assert head is not None
                out.append(head)
                pool = [r for r in pool if r is not head]
        return out


def check_objective(objective: str, budget: float | None) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "latency_within_budget" and budget is None:
        raise ValueError("objective 'latency_within_budget' needs a budget (e.g. 0.20 for +20% cost per token)")
