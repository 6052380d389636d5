"""N-gram prompt lookup: a pure lookup function and a thin DraftSource around it."""

from __future__ import annotations

import torch

from engine.core.proposal import Proposal
from engine.core.sampling import SamplingConfig
from engine.drafts.refs import NGRAM_DEFAULT


def ngram_lookup(tokens: list[int], gamma: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Up to `gamma` tokens that followed the most recent earlier occurrence of the longest trailing n-gram.

    Tries n = max_ngram down to min_ngram; for each, searches right to left for an earlier match that has a
    continuation. Empty when nothing matches: the step then runs with no draft tokens.
    """
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        tail = tokens[n_tokens - n :]
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + gamma]
                if follow:
                    return follow
    return []


class NgramDraft:
    """Prompt lookup: find the latest earlier occurrence of the trailing n-gram, propose what followed.

    Draft-free (c ≈ 0): it pays on inputs that get copied into the output (code edits, RAG, summaries).
    """

    method = "ngram"

    def __init__(self, max_ngram: int = NGRAM_DEFAULT[1], min_ngram: int = NGRAM_DEFAULT[0]) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = "ngram"

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], gamma: int) -> list[int]:
        return ngram_lookup(tokens, gamma, self.min_ngram, self.max_ngram)

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal(self.lookup(tokens, gamma) if gamma > 0 else [], None, 0)

    def commit(self, n_valid: int) -> None:
        pass
