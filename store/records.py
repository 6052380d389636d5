"""What the store reads from the engine's records, declared here so store/ imports nothing from engine/."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StepLike(Protocol):
    """One verification step, as the step log stores it."""

    prompt_index: int
    step_index: int
    gamma: int
    accepted: int
    accept_mask: Sequence[bool]
    beta: Sequence[float]
    draft_time_s: float
    verify_time_s: float
    draft_forwards: int
    emitted: int
    target_calls: int


class OutputLike(Protocol):
    """One prompt's decoded output, as the outputs table stores it."""

    prompt_index: int
    prompt_id: str
    prompt_tokens: int
    text: str
    token_ids: Sequence[int]
    from_draft: Sequence[bool]
    wall_time_s: float
    steps: int
