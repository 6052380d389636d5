"""The decoding loop on tiny in-process models: exactness, rollback, records and the verify rule."""

from __future__ import annotations

import pytest
import torch

from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.proposal import NoDraft
from engine.core.sampling import SamplingConfig, probabilities
from engine.core.verify import verify
from engine.drafts.factory import make_draft
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.drafts.retokenize import RetokenizingDraft
from engine.measure.stats import per_position_acceptance
from engine.models.tiny import load_tiny

PROMPTS = ["hello world, this is", "the quick brown fox jumps", "abc abc abc abc ab"]


def greedy(gamma: int, n: int = 40) -> DecodeConfig:
    return DecodeConfig(gamma, SamplingConfig(0.0), n, stop_on_eos=False)


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("drafter", ["model", "ngram", "retokenize"])
def test_greedy_speculative_equals_target_alone(tiny_pair, gamma, drafter):
    target, draft = tiny_pair
    if drafter == "model":
        source = ModelDraft(draft, target.vocab_size)
    elif drafter == "ngram":
        source = NgramDraft()
    else:  # a draft with another vocabulary: proposals cross over as text
        other = load_tiny("tiny:5:40:1:32")
        source = RetokenizingDraft(other, target.tokenizer)
    for text in PROMPTS:
        ids = target.tokenizer.encode(text)
        base, _ = decode_prompt(target, None, ids, greedy(0))
        out, steps = decode_prompt(target, source, ids, greedy(gamma))
        assert out.token_ids == base.token_ids, f"{drafter} γ={gamma} diverged on {text!r}"
        assert len(out.token_ids) == 40
        assert sum(s.emitted for s in steps) == 40
        assert all(s.gamma <= gamma for s in steps)


def test_model_draft_accepts_and_records_steps(tiny_pair):
    target, draft = tiny_pair
    ids = target.tokenizer.encode(PROMPTS[0])
    out, steps = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids, greedy(4, 60))
    accepted = sum(s.accepted for s in steps)
    assert accepted > 10, "a noisy copy of the target should be accepted often"
    assert len(steps) < 60, "speculation must save target calls"
    for s in steps:
        assert s.emitted == s.accepted + 1 or s.emitted < s.accepted + 1  # truncated only at the end
        assert len(s.accept_mask) == min(s.gamma, s.accepted + 1)
        assert s.accept_mask[: s.accepted] == [True] * s.accepted
        assert len(s.beta) == len(s.accept_mask)
        assert s.draft_forwards == s.gamma
        assert s.verify_time_s > 0
    flags = [f for s in steps for f in s.from_draft]
    assert flags == out.from_draft and sum(flags) == accepted
    rates = per_position_acceptance(steps)
    assert len(rates) == 4 and all(0 <= r <= 1 for r in rates)


def test_kv_cache_rolled_back_after_rejections(tiny_pair):
    """After each step the target cache must hold exactly the sequence minus its last token."""
    target, draft = tiny_pair
    ids = target.tokenizer.encode(PROMPTS[1])
    seen = []

    source = ModelDraft(draft, target.vocab_size)
    original_commit = source.commit

    def commit(n_valid: int) -> None:
        original_commit(n_valid)
        seen.append((n_valid, source.cache.get_seq_length()))

    source.commit = commit
    out, steps = decode_prompt(target, source, ids, greedy(5, 50))
    assert any(s.accepted < s.gamma for s in steps), "the test needs at least one rejection"
    for n_valid, draft_len in seen:
        assert draft_len <= n_valid


def test_eos_stops_and_max_new_tokens_is_exact(tiny_pair):
    target, draft = tiny_pair
    ids = target.tokenizer.encode(PROMPTS[0])
    for n in (1, 2, 7):
        out, steps = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids, greedy(8, n))
        assert len(out.token_ids) == n
    eos_cfg = DecodeConfig(3, SamplingConfig(0.0), 200, stop_on_eos=True)
    out, _ = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids, eos_cfg)
    base, _ = decode_prompt(target, None, ids, DecodeConfig(0, SamplingConfig(0.0), 200, stop_on_eos=True))
    assert out.token_ids == base.token_ids
    if 1 in base.token_ids:
        assert base.token_ids[-1] == 1 and base.token_ids.count(1) == 1


def test_baseline_is_the_same_loop_with_gamma_zero(tiny_pair):
    target, _ = tiny_pair
    ids = target.tokenizer.encode(PROMPTS[2])
    out, steps = decode_prompt(target, NoDraft(), ids, greedy(4, 20))
    assert all(s.gamma == 0 and s.emitted == 1 and s.draft_forwards == 0 for s in steps)
    assert len(steps) == 20
    # the same tokens as straightforward argmax decoding with a full recompute each step
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(20):
            logits = target.model(input_ids=torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
    assert out.token_ids == seq[len(ids) :]


def test_ngram_lookup_proposes_what_followed():
    ngram = NgramDraft(max_ngram=2)
    assert ngram.lookup([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert ngram.lookup([1, 2, 3], 2) == []
    assert ngram.lookup([9, 9, 9], 2) == [9]


def test_verify_greedy_rule():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    cfg = SamplingConfig(0.0)
    v = verify(logits, [1, 0], None, cfg, None)
    assert (v.accepted, v.next_token, v.accept_mask, v.beta) == (2, 2, [True, True], [1.0, 1.0])
    v = verify(logits, [1, 2], None, cfg, None)
    assert (v.accepted, v.next_token, v.accept_mask, v.beta) == (1, 0, [True, False], [1.0, 0.0])


def test_verify_beta_is_overlap_of_p_and_q():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]))
    q = torch.tensor([[0.2, 0.6, 0.2]])
    cfg = SamplingConfig(1.0)
    gen = torch.Generator().manual_seed(0)
    v = verify(logits, [1], q, cfg, gen)
    assert v.beta[0] == pytest.approx(0.2 + 0.3 + 0.2)
    # a one-hot proposal: β is p(x)
    v = verify(logits, [0], None, cfg, gen)
    assert v.beta[0] == pytest.approx(0.5)


def test_top_k_top_p_applied_identically():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    p = probabilities(logits, SamplingConfig(1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and p.sum() == pytest.approx(1.0)
    p = probabilities(logits, SamplingConfig(1.0, top_p=0.5))
    assert (p[0] > 0).sum() == 1
    p = probabilities(logits, SamplingConfig(0.7, top_p=0.9))
    assert p.sum() == pytest.approx(1.0)


def test_make_draft_chooses_the_right_source(tiny_pair):
    target, _ = tiny_pair

    def loader(ref):
        return load_tiny(ref)

    assert isinstance(make_draft("none", target, loader), NoDraft)
    assert isinstance(make_draft("ngram", target, loader), NgramDraft)
    spec = make_draft("ngram:2-4", target, loader)
    assert (spec.min_ngram, spec.max_ngram) == (2, 4)
    assert isinstance(make_draft("tiny:3:48:1:32", target, loader), ModelDraft)
    assert isinstance(make_draft("tiny:3:40:1:32", target, loader), RetokenizingDraft)
