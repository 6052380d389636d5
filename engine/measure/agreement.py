"""Agreement runs: the whole γ curve from one measurement; and the draft's trace every policy replays from.

At temperature 0 a draft proposing from position t of the target's output keeps agreeing exactly
as long as its teacher-forced argmax matches the target's tokens (its context is then identical).
So one teacher-forced draft forward over prompt + target output gives, at every position, the
number of consecutive draft tokens that would be accepted, for every γ at once.

`draft_trace` records, from the same pass, what a speculation policy (engine.core.policy) also needs:
the draft's confidence at every position (its largest probability, and llama.cpp's version of it over
the top 10 candidates), and past each first mismatch the draft's own continuation (its confidence in the
tokens it would draft after its wrong token), so the replay knows how many draft calls a confidence stop
spends. Optionally β per position at temperatures > 0 (the target's teacher-forced distribution against
the draft's). A draft kind that `replays` (engine.drafts.kinds: its proposals are a function of the context, as
n-gram lookup's are) is traced by asking it at every position. engine.analysis.policy_replay reads the trace; its
layout is TRACE_VERSION below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.core.kvcache import crop_to, forward_step, new_cache
from engine.core.model import LoadedModel
from engine.core.policy import MAX_DRAFT
from engine.core.proposal import DraftSource, matching_run
from engine.core.sampling import SamplingConfig, probabilities
from engine.drafts.kinds import kind_of_method

TRACE_VERSION = 1
LLAMACPP_TOP_K = 10  # llama.cpp's draft sampler keeps the top 10 candidates; its p-min compares their softmax
CONTINUATION_CAP = 8  # draft tokens kept past a mismatch: draft calls exact for n-max ≤ 9, and n-min ≤ 9
CONFIDENCE_FLOOR = 0.1  # a continuation ends at a token this unsure (every p-min ≥ 0.1 stops there)
GREEDY = SamplingConfig(0.0)
_DIGITS = 6


def runs_from_matches(matches: list[bool], cap: int) -> list[int]:
    """run[t] = number of consecutive True values from t (capped)."""
    runs = [0] * len(matches)
    following = 0
    for t in range(len(matches) - 1, -1, -1):
        following = following + 1 if matches[t] else 0
        runs[t] = min(following, cap)
    return runs


def _lookups(draft: DraftSource, prompt_ids: list[int], output_ids: list[int], cap: int) -> list[list[int]]:
    """What a draft whose proposals are a function of the context proposes (up to `cap` tokens, greedy) at each
    position of the target's output."""
    proposals, context = [], list(prompt_ids)
    draft.start(list(prompt_ids))
    for token in output_ids:
        proposals.append(draft.propose(context, cap, GREEDY, None).tokens[:cap])
        context.append(token)
    return proposals


def _lookup_runs(proposals: list[list[int]], output_ids: list[int]) -> list[int]:
    return [matching_run(proposal, output_ids[t:]) for t, proposal in enumerate(proposals)]


def _teacher_forced(draft: DraftSource) -> LoadedModel | None:
    """The model whose teacher-forced forward gives the draft's proposals (a draft model), or None."""
    return getattr(draft, "teacher_forced", None)


@torch.inference_mode()
def agreement_runs(draft: DraftSource, prompt_ids: list[int], output_ids: list[int], cap: int = 32) -> list[int]:
    """Per output position, how many draft tokens from there match the target's greedy output."""
    if not output_ids:
        return []
    model = _teacher_forced(draft)
    if model is not None:
        context = list(prompt_ids) + list(output_ids)
        logits = forward_step(model, context[:-1], new_cache(model.model.config), len(output_ids))
        predicted = logits.argmax(-1).tolist()
        return runs_from_matches([p == o for p, o in zip(predicted, output_ids, strict=True)], cap)
    if kind_of_method(draft.method).replays:
        return _lookup_runs(_lookups(draft, prompt_ids, output_ids, cap), output_ids)
    return []


