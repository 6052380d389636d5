"""Plain data that crosses module boundaries: what one verification step and one run produced.

These records are the contract between the decoder, the store, the recommender and the UI, so
they hold only numbers, strings and lists (JSON-serialisable via dataclasses.asdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Cancelled(Exception):
    """Raised inside a sweep when the caller's should_stop() says so (checked once per step or request)."""


@dataclass
class StepRecord:
    """One draft-propose + target-verify round (or one plain target step when gamma == 0)."""

    prompt_index: int
    step_index: int
    gamma: int  # draft tokens actually proposed this step (n-gram may propose fewer than configured)
    accepted: int  # draft tokens accepted (0..gamma)
    accept_mask: list[bool]  # one per evaluated draft position: accepted.., then False on the rejection
    beta: list[float]  # per evaluated position: sum(min(p, q)); 1[argmax agree] when greedy
    draft_time_s: float
    verify_time_s: float
    draft_forwards: int  # draft model forward calls this step (0 for n-gram / none)
    emitted: int  # tokens appended to the output this step (accepted + 1, capped by max_new_tokens)
    emitted_token_ids: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)  # per emitted token: proposed by the draft and accepted
    target_calls: int = 1  # target forwards this record covers (a llama.cpp request covers many)


@dataclass
class PromptOutput:
    """The result of decoding one prompt."""

    prompt_index: int
    prompt_id: str
    prompt_tokens: int
    token_ids: list[int]
    text: str
    from_draft: list[bool]  # per output token
    wall_time_s: float  # prefill + decode
    steps: int
    prefill_time_s: float = 0.0
    # the target's top-k logits per emitted position, only when recorded (for divergence analysis of
    # baselines): (n_tokens, k) tensors, the one non-plain field, kept compact and never serialised
    top_logits: Any = None
    top_ids: Any = None


@dataclass
class Divergence:
    """Whether a speculative output matches the target alone, and if not, why."""

    prompt_id: str
    identical: bool
    position: int | None = None  # first divergent output position
    target_token: int | None = None
    speculative_token: int | None = None
    margin: float | None = None  # target logit(target_token) - logit(speculative_token) at that position
    tolerance: float | None = None
    verdict: str = "identical"  # identical | near-tie | bug | not-applicable
