"""Logits → probabilities, applied identically to the target (p) and the draft (q).

Rejection sampling is exact only if p and q are the distributions that would actually be
sampled from, so temperature, top-k and top-p are applied to both in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Sampling distribution over the vocabulary for each row of `logits` (..., V), in float32."""
    logits = logits.float()
    if cfg.greedy:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps at least one)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
