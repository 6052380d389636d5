"""Replay against live on the real bundled pair (Qwen2.5-Coder 1.5B target, 0.5B draft), few tokens.

In float32 at temperature 0: the best policies the replay finds (of different kinds) and the best fixed γ, run
for real in spectune's loop, give the target's own output and the tokens per target call the replay predicted
(goal: within 3%; measured: identical). In llama.cpp, a fixed γ and a confidence stop mapped onto
--spec-draft-p-min / n-min / n-max, against the replay (llama.cpp's loop, its top-10 confidence) along the very text
each speculative run produced; each speculative output is the target-alone output, or leaves it at a near-tie.

The llama.cpp comparison holds on every CPU: a batched verify rounds differently from single-token forwards in
the quantized kernels (on an AVX2-only EPYC greedy near-ties flip on every prompt), so it never needs the
speculative output to equal the target alone. Its power stays: a divergence that is not a near-tie fails, a
prediction off the counters fails, and nothing compared fails. The unit tests at the end simulate that CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import conftest
import pytest
import torch
from conftest import REAL_PROMPTS, greedy_config, real_pair

from engine.analysis.policy_replay import CostModel, compare_policies, replay, trace_usable
from engine.core.decoder import decode_prompt
from engine.core.policy import PolicyRun, parse_policy
from engine.core.records import Divergence, PromptOutput
from engine.drafts.model import ModelDraft
from engine.engines import registry
from engine.measure.agreement import draft_trace
from engine.measure.fidelity import classify, served_output
from engine.models.chat import encode_prompt

PROMPTS = REAL_PROMPTS[:2]  # code (high α) and prose (lower α)
NEW_TOKENS = 24
GOAL = 0.03
TOP_LOGPROBS = 10  # the target-alone run's top log-probs per token: the margin at a divergence

real_model = pytest.mark.real_model


@pytest.fixture(scope="module")
def recorded():
    target, draft = real_pair("float32")
    encoded = [encode_prompt(target.tokenizer, p, True) for p in PROMPTS]
    bases = [decode_prompt(target, None, ids, greedy_config(0, NEW_TOKENS))[0] for ids in encoded]
    source = ModelDraft(draft, target.vocab_size)
    traces = [draft_trace(source, ids, b.token_ids, NEW_TOKENS) for ids, b in zip(encoded, bases, strict=True)]
    return target, source, encoded, bases, traces


@real_model
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


def check_against_replay(
    spec: str,
    tolerance: float,
    baselines: Sequence[PromptOutput],
    lives: Sequence[tuple[list[int], float | None]],
    trace_along: Callable[[int, list[int]], Mapping[str, Any]],
) -> tuple[list[Divergence], float, float]:
    """llama.cpp's speculative runs of one policy against its target-alone runs and against the replay.

    `baselines`: per prompt, the target-alone output with its top log-probs (fidelity.served_output); `lives`:
    per prompt, the speculative run's output token ids and its tokens per target call (the server's counters);
    `trace_along(i, ids)`: the draft's trace along prompt i's chat prompt followed by `ids`.

    1. Each speculative output is the target-alone output, or leaves it first where the target alone had a near-tie
       (fidelity.classify: margin within the gguf tolerance, read from the baseline's top log-probs): the batched
       verify rounding otherwise than single-token forwards. A divergence past the tolerance is a bug: it fails.
    2. The replay in llama.cpp's loop, along the text each speculative run produced (the target's verified tokens,
       so the same acceptances step for step wherever the text left the target-alone one), predicts the counters'
       tokens per target call within `tolerance`, over every prompt and every token: nothing is left out.

    Returns the verdicts, the replayed and the measured tokens per target call."""
    assert lives, f"{spec}: nothing compared: no speculative run"
    assert len(lives) == len(baselines), f"{spec}: {len(lives)} speculative runs for {len(baselines)} baselines"
    empty = [i for i, (ids, tpc) in enumerate(lives) if not ids or not tpc]
    assert not empty, f"{spec}: nothing compared on prompts {empty} (no tokens or no counters)"
    verdicts = [
        classify(base, served_output(ids, prompt_id=base.prompt_id), "gguf", greedy=True)
        for base, (ids, _) in zip(baselines, lives, strict=True)
    ]
    bugs = [d for d in verdicts if d.verdict not in ("identical", "near-tie")]
    assert not bugs, f"{spec}: the speculative output leaves the target alone where it is not a near-tie: {bugs}"
    traces = [trace_along(i, list(ids)) for i, (ids, _) in enumerate(lives)]
    unusable = [i for i, t in enumerate(traces) if not trace_usable(t) or t["tokens"] != len(lives[i][0])]
    assert not unusable, f"{spec}: no draft trace along the speculative output of prompts {unusable}"
    tokens = sum(len(ids) for ids, _ in lives)
    predicted = replay(traces, parse_policy(spec), loop=registry.drafting_loop("llama.cpp"))
    assert predicted.tokens == tokens, (spec, predicted.tokens, tokens)
    measured = tokens / sum(len(ids) / tpc for ids, tpc in lives)
    diverged = [(d.prompt_id, d.position, d.margin) for d in verdicts if not d.identical]
    assert abs(predicted.tokens_per_call / measured - 1) <= tolerance, (
        f"{spec}: replayed {predicted.tokens_per_call:.3f} tokens per target call, llama.cpp's counters "
        f"{measured:.3f} (tolerance {tolerance:.0%}; near-ties (prompt, position, margin): {diverged})"
    )
    return verdicts, predicted.tokens_per_call, measured


def _llamacpp_baselines(prompts: Sequence[str], n_predict: int, threads: int) -> tuple[list[str], list[PromptOutput]]:
    """The target alone in llama-server (as llamacpp_live(None, ...) runs it), with its top log-probs per token."""
    from engine.engines.llamacpp import client
    from engine.engines.llamacpp.server import ManagedServer, ServerConfig
    from engine.models.bundled import gguf_for

    with ManagedServer(ServerConfig(gguf_for("qwen2.5-coder-1.5b", "target"), threads=threads)) as server:
        texts = [client.chat_prompt(server.url, p) for p in prompts]
        done = [client.complete(server.url, text, n_predict, n_probs=TOP_LOGPROBS) for text in texts]
    return texts, [served_output(c.token_ids, c.top_logprobs, f"p{i}") for i, c in enumerate(done)]


def _float32_draft():
    """The bundled 0.5B draft in float32: the loaded pair's, else the draft alone (this comparison needs no target)."""
    if "float32" in conftest._REAL:
        return conftest._REAL["float32"][1]
    from engine.models.pool import ModelPool

    return ModelPool().get("qwen2.5-coder-0.5b", "float32")


