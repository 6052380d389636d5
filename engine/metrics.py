"""Acceptance and speed statistics from recorded verification steps."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from engine.records import PromptOutput, StepRecord


def alpha_mean_beta(steps: Sequence[StepRecord]) -> float | None:
    """α as the mean exact acceptance probability β over every evaluated draft position."""
    betas = [b for s in steps for b in s.beta]
    return sum(betas) / len(betas) if betas else None


def per_position_acceptance(steps: Sequence[StepRecord]) -> list[float]:
    """Conditional acceptance rate at draft position i, given positions < i were accepted."""
    evaluated: list[int] = []
    accepted: list[int] = []
    for s in steps:
        for i, ok in enumerate(s.accept_mask):
            if i >= len(evaluated):
                evaluated.append(0)
                accepted.append(0)
            evaluated[i] += 1
            accepted[i] += int(ok)
    return [a / e for a, e in zip(accepted, evaluated, strict=True)]


def mean_tokens_per_call(steps: Sequence[StepRecord]) -> float | None:
    """Tokens emitted per target forward: the 'mean accepted length' including the bonus/correction."""
    return sum(s.emitted for s in steps) / len(steps) if steps else None


def full_gamma_steps(steps: Sequence[StepRecord], gamma: int) -> list[StepRecord]:
    """Steps that proposed the full γ (n-gram misses and the final truncated step excluded)."""
    return [s for s in steps if s.gamma == gamma]


def draft_forward_time(steps: Sequence[StepRecord]) -> float | None:
    """Median wall time of one draft forward."""
    per = [s.draft_time_s / s.draft_forwards for s in steps if s.draft_forwards > 0]
    return median(per) if per else None


def single_token_step_time(steps: Sequence[StepRecord]) -> float | None:
    """Median wall time of a 1-token target forward (baseline steps)."""
    per = [s.verify_time_s for s in steps if s.gamma == 0]
    return median(per) if per else None


def tokens_per_second(outputs: Sequence[PromptOutput]) -> float:
    """Decode throughput: output tokens over decode time (prefill excluded, identical for every method)."""
    tokens = sum(len(o.token_ids) for o in outputs)
    seconds = sum(o.wall_time_s - o.prefill_time_s for o in outputs)
    return tokens / seconds if seconds > 0 else 0.0
