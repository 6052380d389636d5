"""llama-server outputs judged by fidelity.classify: the target-alone run's top log-probs (n_probs) give the margin."""

from __future__ import annotations

import pytest

from engine.measure.fidelity import TOLERANCE, classify, served_output

# per output token, llama-server's top log-probs as (token id, log-prob); not necessarily sorted
TOP = [[(5, -0.01), (6, -5.0)], [(9, -0.75), (8, -0.70), (4, -4.0)], [(1, -0.1), (2, -2.5), (3, -9.0)]]


def test_a_baseline_reads_like_any_recorded_one():
    out = served_output([5, 8, 1], TOP, "p3")
    assert out.prompt_id == "p3" and out.token_ids == [5, 8, 1]
    assert out.top_ids[1] == [8, 9, 4] and out.top_logits[1] == [-0.70, -0.75, -4.0]  # best first
    assert served_output([5, 8], None).top_logits is None


def test_a_flip_at_a_near_tie_is_numerics_and_a_wide_margin_is_a_bug():
    base = served_output([5, 8, 1], TOP)
    assert classify(base, served_output([5, 8, 1]), "gguf", greedy=True).verdict == "identical"
    tie = classify(base, served_output([5, 9, 2]), "gguf", greedy=True)  # 8 vs 9: 0.05 apart
    assert (tie.verdict, tie.position, tie.target_token, tie.speculative_token) == ("near-tie", 1, 8, 9)
    assert tie.margin == pytest.approx(0.05) and tie.tolerance == TOLERANCE["gguf"]
    wide = classify(base, served_output([5, 8, 2]), "gguf", greedy=True)  # 1 vs 2: 2.4 apart
    assert wide.verdict == "bug" and wide.margin == pytest.approx(2.4)
    unseen = classify(base, served_output([7]), "gguf", greedy=True)  # not among the top log-probs
    assert unseen.verdict == "bug" and unseen.margin == pytest.approx(4.99)


def test_missing_log_probs_are_refused():
    with pytest.raises(ValueError, match="n_probs"):
        served_output([5, 8, 1], TOP[:2])
    with pytest.raises(ValueError, match="n_probs"):
        served_output([5, 8], [TOP[0], []])
