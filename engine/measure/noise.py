"""Speedups robust to drift: ratios of neighbouring measurements, their spread, and a noise verdict.

A machine's load changes minute to minute, so a speedup is only formed from a baseline and a candidate
measured next to each other (the same prompt, one right after the other). Each prompt gives one ratio;
the run's speedup is their median, reported with min and max. When that spread is wider than the effect
("is it faster at all?"), the verdict says so instead of offering a bare number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import median

# the spread (max/min of per-prompt ratios) beyond which one prompt's ratio says little about another's
WIDE_SPREAD = 1.5


@dataclass(frozen=True)
class Spread:
    """Per-prompt speedups (candidate tokens/s ÷ the neighbouring baseline's) summarised."""

    median: float
    min: float
    max: float
    n: int
    verdict: str  # "faster" | "slower" | "too noisy to tell" | "single measurement"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def ratios(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """candidate ÷ baseline for each (baseline, candidate) pair of rates measured side by side."""
    return [cand / base for base, cand in pairs if base > 0 and cand > 0]


def spread_of(values: Sequence[float]) -> Spread | None:
    """The spread of per-prompt speedups and what it allows us to say; None with no usable pair."""
    if not values:
        return None
    lo, mid, hi = min(values), median(values), max(values)
    if len(values) == 1:
        verdict = "single measurement"
    elif lo > 1.0:
        verdict = "faster"
    elif hi < 1.0:
        verdict = "slower"
    else:  # the per-prompt ratios straddle 1: the effect is smaller than the noise
        verdict = "too noisy to tell"
    return Spread(median=mid, min=lo, max=hi, n=len(values), verdict=verdict)


def is_noisy(spread: Spread | None) -> bool:
    """A measured speedup that must not be calibrated to: straddling 1, or its ratios widely spread."""
    if spread is None or spread.n < 2:
        return spread is None
    return spread.verdict == "too noisy to tell" or spread.max / spread.min > WIDE_SPREAD
