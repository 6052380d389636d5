"""Is the speculative output the target's? "Within hardware numerics", and we say which.

A (γ+1)-token verify forward sums in a different order than γ+1 single-token steps, so logits
differ by rounding noise. At greedy near-ties that noise can flip the argmax. We compare the
speculative output with the target alone; at the first divergence we read the target-alone logit
margin between its token and the speculative one. A margin within the dtype's noise tolerance is a
numerical near-tie; anything larger is a bug.

Tolerances (absolute, in logits) were set from measurement on the bundled Qwen2.5-Coder pair on
CPU (bench/numerics_noise.py): the largest |logit difference| between a 9-token verify forward and
the same positions decoded one token at a time. bf16 (7-bit mantissa, ~0.4% relative rounding on
logits of magnitude 10–30) showed noise up to ~0.23; fp16 has 3 more mantissa bits; fp32 showed
no noise at all on CPU (identical logits). Each tolerance is several times the observed maximum,
so a real near-tie is never called a bug, yet below the margins of ordinary greedy choices.
llama.cpp ("gguf": quantised weights, batched verify kernels differ from single-token ones) is held to
the bf16 tolerance; its margins are read from the target-alone run's top log-probs (a log-prob
difference is a logit difference).

No timed decode records top logits: the baseline then pays for nothing a speculative run does not, and its A/A twin
does the same work it does. Where a greedy output diverges, the sweep asks the engine for the target's top logits at
that one position (one forward over the prompt and the shared prefix: Runner.reference_at) and the margin is read
there; an output that never diverges costs nothing to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.records import Divergence, PromptOutput

TOLERANCE = {"bfloat16": 1.0, "float16": 0.25, "float32": 0.01, "gguf": 1.0}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


@dataclass(frozen=True)
class TargetTop:
    """The target's top-k logits (or log-probs: their differences are the same) at one position, best first."""

    values: list[float]
    ids: list[int]

    @classmethod
    def of_pairs(cls, pairs: Sequence[tuple[int, float]]) -> TargetTop | None:
        """From a server's (token id, log-prob) pairs in any order; None when there are none."""
        ranked = sorted(((int(t), float(v)) for t, v in pairs), key=lambda pair: -pair[1])
        if not ranked:
            return None
        return cls([v for _, v in ranked], [t for t, _ in ranked])


def scorable_divergence(baseline: PromptOutput, speculative: PromptOutput, greedy: bool) -> int | None:
    """The position where a greedy speculative output first leaves the target alone's while both still have a token
    there and the baseline recorded no top logits at it: where `classify` needs the target's top (reference_at)."""
    if not greedy:
        return None
    pos = first_divergence(baseline.token_ids, speculative.token_ids)
    if pos is None or pos >= len(baseline.token_ids) or pos >= len(speculative.token_ids):
        return None
    recorded = baseline.top_logits is not None and pos < len(baseline.top_logits)
    return None if recorded else pos


def _recorded_top(baseline: PromptOutput, pos: int) -> TargetTop | None:
    if baseline.top_logits is None or pos >= len(baseline.top_logits):
        return None
    ids = [int(x) for x in baseline.top_ids[pos]] if baseline.top_ids is not None else []
    return TargetTop([float(x) for x in baseline.top_logits[pos]], ids)


def classify(
    baseline: PromptOutput, speculative: PromptOutput, dtype: str, greedy: bool, top: TargetTop | None = None
) -> Divergence:
    """Compare a speculative output with the target alone, reading the margin at the first divergence from `top`
    (the target's top there, asked for on demand) or else from the top logits the baseline recorded."""
    pos = first_divergence(baseline.token_ids, speculative.token_ids)
    if pos is None:
        return Divergence(prompt_id=speculative.prompt_id, identical=True)
    if not greedy:
        return Divergence(prompt_id=speculative.prompt_id, identical=False, position=pos, verdict="not-applicable")
    tol = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
    scores = top if top is not None else _recorded_top(baseline, pos)
    if pos >= len(baseline.token_ids) or pos >= len(speculative.token_ids) or scores is None:
        # one stopped (EOS or length) where the other went on, or no top logits there: a choice we cannot score
        return Divergence(prompt_id=speculative.prompt_id, identical=False, position=pos, tolerance=tol, verdict="bug")
    target_token = baseline.token_ids[pos]
    spec_token = speculative.token_ids[pos]
    values, ids = scores.values, scores.ids
    chosen = values[ids.index(target_token)] if target_token in ids else values[0]
    if spec_token in ids:
        margin = chosen - values[ids.index(spec_token)]
    else:
        margin = chosen - values[-1]  # a lower bound: the speculative token is not even in the top-k
    verdict = "near-tie" if margin <= tol else "bug"
    return Divergence(
        prompt_id=speculative.prompt_id,
        identical=False,
        position=pos,
        target_token=target_token,
        speculative_token=spec_token,
        margin=round(margin, 6),
        tolerance=tol,
        verdict=verdict,
    )


def served_output(
    token_ids: Sequence[int], top_logprobs: Sequence[Sequence[tuple[int, float]]] | None = None, prompt_id: str = ""
) -> PromptOutput:
    """An output as `classify` reads it, from a server's tokens (llama-server, vLLM) and, for a target-alone
    baseline, their top log-probs (a log-prob difference is a logit difference, so margins read the same)."""
    ids = [int(t) for t in token_ids]
    out = PromptOutput(
        prompt_index=0,
        prompt_id=prompt_id,
        prompt_tokens=0,
        token_ids=ids,
        text="",
        from_draft=[],
        wall_time_s=0.0,
        steps=len(ids),
    )
    if top_logprobs is None:
        return out
    if len(top_logprobs) < len(ids):
        raise ValueError(f"{len(ids)} tokens but top log-probs for only {len(top_logprobs)}: ask for n_probs")
    rows = [sorted(((int(t), float(lp)) for t, lp in top), key=lambda x: -x[1]) for top in top_logprobs[: len(ids)]]
    if not all(rows):
        raise ValueError("a token without top log-probs: ask for n_probs > 0")
    out.top_logits = [[lp for _, lp in row] for row in rows]
    out.top_ids = [[t for t, _ in row] for row in rows]
    return out
