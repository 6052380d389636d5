"""Divergence verdicts: identical, numerical near-tie (margin within the dtype tolerance), or bug."""

from __future__ import annotations

import torch

from engine.core.records import PromptOutput
from engine.measure.fidelity import TOLERANCE, classify, first_divergence


def output(ids: list[int], top: list[list[tuple[int, float]]] | None = None) -> PromptOutput:
    out = PromptOutput(0, "p0", 3, ids, "", [False] * len(ids), 1.0, len(ids))
    if top is not None:
        out.top_ids = torch.tensor([[i for i, _ in row] for row in top], dtype=torch.int32)
        out.top_logits = torch.tensor([[v for _, v in row] for row in top])
    return out


TOP = [[(5, 20.0), (6, 19.9), (7, 12.0)], [(8, 30.0), (9, 29.7), (4, 10.0)], [(1, 9.0), (2, 3.0), (3, 1.0)]]


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 4, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_identical():
    d = classify(output([5, 8, 1], TOP), output([5, 8, 1]), "bfloat16", greedy=True)
    assert d.identical and d.verdict == "identical"


def test_near_tie_within_bf16_tolerance_but_bug_in_fp32():
    d = classify(output([5, 8, 1], TOP), output([5, 9, 2]), "bfloat16", greedy=True)
    assert (d.position, d.target_token, d.speculative_token) == (1, 8, 9)
    assert abs(d.margin - 0.3) < 1e-5 and d.tolerance == TOLERANCE["bfloat16"] and d.verdict == "near-tie"
    assert classify(output([5, 8, 1], TOP), output([5, 9, 2]), "float32", greedy=True).verdict == "bug"


def test_large_margin_or_unknown_token_is_a_bug():
    d = classify(output([5, 8, 1], TOP), output([5, 8, 2]), "bfloat16", greedy=True)
    assert d.verdict == "bug" and abs(d.margin - 6.0) < 1e-5
    d = classify(output([5, 8, 1], TOP), output([7777]), "bfloat16", greedy=True)
    assert d.verdict == "bug" and d.margin >= 8.0  # not in the top-k: the margin is at least top1 - topk


def test_sampling_runs_are_not_judged():
    d = classify(output([5, 8, 1], TOP), output([5, 9, 2]), "bfloat16", greedy=False)
    assert d.verdict == "not-applicable" and not d.identical