@real_model
def test_llamacpp_against_the_replay():
    """llama-server with the policy's flags, against the replay along each speculative run's own output in llama.cpp's
    drafting loop (its draft sampler's top-10 p; the first token from the prompt's forward). A fixed γ replays
    llama.cpp's counters within 3%; the confidence stop within 10%: llama.cpp's draft computes p with its quantized
    kernels, spectune's trace with the dequantized weights, so a p near the threshold can fall either side. Every
    prompt is compared: see check_against_replay."""
    from engine.engines.llamacpp.binaries import llama_status
    from engine.service.decide.llamacpp_live import llamacpp_live

    build, why = llama_status()
    if build is None:
        pytest.fail(f"llama-server is not installed: {why}")
    draft = _float32_draft()
    chat, baselines = _llamacpp_baselines(PROMPTS, NEW_TOKENS, threads=2)
    source = ModelDraft(draft, draft.vocab_size)
    prompt_ids = [draft.tokenizer.encode(text) for text in chat]
    traces: dict[tuple[int, tuple[int, ...]], Mapping[str, Any]] = {}

    def trace_along(i: int, ids: list[int]) -> Mapping[str, Any]:
        key = (i, tuple(ids))
        if key not in traces:
            traces[key] = draft_trace(source, prompt_ids[i], ids, NEW_TOKENS)
        return traces[key]

    for spec, tolerance in (("fixed:4", GOAL), ("confidence:0.6:16:0", 0.10)):
        lives = []
        for i, prompt in enumerate(PROMPTS):  # one prompt at a time: each one's counters on their own
            live = llamacpp_live(spec, [prompt], NEW_TOKENS, threads=2)
            assert live["chat_prompts"][0] == chat[i], f"{spec}: another chat prompt than the baseline's"
            lives.append((live["outputs"][0], live["tokens_per_call"]))
        verdicts, predicted, measured = check_against_replay(spec, tolerance, baselines, lives, trace_along)
        shown = [(d.prompt_id, d.verdict, d.position, d.margin) for d in verdicts]
        print(f"{spec}: replayed {predicted:.3f}, llama.cpp {measured:.3f} tokens per target call; {shown}")  # -rA


# --- the comparison on a CPU whose batched verify flips near-ties (the AVX2-only EPYC), simulated -----------------
#
# The tiny pair stands in for the models; llama.cpp's loop with a fixed γ is simulated step by step (greedy draft
# proposals, the matching prefix accepted plus the target's token) along the text the speculative run produced,
# which leaves the target-alone text at one position k.

SIM_TOKENS = 16
SIM_K = 5


