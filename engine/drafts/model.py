"""A draft model sharing the target's tokenizer, with its own KV cache and rollback."""

from __future__ import annotations

import torch

from engine.core.kvcache import crop_to, forward_step, new_cache
from engine.core.model import LoadedModel
from engine.core.proposal import Proposal
from engine.core.sampling import SamplingConfig, probabilities, sample


class ModelDraft:
    """A smaller causal LM sharing the target's tokenizer, with its own KV cache and rollback."""

    method = "draft_model"

    def __init__(self, draft: LoadedModel, target_vocab: int, name: str | None = None) -> None:
        self.draft = draft
        self.name = name or draft.ref
        self.target_vocab = target_vocab
        self.cache: object = None
        self.cached_len = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = new_cache(self.draft.model.config)
        self.cached_len = 0

    def _fit_vocab(self, q: torch.Tensor) -> torch.Tensor:
        """Draft and target embeddings may be padded differently; align q to the target's vocabulary."""
        v = q.shape[-1]
        if v == self.target_vocab:
            return q
        if v > self.target_vocab:
            q = q[..., : self.target_vocab]
            return q / q.sum(-1, keepdim=True).clamp_min(1e-30)
        return torch.nn.functional.pad(q, (0, self.target_vocab - v))

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        if gamma <= 0:
            return Proposal([], None, 0)
        feed = tokens[self.cached_len :]
        proposed: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(gamma):
            logits = forward_step(self.draft, feed, self.cache, 1)[0]
            self.cached_len += len(feed)
            if cfg.greedy:
                token = int(logits.argmax())
            else:
                q = self._fit_vocab(probabilities(logits, cfg))
                token = sample(q, gen)
                qs.append(q)
            proposed.append(token)
            feed = [token]
        q_all = torch.stack(qs) if qs else None
        return Proposal(proposed, q_all, gamma)

    def commit(self, n_valid: int) -> None:
        if self.cached_len > n_valid:
            crop_to(self.cache, n_valid)
            self.cached_len = n_valid
