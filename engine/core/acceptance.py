"""Acceptance arithmetic on counts (torch-free): per-position rates from the counters a server exposes."""

from __future__ import annotations

from collections.abc import Mapping


def per_position_rates(drafts: float, accepted_by_position: Mapping[int, float]) -> list[float]:
    """Conditional acceptance at each draft position from drafts and per-position accepted counts.

    Servers (llama.cpp, vLLM) count, per position p, the drafts whose token p was accepted; a draft reaches
    p+1 only if p was accepted, so the rate at p is accepted[p] ÷ accepted[p-1] (÷ drafts at p = 0).
    """
    rates: list[float] = []
    reached = drafts
    for p in sorted(accepted_by_position):
        if reached <= 0:
            break
        accepted = accepted_by_position[p]
        rates.append(accepted / reached)
        reached = accepted
    return rates


def per_call_rates(per_position: list[float], drafting_fraction: float = 1.0) -> list[float]:
    """Per-position acceptance per target call: a call that verified no draft accepts nothing at position 1.

    Servers count per-position acceptance over the calls that drafted; a proposer that drafts only sometimes
    (llama.cpp's n-gram lookup, when it finds a match) yields fewer tokens per call than those rates alone say.
    """
    if not per_position:
        return []
    return [per_position[0] * min(max(drafting_fraction, 0.0), 1.0), *per_position[1:]]
