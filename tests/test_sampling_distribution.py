"""At temperature > 0 the speculative output distribution is exactly the target's.

A tiny target/draft pair with an 8-token vocabulary: the exact joint distribution of the first two
output tokens is computed from the target's own softmax, and a chi-square goodness-of-fit test is
run on speculative samples. The same test must reject a deliberately wrong acceptance rule.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import engine.core.decoder as decoder
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.sampling import SamplingConfig, probabilities, sample
from engine.core.verify import Verdict
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.models.tiny import load_tiny

N_SAMPLES = 2500
CFG = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def pair():
    target = load_tiny("tiny:11:8:1:16", logit_scale=3.0)
    draft = load_tiny("tiny:12:8:1:16", logit_scale=3.0)  # unrelated: q differs a lot from p
    return target, draft


def exact_joint(target, prompt_ids, cfg: SamplingConfig) -> np.ndarray:
    v = target.vocab_size
    joint = np.zeros((v, v))
    with torch.inference_mode():
        p1 = probabilities(target.model(input_ids=torch.tensor([prompt_ids])).logits[0, -1], cfg)
        for a in range(v):
            logits = target.model(input_ids=torch.tensor([prompt_ids + [a]])).logits[0, -1]
            joint[a] = p1[a].item() * probabilities(logits, cfg).numpy()
    return joint


def sampled_joint(target, source, prompt_ids, gamma: int, cfg: SamplingConfig) -> np.ndarray:
    v = target.vocab_size
    counts = np.zeros((v, v))
    for seed in range(N_SAMPLES):
        out, _ = decode_prompt(target, source, prompt_ids, DecodeConfig(gamma, cfg, 2, seed=seed, stop_on_eos=False))
        counts[out.token_ids[0], out.token_ids[1]] += 1
    return counts


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    expected = expected_probs.ravel() / expected_probs.sum() * counts.sum()
    observed = counts.ravel()
    keep = expected >= 5  # pool the rare cells so the chi-square approximation holds
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()  # float32 softmax sums are 1 only to ~1e-7
    return float(chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def prompt_and_joint(pair):
    target, _ = pair
    ids = target.tokenizer.encode("abcab")
    return ids, exact_joint(target, ids, CFG)


def test_draft_model_samples_follow_target_distribution(pair, prompt_and_joint):
    target, draft = pair
    ids, joint = prompt_and_joint
    counts = sampled_joint(target, ModelDraft(draft, target.vocab_size), ids, 2, CFG)
    assert chi_square_p(counts, joint) > 1e-3


def test_one_hot_proposals_follow_target_distribution(pair, prompt_and_joint):
    """Deterministic proposals (n-gram, re-tokenised drafts) use a one-hot q: still exact."""
    target, _ = pair
    ids, joint = prompt_and_joint
    counts = sampled_joint(target, NgramDraft(max_ngram=2), ids, 2, CFG)
    assert chi_square_p(counts, joint) > 1e-3


def test_wrong_acceptance_rule_is_detected(pair, prompt_and_joint, monkeypatch):
    """Resampling from p (instead of norm(max(0, p − q))) after a rejection biases towards q."""
    target, draft = pair
    ids, joint = prompt_and_joint

    def naive_verify(logits, drafted, q, cfg, gen):
        p = probabilities(logits, cfg)
        mask, beta = [], []
        for i, token in enumerate(drafted):
            q_x = float(q[i][token]) if q is not None else 1.0
            r = float(torch.rand((), generator=gen))
            if r * q_x < float(p[i][token]):
                mask.append(True)
                beta.append(1.0)
                continue
            mask.append(False)
            beta.append(0.0)
            return Verdict(i, sample(p[i], gen), mask, beta)
        return Verdict(len(drafted), sample(p[len(drafted)], gen), mask, beta)

    monkeypatch.setattr(decoder, "verify", naive_verify)
    counts = sampled_joint(target, ModelDraft(draft, target.vocab_size), ids, 2, CFG)
    assert chi_square_p(counts, joint) < 1e-6


def test_top_k_sampling_also_exact(pair):
    target, draft = pair
    cfg = SamplingConfig(temperature=0.8, top_k=4, top_p=0.95)
    ids = target.tokenizer.encode("bca")
    joint = exact_joint(target, ids, cfg)
    counts = sampled_joint(target, ModelDraft(draft, target.vocab_size), ids, 3, cfg)
    assert chi_square_p(counts, joint) > 1e-3
