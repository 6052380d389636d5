"""Agreement runs: the whole γ curve from one measurement.

At temperature 0 a draft proposing from position t of the target's output keeps agreeing exactly
as long as its teacher-forced argmax matches the target's tokens (its context is then identical).
So one teacher-forced draft forward over prompt + target output gives, at every position, the
number of consecutive draft tokens that would be accepted, for every γ at once.
"""

from __future__ import annotations

import torch

from engine.core.kvcache import forward_step, new_cache
from engine.core.proposal import DraftSource
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft


def runs_from_matches(matches: list[bool], cap: int) -> list[int]:
    """run[t] = number of consecutive True values from t (capped)."""
    runs = [0] * len(matches)
    following = 0
    for t in range(len(matches) - 1, -1, -1):
        following = following + 1 if matches[t] else 0
        runs[t] = min(following, cap)
    return runs


@torch.inference_mode()
def agreement_runs(draft: DraftSource, prompt_ids: list[int], output_ids: list[int], cap: int = 32) -> list[int]:
    """Per output position, how many draft tokens from there match the target's greedy output."""
    if not output_ids:
        return []
    if isinstance(draft, ModelDraft):
        context = list(prompt_ids) + list(output_ids)
        logits = forward_step(draft.draft, context[:-1], new_cache(draft.draft.model.config), len(output_ids))
        predicted = logits.argmax(-1).tolist()
        return runs_from_matches([p == o for p, o in zip(predicted, output_ids, strict=True)], cap)
    if isinstance(draft, NgramDraft):
        runs = []
        context = list(prompt_ids)
        for t, _token in enumerate(output_ids):
            proposal = draft.lookup(context, cap)
            run = 0
            for p, o in zip(proposal, output_ids[t:], strict=False):
                if p != o:
                    break
                run += 1
            runs.append(run)
            context.append(output_ids[t])
        return runs
    return []
