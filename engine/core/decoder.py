"""The speculative decoding loop (after gpt-fast's generate.py), with every step recorded.

Invariant: the target's KV cache holds every token of the sequence except the last one. A step
feeds [last token, d1..dγ] in one forward, reads γ+1 next-token distributions, keeps the longest
accepted prefix plus one corrected or bonus token, and crops the cache back to the new invariant.
γ = 0 (NoDraft) is plain autoregressive decoding through the very same code: the baseline.
How many tokens a step drafts is its speculation policy's call (engine.core.policy: how many, an early stop on the
draft's confidence, what was accepted); a DecodeConfig without one drafts `gamma` every step, as it always has."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.core.kvcache import crop_to, forward_step, sequence_cache, sync
from engine.core.model import LoadedModel
from engine.core.policy import FixedGamma, PolicyRun, SpeculationPolicy
from engine.core.proposal import DraftSource, NoDraft
from engine.core.records import Cancelled, PromptOutput, StepRecord
from engine.core.sampling import SamplingConfig
from engine.core.verify import verify


@dataclass(frozen=True)
class DecodeConfig:
    gamma: int
    sampling: SamplingConfig
    max_new_tokens: int
    seed: int = 0
    record_top_logits: int = 0  # k > 0: keep the target's top-k logits at every emitted position
    stop_on_eos: bool = True
    # how many tokens to draft each step (engine.core.policy); None: `gamma` every step (fixed:gamma)
    policy: SpeculationPolicy | None = None

    def speculation_policy(self) -> SpeculationPolicy:
        return self.policy if self.policy is not None else FixedGamma(self.gamma)


def _eos_ids(model: LoadedModel) -> set[int]:
    ids: set[int] = set()
    for source in (model.model.generation_config, model.model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(x) for x in eos)
    if model.tokenizer.eos_token_id is not None:
        ids.add(int(model.tokenizer.eos_token_id))
    return ids


@torch.inference_mode()
def decode_prompt(
    target: LoadedModel,
    draft: DraftSource | None,
    prompt_ids: list[int],
    cfg: DecodeConfig,
    prompt_index: int = 0,
    prompt_id: str = "",
    on_step: Callable[[StepRecord], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    policy_run: PolicyRun | None = None,
) -> tuple[PromptOutput, list[StepRecord]]:
    """Decode one prompt; returns its output and one StepRecord per target forward.

    `policy_run` carries an adaptive policy's state over a run's prompts; None starts cfg's policy afresh."""
    if not prompt_ids:
        raise ValueError("empty prompt")
    draft = draft or NoDraft()
    gen = torch.Generator().manual_seed(cfg.seed)
    eos = _eos_ids(target) if cfg.stop_on_eos else set()
    device = target.device
    run = policy_run if policy_run is not None else PolicyRun(cfg.speculation_policy())
    speculating = getattr(draft, "speculates", True)
    # the confidence stop needs a draft that reports its confidence (a draft model); others draft the full length
    stopper = run.stopper if getattr(draft, "reports_confidence", False) else None

    tokens = list(prompt_ids)
    n_prompt = len(tokens)
    cache = sequence_cache(target)
    draft.start(tokens)
    start = time.perf_counter()
    if n_prompt > 1:  # prefill all but the last prompt token; the first step feeds the last one
        forward_step(target, tokens[:-1], cache, 1)
    sync(device)
    prefill_time = time.perf_counter() - start
    cached = n_prompt - 1

    steps: list[StepRecord] = []
    from_draft: list[bool] = []
    top_values: list[torch.Tensor] = []
    top_indices: list[torch.Tensor] = []
    finished = False
    while not finished and len(tokens) - n_prompt < cfg.max_new_tokens:
        if should_stop is not None and should_stop():
            raise Cancelled()
        remaining = cfg.max_new_tokens - (len(tokens) - n_prompt)
        sync(device)
        t0 = time.perf_counter()
        want = min(run.length(), remaining - 1) if speculating else 0
        if stopper is not None and want > 0:
            proposal = draft.propose(tokens, want, cfg.sampling, gen, stop=stopper)
        else:
            proposal = draft.propose(tokens, want, cfg.sampling, gen)
        drafted = proposal.tokens[: max(0, remaining - 1)]
        if 0 < len(drafted) < run.policy.min_draft:  # too short to be worth a verify (llama.cpp's n-min)
            drafted = []
        sync(device)
        t1 = time.perf_counter()
        logits = forward_step(target, tokens[cached:] + drafted, cache, len(drafted) + 1)
        sync(device)
        t2 = time.perf_counter()
        q = proposal.q[: len(drafted)] if proposal.q is not None else None
        verdict = verify(logits, drafted, q, cfg.sampling, gen)

        emitted = drafted[: verdict.accepted] + [verdict.next_token]
        flags = [True] * verdict.accepted + [False]
        for j, token in enumerate(emitted):
            if token in eos:
                emitted, flags, finished = emitted[: j + 1], flags[: j + 1], True
                break
        if speculating:  # a step that ends the output counts only up to its end (what a replay can know)
            end = len(emitted) if finished else len(drafted) + 1
            run.observe(min(len(drafted), end), min(verdict.accepted, end))
        if cfg.record_top_logits:
            top = torch.topk(logits[: len(emitted)].float(), cfg.record_top_logits, dim=-1)
            top_values.append(top.values.cpu())
            top_indices.append(top.indices.to(torch.int32).cpu())
        old_len = len(tokens)
        tokens.extend(emitted)
        from_draft.extend(flags)
        # cache now holds old_len + len(drafted) entries; keep old_len + accepted (all but the new last token)
        valid = old_len + verdict.accepted
        crop_to(cache, valid)
        cached = valid
        draft.commit(valid)

        record = StepRecord(
            prompt_index=prompt_index,
            step_index=len(steps),
            gamma=len(drafted),
            accepted=verdict.accepted,
            accept_mask=verdict.accept_mask,
            beta=verdict.beta,
            draft_time_s=t1 - t0,
            verify_time_s=t2 - t1,
            draft_forwards=proposal.forwards,
            emitted=len(emitted),
            emitted_token_ids=emitted,
            from_draft=flags,
        )
        steps.append(record)
        if on_step is not None:
            on_step(record)

    finish = getattr(draft, "finish", None)  # a draft that learns whole outputs (suffix decoding's global tree)
    if finish is not None:
        finish(tokens)
    out_ids = tokens[n_prompt:]
    output = PromptOutput(
        prompt_index=prompt_index,
        prompt_id=prompt_id or f"prompt{prompt_index}",
        prompt_tokens=n_prompt,
        token_ids=out_ids,
        text=target.tokenizer.decode(out_ids, skip_special_tokens=True),
        from_draft=from_draft,
        wall_time_s=time.perf_counter() - start,
        steps=len(steps),
        prefill_time_s=prefill_time,
        top_logits=torch.cat(top_values) if top_values else None,
        top_ids=torch.cat(top_indices) if top_indices else None,
    )
    return output, steps
