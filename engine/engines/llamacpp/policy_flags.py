"""The speculation policies llama-server runs as is, and the draft-simple settings each one maps onto.

llama-server drafts with `--spec-draft-n-max` tokens at most, stops at the first draft token whose top-10
probability is below `--spec-draft-p-min` (dropping it) and discards drafts shorter than `--spec-draft-n-min`.
That is a fixed γ (p-min 0) or spectune's confidence stop without `keep`; no other policy is expressible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.core.policy import ConfidenceStop, SpeculationPolicy, parse_policy

if TYPE_CHECKING:
    from engine.core.counters import SpecCounters

RUNNABLE = "fixed:G and confidence:P:NMAX:NMIN (the unsure token dropped, no keep)"


def llamacpp_fields(policy: SpeculationPolicy | str) -> dict[str, Any] | None:
    """ServerConfig's draft settings for a policy llama-server can run as is (a length cap, an n-min and a
    confidence stop that drops the unsure token: `DraftControls.plain`), else None."""
    if isinstance(policy, str):
        policy = parse_policy(policy)
    if (gamma := policy.fixed_gamma()) is not None:
        return {"draft_n_max": gamma, "draft_n_min": 0, "draft_p_min": 0.0}
    controls = policy.controls()
    if not controls.plain or not policy.varies_per_step:
        return None  # a γ by batch size is not a draft-length setting either
    return {"draft_n_max": controls.n_max, "draft_n_min": controls.n_min, "draft_p_min": controls.p_min}


def unmappable(policy: SpeculationPolicy) -> str:
    """Why llama-server cannot run `policy`, and what it can run instead."""
    spectune = f"or {policy.spec()} in spectune's loop (--engine spectune)"
    controls = policy.controls()
    if controls.keeps_unsure and controls.schedule is None and not controls.beyond:
        dropping = ConfidenceStop(controls.p_min, controls.n_max, controls.n_min).spec()
        why = "it drops the unsure token, never keeps it"
        return f"llama.cpp cannot run {policy.spec()}: {why}; run {dropping}, {spectune}"
    return f"llama.cpp cannot run {policy.spec()}: it runs {RUNNABLE}; choose one of those, {spectune}"


def draft_forwards(counters: SpecCounters, requests: int, p_min: float | None) -> int:
    """The draft's forwards over `requests` requests, from the server's counters: one per drafted token, and with
    a p-min one more per drafting attempt for the token it sampled and dropped (every target call but a request's
    first follows an attempt). An upper bound by one per step that drafted its full n-max."""
    attempts = max(0.0, counters.target_calls - requests) if p_min else 0.0
    return round(counters.draft_tokens + attempts)
