"""Speculation counters, one type for every engine, and each figure derived from them defined once (torch-free).

The counters follow vLLM v1's SpecDecodingStats (vllm/v1/spec_decode/metrics.py); spectune's PyTorch loop fills
them from its step records, llama.cpp's and vLLM's /metrics from their Prometheus counters.

Glossary (the conventions every page, export and test uses):

- drafts: target calls that verified at least one draft token (vLLM's num_drafts).
- draft tokens: tokens sent to verification (num_draft_tokens); accepted: of those, the ones kept.
- accepted per position p (0-based): drafts whose token p was accepted; a draft reaches p + 1 only through p.
- target calls: every forward of the target that emitted tokens, drafting or not.
- emitted: tokens appended to the output.
- **mean acceptance length** = 1 + accepted ÷ drafts: tokens per *drafting* call, the bonus token included
  (vLLM's definition).
- **tokens per call** = emitted ÷ target calls: over *every* call; equals the mean acceptance length when every
  call drafts, and is what a speedup is bounded by.
- **draft acceptance rate** = accepted ÷ draft tokens.
- **per-position acceptance rate** at p = accepted[p] ÷ accepted[p − 1] (÷ drafts at p = 0): conditional.
- **drafting fraction** = drafts ÷ target calls (n-gram lookup drafts only where it finds a match).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from engine.core.records import StepRecord


def mean_acceptance_length(drafts: float, accepted: float) -> float | None:
    """1 + accepted ÷ drafts (None without a draft)."""
    return 1.0 + accepted / drafts if drafts else None


def tokens_per_call(emitted: float, target_calls: float) -> float | None:
    """emitted ÷ target calls (None without a call)."""
    return emitted / target_calls if target_calls else None


def draft_acceptance_rate(draft_tokens: float, accepted: float) -> float | None:
    """accepted ÷ draft tokens (None without a draft token)."""
    return accepted / draft_tokens if draft_tokens else None


def drafting_fraction(drafts: float, target_calls: float) -> float | None:
    """drafts ÷ target calls, at most 1 (None without a call)."""
    return min(drafts / target_calls, 1.0) if target_calls else None


def per_position_rates(drafts: float, accepted_by_position: Mapping[int, float]) -> list[float]:
    """The conditional acceptance rate at each draft position, from drafts and per-position accepted counts."""
    rates: list[float] = []
    reached = drafts
    for p in sorted(accepted_by_position):
        if reached <= 0:
            break
        accepted = accepted_by_position[p]
        rates.append(accepted / reached)
        reached = accepted
    return rates


def per_call_rates(per_position: list[float], drafting: float | None = 1.0) -> list[float]:
    """Per-position acceptance per target call: a call that verified no draft accepts nothing at position 1."""
    if not per_position:
        return []
    share = 1.0 if drafting is None else min(max(drafting, 0.0), 1.0)
    return [per_position[0] * share, *per_position[1:]]


@dataclass
class SpecCounters:
    """Cumulative speculation counters over some requests (or the difference of two moments)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    target_calls: float = 0.0
    emitted: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def step_record(self, index: int, wall_s: float) -> StepRecord:
        """A served request (or batch) as one step record of prompt `index`: these counters, and its wall time as
        the verify's (a server reports no draft time of its own)."""
        return StepRecord(
            prompt_index=index,
            step_index=0,
            gamma=int(self.draft_tokens),
            accepted=int(self.accepted_tokens),
            accept_mask=[],
            beta=[],
            draft_time_s=0.0,
            verify_time_s=wall_s,
            draft_forwards=0,
            emitted=int(self.emitted),
            target_calls=int(self.target_calls),
        )

    def _combine(self, other: SpecCounters, sign: float) -> SpecCounters:
        scalars = {
            f.name: getattr(self, f.name) + sign * getattr(other, f.name)
            for f in fields(self)
            if f.name != "accepted_per_position"
        }
        mine, theirs = self.accepted_per_position, other.accepted_per_position
        positions = set(mine) | set(theirs)
        return SpecCounters(
            **scalars, accepted_per_position={p: mine.get(p, 0.0) + sign * theirs.get(p, 0.0) for p in positions}
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, 1.0)

    def minus(self, before: SpecCounters) -> SpecCounters:
        return self._combine(before, -1.0)

    def add_step(self, drafted: int, accepted: int, emitted: int, accepted_mask: list[bool], calls: int = 1) -> None:
        """Count one verification step of spectune's loop (accepted_mask: per evaluated position)."""
        self.target_calls += calls
        self.emitted += emitted
        if drafted <= 0:
            return
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        for p, ok in enumerate(accepted_mask):
            if not ok:
                break
            self.accepted_per_position[p] = self.accepted_per_position.get(p, 0.0) + 1.0
        for p in range(drafted):
            self.accepted_per_position.setdefault(p, 0.0)

    def mean_acceptance_length(self) -> float | None:
        return mean_acceptance_length(self.drafts, self.accepted_tokens)

    def tokens_per_call(self) -> float | None:
        return tokens_per_call(self.emitted, self.target_calls)

    def draft_acceptance_rate(self) -> float | None:
        return draft_acceptance_rate(self.draft_tokens, self.accepted_tokens)

    def drafting_fraction(self) -> float | None:
        return drafting_fraction(self.drafts, self.target_calls)

    def per_position_acceptance(self) -> list[float]:
        return per_position_rates(self.drafts, self.accepted_per_position)

    def drafted_per_call(self) -> float | None:
        """Draft tokens sent to verification per target call."""
        return self.draft_tokens / self.target_calls if self.target_calls else None
