"""Acceptance and speed statistics from recorded verification steps.

StepStats accumulates as steps arrive, so a long session keeps a few numbers per step (two
floats for the medians) instead of every StepRecord: the worker's memory stays flat.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from engine.core.counters import tokens_per_call
from engine.core.records import PromptOutput, StepRecord


@dataclass
class StepStats:
    """Running totals over steps: everything α, c and the speedups are computed from."""

    steps: int = 0
    emitted: int = 0
    drafted: int = 0  # draft tokens proposed, over all steps
    accepted_total: int = 0  # of which the target accepted
    beta_sum: float = 0.0
    beta_count: int = 0
    evaluated: list[int] = field(default_factory=list)  # per draft position
    accepted: list[int] = field(default_factory=list)
    draft_forward_s: array = field(default_factory=lambda: array("d"))
    single_step_s: array = field(default_factory=lambda: array("d"))

    @classmethod
    def of(cls, steps: Iterable[StepRecord]) -> StepStats:
        stats = cls()
        for s in steps:
            stats.add(s)
        return stats

    def add(self, s: StepRecord) -> None:
        self.steps += 1
        self.emitted += s.emitted
        self.drafted += s.gamma
        self.accepted_total += s.accepted
        self.beta_sum += sum(s.beta)
        self.beta_count += len(s.beta)
        for i, ok in enumerate(s.accept_mask):
            if i >= len(self.evaluated):
                self.evaluated.append(0)
                self.accepted.append(0)
            self.evaluated[i] += 1
            self.accepted[i] += int(ok)
        if s.draft_forwards > 0:
            self.draft_forward_s.append(s.draft_time_s / s.draft_forwards)
        if s.gamma == 0:
            self.single_step_s.append(s.verify_time_s)

    def alpha(self) -> float | None:
        """α as the mean exact acceptance probability β over every evaluated draft position."""
        return self.beta_sum / self.beta_count if self.beta_count else None

    def draft_acceptance_rate(self) -> float | None:
        """Accepted draft tokens ÷ drafted tokens (vLLM's draft acceptance rate)."""
        return self.accepted_total / self.drafted if self.drafted else None

    def per_position(self) -> list[float]:
        """Conditional acceptance rate at draft position i, given positions < i were accepted."""
        return [a / e for a, e in zip(self.accepted, self.evaluated, strict=True)]

    def tokens_per_call(self) -> float | None:
        """Tokens emitted per target forward (engine.core.counters' definition, over every step)."""
        return tokens_per_call(self.emitted, self.steps)

    def draft_forward_time(self) -> float | None:
        """Median wall time of one draft forward."""
        return median(self.draft_forward_s) if self.draft_forward_s else None

    def single_token_step_time(self) -> float | None:
        """Median wall time of a 1-token target forward (baseline steps)."""
        return median(self.single_step_s) if self.single_step_s else None


def alpha_mean_beta(steps: Sequence[StepRecord]) -> float | None:
    return StepStats.of(steps).alpha()


def per_position_acceptance(steps: Sequence[StepRecord]) -> list[float]:
    return StepStats.of(steps).per_position()


def mean_tokens_per_call(steps: Sequence[StepRecord]) -> float | None:
    return StepStats.of(steps).tokens_per_call()


def draft_forward_time(steps: Sequence[StepRecord]) -> float | None:
    return StepStats.of(steps).draft_forward_time()


def single_token_step_time(steps: Sequence[StepRecord]) -> float | None:
    return StepStats.of(steps).single_token_step_time()


def tokens_per_second(outputs: Sequence[PromptOutput]) -> float:
    """Decode throughput: output tokens over decode time (prefill excluded, identical for every method)."""
    tokens = sum(len(o.token_ids) for o in outputs)
    seconds = sum(o.wall_time_s - o.prefill_time_s for o in outputs)
    return tokens / seconds if seconds > 0 else 0.0
