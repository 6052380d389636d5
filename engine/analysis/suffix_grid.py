"""Suffix decoding's parameters as a grid, replayed from one recorded pass.

A suffix draft is a function of the text alone (the prompt, the output so far and the earlier responses in its
cache), so the target's greedy outputs, recorded once, give what the loop does for any parameters without a
model: each grid point replays the loop's steps along those outputs (engine.drafts.suffix.replay_fixed), prompts
in the recorded order from an empty cache: tokens per target call at each fixed γ, exact at temperature 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.drafts.refs import SuffixParams, suffix_ref
from engine.drafts.suffix import SuffixDraft, replay_fixed

DEPTHS = (8, 16, 24, 32)
SPEC_FACTORS = (0.5, 1.0, 2.0)
MIN_PROBS = (0.0, 0.1, 0.3)
CACHED = (0, 10000)  # the prompt tree only (cold), and vLLM's default global tree


@dataclass(frozen=True)
class GridPoint:
    ref: str  # the draft reference that runs these parameters live
    params: SuffixParams
    gamma: int
    tokens_per_call: float


def default_grid() -> list[SuffixParams]:
    return [SuffixParams(*p) for p in itertools.product(DEPTHS, SPEC_FACTORS, MIN_PROBS, CACHED)]


def suffix_grid(
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    gammas: Iterable[int] = (4, 8, 16),
    grid: Iterable[SuffixParams] | None = None,
) -> list[GridPoint]:
    """Tokens per target call for every grid point × γ, from the prompts' ids and the target's greedy outputs in
    the order they ran; best first."""
    if len(prompts) != len(outputs):
        raise ValueError("one output per prompt")
    points = []
    for params in grid if grid is not None else default_grid():
        for gamma in sorted(set(gammas)):
            draft = SuffixDraft(params)
            calls = sum(replay_fixed(draft, p, o, gamma) for p, o in zip(prompts, outputs, strict=True))
            tokens = sum(len(o) for o in outputs) / max(1, calls)
            points.append(GridPoint(suffix_ref(params), params, gamma, tokens))
    return sorted(points, key=lambda g: -g.tokens_per_call)
