"""Each policy answers for itself what callers used to ask its class: its one fixed γ, its schedule by batch size,
whether its γ varies per step, and whether it carries state from step to step."""

from __future__ import annotations

import pytest

from engine.core.policy import parse_policy

# spec -> (fixed γ, schedule by batch, varies per step, carries state)
ANSWERS = {
    "fixed:3": (3, None, False, False),
    "fixed:0": (0, None, False, False),
    "confidence:0.6:8:0": (None, None, True, False),
    "confidence:0.6:8:2:keep": (None, None, True, False),
    "heuristic:4": (None, None, True, True),
    "adaptive": (None, None, True, True),
    "batch:1=4,8=2": (None, {1: 4, 8: 2}, False, False),
}


@pytest.mark.parametrize("spec", sorted(ANSWERS))
def test_each_policy_answers_for_itself(spec: str) -> None:
    policy = parse_policy(spec)
    assert (policy.fixed_gamma(), policy.batch_schedule(), policy.varies_per_step, policy.carries_state) == ANSWERS[
        spec
    ]


@pytest.mark.parametrize(("spec", "gamma"), [("fixed:3", 3), ("batch:1=4,8=2", 4), ("batch:1=4,8=2@8", 2)])
def test_a_policy_that_keeps_gamma_from_step_to_step_drafts_one_gamma(spec: str, gamma: int) -> None:
    """Where γ does not vary per step, every step drafts the one γ a deployment runs (a fixed γ's, or a batch
    schedule's at its serving batch): what the exports take for it."""
    policy = parse_policy(spec)
    assert not policy.varies_per_step and policy.max_draft() == gamma
