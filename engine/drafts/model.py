"""A draft model sharing the target's tokenizer, with its own KV cache and rollback.

It reports its confidence in each drafted token (its largest next-token probability, softmax at temperature
1, `confidence`) and takes an optional stop callback (engine.core.policy) that ends a draft early on it."""

from __future__ import annotations

import torch

from engine.core.kvcache import crop_to, forward_step, sequence_cache
from engine.core.model import LoadedModel
from engine.core.policy import DROP, GO, KEEP, Stop
from engine.core.proposal import Proposal
from engine.core.sampling import SamplingConfig, probabilities, sample


def confidence(logits: torch.Tensor) -> float:
    """The draft's confidence in its next token: its largest probability (softmax of the raw logits)."""
    return float(torch.softmax(logits.float(), -1).max())


class ModelDraft:
    """A smaller causal LM sharing the target's tokenizer, with its own KV cache and rollback."""

    method = "draft_model"
    reports_confidence = True

    def __init__(self, draft: LoadedModel, target_vocab: int, name: str | None = None) -> None:
        self.draft = draft
        self.name = name or draft.ref
        self.target_vocab = target_vocab
        self.cache: object = None
        self.cached_len = 0
        self.confidences: list[float] = []  # per token of the last proposal (only when a stop callback was given)

    @property
    def teacher_forced(self) -> LoadedModel:
        """The model whose forward over the target's tokens gives, at each position, what this draft proposes."""
        return self.draft

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = sequence_cache(self.draft, "draft")
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
    def propose(
        self,
        tokens: list[int],
        gamma: int,
        cfg: SamplingConfig,
        gen: torch.Generator | None,
        stop: Stop | None = None,
    ) -> Proposal:
        """Up to γ tokens. With `stop`, it is asked after each token (its 1-based position and the draft's
        confidence): GO drafts on, KEEP ends the draft with this token, DROP ends it without this token.
        `forwards` counts every draft forward, a dropped token's included."""
        self.confidences = []
        if gamma <= 0:
            return Proposal([], None, 0)
        feed = tokens[self.cached_len :]
        proposed: list[int] = []
        qs: list[torch.Tensor] = []
        forwards = 0
        for position in range(1, gamma + 1):
            logits = forward_step(self.draft, feed, self.cache, 1)[0]
            self.cached_len += len(feed)
            forwards += 1
            q = None
            if cfg.greedy:
                token = int(logits.argmax())
            else:
                q = self._fit_vocab(probabilities(logits, cfg))
                token = sample(q, gen)
            decision = GO
            if stop is not None:
                sure = confidence(logits)
                decision = stop(position, sure)
                if decision != DROP:
                    self.confidences.append(sure)
            if decision == DROP:
                break
            proposed.append(token)
            if q is not None:
                qs.append(q)
            if decision == KEEP:
                break
            feed = [token]
        q_all = torch.stack(qs) if qs else None
        return Proposal(proposed, q_all, forwards)

    def commit(self, n_valid: int) -> None:
        if self.cached_len > n_valid:
            crop_to(self.cache, n_valid)
            self.cached_len = n_valid
