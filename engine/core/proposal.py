"""What the loop asks of a draft source: the DraftSource protocol, a Proposal, and NoDraft (γ = 0).

A draft source proposes up to γ next tokens for the target to verify (cf. transformers' CandidateGenerator).
It may return the distribution q it sampled each token from (a draft model at temperature > 0) or None,
meaning the proposal is a deterministic function of the context (n-gram lookup, suffix decoding, re-tokenised drafts,
any greedy draft): rejection sampling then uses a one-hot q, which keeps the output exactly the
target's distribution whatever the proposal mechanism.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.core.sampling import SamplingConfig


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # (len(tokens), V) float32, or None for a deterministic proposal
    forwards: int  # draft model forward calls spent


class DraftSource(Protocol):
    """A source of draft tokens. Beside these members a source may answer, where its kind needs it:
    `speculates` (False: the target alone), `teacher_forced` (the model whose forward over the target's own tokens
    gives what it proposes at each position: engine.measure.agreement traces it so), `trace(prompt_ids,
    output_ids, cap)` (its own trace fields, where neither asking it nor teacher forcing gives them) and `fresh()`
    (an empty copy, for a kind that learns across prompts)."""

    name: str
    method: str  # "draft_model" | "ngram" | "suffix" | "none"

    def start(self, prompt_ids: list[int]) -> None:
        """Forget all state: a new prompt begins."""

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        """Propose up to `gamma` tokens that continue `tokens` (prompt + output so far)."""

    def commit(self, n_valid: int) -> None:
        """Only tokens[:n_valid] of the last proposal's context are final; drop cached state past it."""


class NoDraft:
    """Target alone: the autoregressive baseline runs through the same loop with γ = 0."""

    name = "none"
    method = "none"
    speculates = False  # the target alone: no draft, no verification

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal([], None, 0)

    def commit(self, n_valid: int) -> None:
        pass


def matching_run(proposal: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of a proposal equal the text that follows: what greedy verification accepts."""
    run = 0
    for p, o in zip(proposal, truth, strict=False):
        if p != o:
            break
        run += 1
    return run