def _confidences(logits: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per row: the largest softmax probability, and the largest over the top-10 logits (llama.cpp's p)."""
    logits = logits.detach().float()
    full = torch.softmax(logits, -1).max(-1).values
    top = torch.topk(logits, min(LLAMACPP_TOP_K, logits.shape[-1]), dim=-1).values
    top10 = torch.softmax(top, -1)[..., 0]
    return [round(float(x), _DIGITS) for x in full], [round(float(x), _DIGITS) for x in top10]


def _beta(target_logits: torch.Tensor, draft_logits: torch.Tensor, cfg: SamplingConfig, vocab: int) -> list[float]:
    p = probabilities(target_logits, cfg)
    q = probabilities(draft_logits, cfg)
    v = min(p.shape[-1], q.shape[-1], vocab)
    return [round(float(x), _DIGITS) for x in torch.minimum(p[:, :v], q[:, :v]).sum(-1)]


@torch.inference_mode()
def _continuations(
    model: LoadedModel, cache: Any, n_prompt: int, predicted: list[int], rooms: dict[int, int], floor: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """For each wrong position m (its room: how many tokens a step starting there may still draft), the draft's
    confidence (full and top-10) in each token it would draft next from its own wrong token, until one is below
    `floor` (recorded, then stop) or the room is used up."""
    cont: dict[str, list[float]] = {}
    cont10: dict[str, list[float]] = {}
    # descending, so the cache is only ever cropped back: prompt + output[:m], then the draft's own tokens
    for m in sorted(rooms, reverse=True):
        if rooms[m] <= 0:
            continue
        crop_to(cache, n_prompt + m)
        token, values, values10 = predicted[m], [], []
        for _ in range(rooms[m]):
            step = forward_step(model, [token], cache, 1)
            full, top = _confidences(step)
            values.append(full[0])
            values10.append(top[0])
            if top[0] < floor:  # top-10 p ≥ full p: both definitions stop here for any p-min ≥ floor
                break
            token = int(step[0].argmax())
        cont[str(m)], cont10[str(m)] = values, values10
    return cont, cont10


def draft_trace(
    draft: DraftSource,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    max_new_tokens: int | None = None,
    cap: int = MAX_DRAFT,
    continuation: int = CONTINUATION_CAP,
    floor: float = CONFIDENCE_FLOOR,
    target: LoadedModel | None = None,
    samplings: Sequence[SamplingConfig] = (),
) -> dict[str, Any]:
    """One prompt's trace for the policy replay (JSON-ready; keys described in the module docstring).

    A draft model: `runs`, `confidence` and `confidence_top10` per output position (teacher-forced: the draft
    sees the target's tokens); `continuation[m]` / `continuation_top10[m]` for each position m where the draft's
    token is wrong: its confidence in each token it would draft next from its own wrong token, until one is
    below `floor` (recorded, then stop) or `continuation` tokens, whichever first (only as far as a step could
    draft before max_new_tokens). With `target` and sampling configs at temperature > 0: `beta[str(T)]`, the
    acceptance probability Σ min(p, q) per position. N-gram lookup: `runs` and `proposable` (how many tokens
    the lookup has at each position; a step drafts min(γ, proposable)). A draft with a `trace` of its own gives its
    fields; suffix decoding's are the same two, from the draft's cache as it stands (this request is then learnt
    into it: call it on a run's prompts in their order), plus `order` (requests before this one in the cache),
    `cached_before` (responses cached when it began; 0: cold) and `gamma_exceptions`
    (engine.drafts.suffix.gamma_exceptions: where a step allowed γ ≤ 16 tokens drafts other than the first γ of the
    cap's draft). Other drafts: an empty trace."""
    output_ids = list(output_ids)
    n_out = len(output_ids)
    max_new = int(max_new_tokens) if max_new_tokens is not None else n_out
    trace: dict[str, Any] = {"version": TRACE_VERSION, "tokens": n_out, "max_new_tokens": max_new, "runs": []}
    if not output_ids:
        return trace
    own_trace = getattr(draft, "trace", None)
    if own_trace is not None:
        return trace | own_trace(prompt_ids, output_ids, cap)
    if kind_of_method(draft.method).replays:
        proposals = _lookups(draft, list(prompt_ids), output_ids, cap)
        trace |= {
            "method": draft.method,
            "runs": _lookup_runs(proposals, output_ids),
            "proposable": [len(p) for p in proposals],
        }
        return trace
    model = _teacher_forced(draft)
    if model is None:
        trace["method"] = "unsupported"
        return trace
    context = list(prompt_ids) + output_ids
    n_prompt = len(prompt_ids)
    cache = new_cache(model.model.config)
    logits = forward_step(model, context[:-1], cache, n_out)
    predicted = logits.argmax(-1).tolist()
    matches = [p == o for p, o in zip(predicted, output_ids, strict=True)]
    conf, conf10 = _confidences(logits)
    trace |= {
        "method": "draft_model",
        "runs": runs_from_matches(matches, cap),
        "confidence": conf,
        "confidence_top10": conf10,
        "continuation_cap": continuation,
        "floor": floor,
    }
    rooms = {m: min(continuation, max_new - m - 2) for m in range(n_out)}  # what a step from m may still draft
    trace["continuation"], trace["continuation_top10"] = _continuations(
        model, cache, n_prompt, predicted, {m: room for m, room in rooms.items() if not matches[m]}, floor
    )
    hot = [cfg for cfg in samplings if not cfg.greedy]
    if target is not None and hot:
        target_logits = forward_step(target, context[:-1], new_cache(target.model.config), n_out)
        trace["beta"] = {f"{cfg.temperature:g}": _beta(target_logits, logits, cfg, target.vocab_size) for cfg in hot}
    return trace
