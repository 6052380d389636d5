"""A draft model with another tokenizer: context and proposals cross over as text."""

from __future__ import annotations

import torch

from engine.core.kvcache import crop_to, forward_step, new_cache
from engine.core.model import LoadedModel
from engine.core.proposal import Proposal
from engine.core.sampling import SamplingConfig


class RetokenizingDraft:
    """A draft with a different tokenizer: context and proposals cross over as text.

    The draft sees the target's context re-tokenised with its own tokenizer (its KV cache is kept
    up to the longest common prefix), drafts greedily, and its text is re-tokenised for the target.
    The proposal is deterministic given the context, so verification uses a one-hot q and the
    output stays exactly the target's distribution; only acceptance suffers from boundary effects.
    """

    method = "draft_model"

    def __init__(self, draft: LoadedModel, target_tokenizer: object, name: str | None = None) -> None:
        self.draft = draft
        self.target_tokenizer = target_tokenizer
        self.name = name or draft.ref
        self.cache: object = None
        self.cached_ids: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = new_cache(self.draft.model.config)
        self.cached_ids = []

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        if gamma <= 0:
            return Proposal([], None, 0)
        text = self.target_tokenizer.decode(tokens, skip_special_tokens=False)
        draft_ids = self.draft.tokenizer.encode(text, add_special_tokens=False)
        if not draft_ids:
            return Proposal([], None, 0)
        common = 0
        limit = min(len(draft_ids) - 1, len(self.cached_ids))  # always feed at least one token
        while common < limit and draft_ids[common] == self.cached_ids[common]:
            common += 1
        if len(self.cached_ids) > common:
            crop_to(self.cache, common)
        feed = draft_ids[common:]
        self.cached_ids = draft_ids[:common]
        new_ids: list[int] = []
        forwards = 0
        # draft a little more than gamma: target tokens are often longer than draft tokens
        for _ in range(gamma + 2):
            logits = forward_step(self.draft, feed, self.cache, 1)[0]
            forwards += 1
            self.cached_ids.extend(feed)
            token = int(logits.argmax())
            new_ids.append(token)
            feed = [token]
            if token == self.draft.tokenizer.eos_token_id:
                break
        new_text = self.draft.tokenizer.decode(new_ids, skip_special_tokens=False)
        proposal = self.target_tokenizer.encode(new_text, add_special_tokens=False)[:gamma]
        return Proposal(proposal, None, forwards)

    def commit(self, n_valid: int) -> None:
        pass  # state is re-derived from text on every proposal


def same_tokenizer(a: object, b: object) -> bool:
    """Two tokenizers are interchangeable when their vocabularies map the same strings to the same ids."""
    if a is b:
        return True
    try:
        return a.get_vocab() == b.get_vocab()
    except Exception:  # tokenizers without get_vocab: compare on a probe string
        probe = "def f(x):\n    return x * 2  # héllo 世界"
        return a.encode(probe) == b.encode(probe)
