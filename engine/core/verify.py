"""Verification: given the target's logits over γ+1 positions, keep the longest correct prefix of a draft.

One entry point, `verify`, after vLLM's rejection sampler. `q=None` marks a deterministic draft (n-gram
lookup, greedy or re-tokenised drafts): rejection sampling then uses a one-hot q, which keeps the output
exactly the target's distribution whatever produced the proposal.

Glossary (each term is defined here once; the rest of spectune uses these words):

- drafted: the γ tokens the draft proposed this step (d1..dγ).
- accepted: the number of leading drafted tokens the target keeps (0..γ).
- corrected token: on the first rejection, the token drawn from norm(max(0, p − q)) (greedy: the target's
  argmax) that replaces the rejected draft token.
- bonus token: after all γ drafted tokens are accepted, the extra token drawn from the target's
  distribution at position γ+1. Each step emits accepted + 1 tokens: a corrected or a bonus token.
- β (beta): the exact probability that a drafted token is accepted at one position, Σ min(p, q)
  (greedy: 1 if the draft token is the target's argmax, else 0). Recorded per evaluated position.
- α (alpha): the mean of β over every evaluated position: the chance the target accepts a draft token.
- mean acceptance length: accepted + 1 averaged over the steps that drafted (vLLM's word; it includes the bonus
  or corrected token, so it is at most γ+1); tokens per call averages over every step (engine.core.counters).
- per-position acceptance rate: at draft position i, the share accepted among steps that reached i.
- draft acceptance rate: accepted draft tokens ÷ drafted tokens, over a whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.sampling import SamplingConfig, probabilities, sample


@dataclass
class Verdict:
    """One step's outcome: `accepted` drafted tokens kept, then `next_token` (corrected or bonus)."""

    accepted: int
    next_token: int
    accept_mask: list[bool]
    beta: list[float]


def verify(
    logits: torch.Tensor,
    drafted: list[int],
    q: torch.Tensor | None,
    cfg: SamplingConfig,
    gen: torch.Generator | None,
) -> Verdict:
    """Accept the longest correct prefix of `drafted` given target logits (γ+1, V).

    Greedy: accept while the draft token is the target's argmax. Sampling: the modified rejection
    sampling of Leviathan et al. / Chen et al.: accept x with min(1, p(x)/q(x)); on rejection draw from
    norm(max(0, p − q)); after γ acceptances draw the bonus token from p. q=None means one-hot q.
    """
    mask: list[bool] = []
    beta: list[float] = []
    if cfg.greedy:
        choice = logits.argmax(-1).tolist()
        for i, token in enumerate(drafted):
            ok = token == choice[i]
            mask.append(ok)
            beta.append(1.0 if ok else 0.0)
            if not ok:
                return Verdict(i, choice[i], mask, beta)
        return Verdict(len(drafted), choice[len(drafted)], mask, beta)

    p = probabilities(logits, cfg)
    for i, token in enumerate(drafted):
        p_i = p[i]
        if q is None:
            q_x = 1.0
            beta.append(float(p_i[token]))
        else:
            q_i = q[i]
            q_x = float(q_i[token])
            beta.append(float(torch.minimum(p_i, q_i).sum()))
        p_x = float(p_i[token])
        r = float(torch.rand((), generator=gen))
        if q_x > 0 and r * q_x < p_x:
            mask.append(True)
            continue
        mask.append(False)
        if q is None:
            residual = p_i.clone()
            residual[token] = 0.0
        else:
            residual = (p_i - q[i]).clamp_min(0.0)
        total = float(residual.sum())
        next_token = sample(residual / total, gen) if total > 0 else sample(p_i, gen)
        return Verdict(i, next_token, mask, beta)
    return Verdict(len(drafted), sample(p[len(drafted)], gen), mask, beta)