def _llamacpp_loop(draft, prompt_ids: list[int], output_ids: list[int], gamma: int, n_predict: int) -> float:
    """Tokens per target call of llama-server's loop with a fixed γ that produced `output_ids`: the first token from
    the prompt's forward (a call), then per call up to γ greedy draft tokens (no further than n_predict − 1), the
    ones matching the output accepted, plus the target's own token."""
    calls, t, n = 1, 1, len(output_ids)
    with torch.inference_mode():
        while t < n:
            proposal: list[int] = []
            for _ in range(max(0, min(gamma, n_predict - t - 1))):
                ids = torch.tensor([prompt_ids + output_ids[:t] + proposal])
                proposal.append(int(draft.model(input_ids=ids).logits[0, -1].argmax()))
            accepted = 0
            while accepted < len(proposal) and t + accepted < n and proposal[accepted] == output_ids[t + accepted]:
                accepted += 1
            calls += 1
            t += min(accepted + 1, n - t)
    return n / calls


def _top_logprobs(ids: list[int], k: int, spec_token: int, margin: float) -> list[list[tuple[int, float]]]:
    """Top log-probs of a target-alone output: sure everywhere, and at k its token `margin` above `spec_token`."""
    rows = [[(tok, -0.05), ((tok + 1) % 40 + 2, -3.5)] for tok in ids]
    rows[k] = [(ids[k], -0.6), (spec_token, -0.6 - margin), ((spec_token + 1) % 40 + 2, -6.0)]
    return rows


@pytest.fixture(scope="module")
def simulated(tiny_pair):
    """Two prompts: the first's speculative run gives the target-alone text, the second's leaves it at SIM_K (its
    target continues greedily after the flipped token)."""
    target, draft = tiny_pair
    prompts = [target.tokenizer.encode(text) for text in ("def is_prime(n):", "a hash map is")]
    bases = [decode_prompt(target, None, p, greedy_config(0, SIM_TOKENS))[0].token_ids for p in prompts]
    b = bases[1]
    flipped = next(t for t in range(2, target.vocab_size) if t != b[SIM_K])
    context = prompts[1] + b[:SIM_K] + [flipped]
    rest = decode_prompt(target, None, context, greedy_config(0, SIM_TOKENS - SIM_K - 1))[0].token_ids
    lives = [bases[0], b[:SIM_K] + [flipped] + rest]
    source = ModelDraft(draft, target.vocab_size)

    def trace_along(i: int, ids: list[int]) -> Mapping[str, Any]:
        return draft_trace(source, prompts[i], ids, SIM_TOKENS)

    counters = [_llamacpp_loop(draft, p, out, 4, SIM_TOKENS) for p, out in zip(prompts, lives, strict=True)]
    return prompts, bases, lives, flipped, counters, trace_along


def _baselines(bases: list[list[int]], flipped: int, margin: float) -> list[PromptOutput]:
    sure = [[(tok, -0.05)] for tok in bases[0]]
    diverging = _top_logprobs(bases[1], SIM_K, flipped, margin)
    return [served_output(bases[0], sure, "p0"), served_output(bases[1], diverging, "p1")]


def test_simulated_near_tie_divergence_is_compared_along_the_speculative_output(simulated):
    prompts, bases, lives, flipped, counters, trace_along = simulated
    assert lives[1] != bases[1]  # the comparison before this fix left the prompt out (and failed with none left)
    baselines = _baselines(bases, flipped, 0.05)
    verdicts, predicted, measured = check_against_replay(
        "fixed:4", GOAL, baselines, list(zip(lives, counters, strict=True)), trace_along
    )
    assert predicted == pytest.approx(measured)  # the replay along the speculative output is llama.cpp's loop
    assert [d.verdict for d in verdicts] == ["identical", "near-tie"]
    assert (verdicts[1].position, verdicts[1].speculative_token, verdicts[1].margin) == (SIM_K, flipped, 0.05)


def test_simulated_large_margin_divergence_fails(simulated):
    prompts, bases, lives, flipped, counters, trace_along = simulated
    with pytest.raises(AssertionError, match="not a near-tie"):
        check_against_replay(
            "fixed:4", GOAL, _baselines(bases, flipped, 5.0), list(zip(lives, counters, strict=True)), trace_along
        )


def test_simulated_counters_off_the_replay_fail(simulated):
    prompts, bases, lives, flipped, counters, trace_along = simulated
    off = [(ids, tpc * 1.05) for ids, tpc in zip(lives, counters, strict=True)]
    with pytest.raises(AssertionError, match="replayed"):
        check_against_replay("fixed:4", GOAL, _baselines(bases, flipped, 0.05), off, trace_along)


def test_simulated_nothing_compared_fails(simulated):
    prompts, bases, lives, flipped, counters, trace_along = simulated
    baselines = _baselines(bases, flipped, 0.05)
    with pytest.raises(AssertionError, match="nothing compared"):
        check_against_replay("fixed:4", GOAL, [], [], trace_along)
    with pytest.raises(AssertionError, match="nothing compared"):
        check_against_replay("fixed:4", GOAL, baselines, [(lives[0], counters[0]), ([], None)], trace_along)
