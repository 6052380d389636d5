"""Replay against live on the real bundled pair (Qwen2.5-Coder 1.5B target, 0.5B draft), few tokens.

In float32 at temperature 0: the best policies the replay finds (of different kinds) and the best fixed γ, run
for real in spectune's loop, give the target's own output and the tokens per target call the replay predicted
(goal: within 3%; measured: identical). In llama.cpp, a confidence stop mapped onto --spec-draft-p-min / n-min /
n-max, against the replay of llama.cpp's own output with llama.cpp's top-10 confidence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REAL_PROMPTS, greedy_config, real_pair

from engine.analysis.policy_replay import CostModel, compare_policies, replay
from engine.core.decoder import decode_prompt
from engine.core.policy import PolicyRun, parse_policy
from engine.drafts.model import ModelDraft
from engine.measure.agreement import draft_trace
from engine.session.sweep import encode_prompt

pytestmark = pytest.mark.real_model

PROMPTS = REAL_PROMPTS[:2]  # code (high α) and prose (lower α)
NEW_TOKENS = 24
GOAL = 0.03


@pytest.fixture(scope="module")
def recorded():
    target, draft = real_pair("float32")
    encoded = [encode_prompt(target.tokenizer, p, True) for p in PROMPTS]
    bases = [decode_prompt(target, None, ids, greedy_config(0, NEW_TOKENS))[0] for ids in encoded]
    source = ModelDraft(draft, target.vocab_size)
    traces = [draft_trace(source, ids, b.token_ids, NEW_TOKENS) for ids, b in zip(encoded, bases, strict=True)]
    return target, source, encoded, bases, traces


def test_replayed_tokens_per_call_match_live(recorded):
    target, source, encoded, bases, traces = recorded
    comparison = compare_policies(traces, CostModel(c=0.37))  # c as measured on this CPU (bench/README.md)
    picks = [r.policy for r in comparison.top(3)]
    if comparison.best_fixed.policy not in picks:
        picks.append(comparison.best_fixed.policy)
    for spec in picks:
        policy = parse_policy(spec)
        run = PolicyRun(policy)
        steps = tokens = 0
        for ids, base in zip(encoded, bases, strict=True):
            cfg = replace(greedy_config(policy.max_draft(), NEW_TOKENS), policy=policy)
            out, recs = decode_prompt(target, source, ids, cfg, policy_run=run)
            assert out.token_ids == base.token_ids, f"{spec}: not the target's output"
            steps, tokens = steps + len(recs), tokens + len(out.token_ids)
        live = tokens / steps
        predicted = replay(traces, policy).tokens_per_call
        assert abs(predicted / live - 1) <= GOAL, f"{spec}: replayed {predicted:.3f} vs live {live:.3f}"


def test_llamacpp_against_the_replay():
    """llama-server with the policy's flags, against the replay of llama.cpp's own target-alone output in llama.cpp's
    loop (replay(llamacpp=True): its draft sampler's top-10 p; the first token from the prompt's forward). A fixed γ
    replays llama.cpp's counters exactly; the confidence stop within 10%: llama.cpp's draft computes p with its
    quantized kernels, spectune's trace with the dequantized weights, so a p near the threshold can fall either
    side. Prompts whose speculative output is not llama.cpp's own target-alone output (a near-tie in its batched
    verify) are left out of the comparison."""
    from engine.llamacpp.binaries import llama_status
    from engine.service.policy_cli import llamacpp_live

    build, why = llama_status()
    if build is None:
        pytest.fail(f"llama-server is not installed: {why}")
    _, draft = real_pair("float32")
    base = llamacpp_live(None, PROMPTS, NEW_TOKENS, threads=2)
    source = ModelDraft(draft, draft.vocab_size)
    traces = [
        draft_trace(source, draft.tokenizer.encode(text), out, NEW_TOKENS)
        for text, out in zip(base["chat_prompts"], base["outputs"], strict=True)
    ]
    for spec, tolerance in (("fixed:4", GOAL), ("confidence:0.6:16:0", 0.10)):
        same = []
        for i, prompt in enumerate(PROMPTS):  # one prompt at a time: each one's counters on their own
            live = llamacpp_live(spec, [prompt], NEW_TOKENS, threads=2)
            if live["outputs"][0] == base["outputs"][i]:
                same.append((i, len(live["outputs"][0]), live["tokens_per_call"]))
        assert same, f"{spec}: llama.cpp never reproduced its own target-alone output"
        predicted = replay([traces[i] for i, _, _ in same], parse_policy(spec), llamacpp=True)
        measured = sum(n for _, n, _ in same) / sum(n / tpc for _, n, tpc in same)
        assert abs(predicted.tokens_per_call / measured - 1) <= tolerance, (spec, predicted.tokens_per_call, measured)
