"""fp32 exactness on the real bundled pair (Qwen2.5-Coder 1.5B target, 0.5B draft).

Speculative output token-for-token identical to the target alone, with the draft model, with
n-gram lookup and with a draft of another tokenizer, for γ in {1, 3, 8}.
"""

from __future__ import annotations

import pytest
from conftest import REAL_PROMPTS, greedy_config, real_pair

from engine.core.decoder import decode_prompt
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.drafts.retokenize import RetokenizingDraft
from engine.models.chat import encode_prompt
from engine.models.pool import ModelPool

pytestmark = pytest.mark.real_model

PROMPTS = REAL_PROMPTS
NEW_TOKENS = 16


def greedy(gamma: int, record: int = 0):
    return greedy_config(gamma, NEW_TOKENS, record)


@pytest.fixture(scope="module")
def fp32():
    target, draft = real_pair("float32")
    encoded = [encode_prompt(target.tokenizer, p, True) for p in PROMPTS]
    baselines = [decode_prompt(target, None, ids, greedy(0, 16))[0] for ids in encoded]
    return target, draft, encoded, baselines


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_fp32_draft_model_is_exact(fp32, gamma):
    target, draft, encoded, baselines = fp32
    source = ModelDraft(draft, target.vocab_size)
    accepted = 0
    for ids, base in zip(encoded, baselines, strict=True):
        out, steps = decode_prompt(target, source, ids, greedy(gamma))
        assert out.token_ids == base.token_ids, f"γ={gamma}: {out.text!r} != {base.text!r}"
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_fp32_ngram_is_exact(fp32, gamma):
    target, _, encoded, baselines = fp32
    for ids, base in list(zip(encoded, baselines, strict=True))[::2]:  # 2 prompts: n-gram steps cost ~1 call/token
        out, _ = decode_prompt(target, NgramDraft(), ids, greedy(gamma))
        assert out.token_ids == base.token_ids


def test_fp32_different_tokenizer_draft_is_exact(fp32):
    """SmolLM2-135M drafts for Qwen by re-tokenising text; the output must still be the target's."""
    target, _, encoded, baselines = fp32
    smol = ModelPool().get("smollm2-135m", "float32")
    source = RetokenizingDraft(smol, target.tokenizer)
    out, steps = decode_prompt(target, source, encoded[0], greedy(3))
    assert out.token_ids == baselines[0].token_ids
    assert all(s.gamma <= 3 for s in steps)
