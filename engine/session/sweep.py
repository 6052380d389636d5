"""Run a sweep: the autoregressive baseline and every draft × γ × temperature, on the same prompts.

Everything is measured in one process, one after the other, so the ratios compare like with like.
The CLI's `run` and the worker's sessions both go through `run_sweep`; hooks let the worker log
every step to the store and honour cancellation without this module knowing about databases."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.theory import alpha_from_mean_accepted, speedup_positional
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.model import LoadedModel
from engine.core.proposal import DraftSource, NoDraft
from engine.core.records import PromptOutput, StepRecord
from engine.core.sampling import SamplingConfig
from engine.drafts.factory import make_draft
from engine.measure import stats as metrics
from engine.measure.agreement import agreement_runs
from engine.measure.fidelity import classify
from engine.measure.verify_cost import verify_cost_curve
from engine.models.pool import ModelPool
from engine.session.spec import SessionSpec, check_context, validate
from engine.session.summary import RunSummary

TOP_LOGITS_K = 16


@dataclass
class PromptText:
    prompt_id: str
    text: str
    category: str | None = None


class Hooks:
    """Callbacks for a sweep; the defaults do nothing."""

    def run_started(self, key: dict[str, Any]) -> Any:
        return None

    def step(self, run: Any, record: StepRecord) -> None:
        pass

    def output(self, run: Any, output: PromptOutput, divergence: dict | None) -> None:
        pass

    def run_finished(self, run: Any, summary: RunSummary) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass

    def should_stop(self) -> bool:
        return False


def encode_prompt(tokenizer: Any, text: str, chat_template: bool) -> list[int]:
    """Token ids for a user prompt, wrapped in the model's chat template when it has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(text, add_special_tokens=True))


@dataclass
class RunOutcome:
    outputs: list[PromptOutput]
    stats: metrics.StepStats = field(default_factory=metrics.StepStats)
    divergences: list[dict | None] = field(default_factory=list)


def _decode_all(
    target: LoadedModel,
    draft: DraftSource,
    encoded: Sequence[tuple[PromptText, list[int]]],
    cfg: DecodeConfig,
    hooks: Hooks,
    run: Any,
    tick: Any,
    judge: Callable[[int, PromptOutput], dict | None] = lambda index, out: None,
) -> RunOutcome:
    """Decode every prompt; each output is judged and handed to the hooks as soon as it is done."""
    outcome = RunOutcome(outputs=[])
    for index, (prompt, ids) in enumerate(encoded):
        def on_step(rec: StepRecord) -> None:
            outcome.stats.add(rec)
            hooks.step(run, rec)

        out, _ = decode_prompt(
            target, draft, ids, cfg, prompt_index=index, prompt_id=prompt.prompt_id,
            on_step=on_step, should_stop=hooks.should_stop,
        )
        outcome.outputs.append(out)
        divergence = judge(index, out)
        outcome.divergences.append(divergence)
        hooks.output(run, out, divergence)
        tick()
    return outcome


def summarise_run(
    stats: metrics.StepStats,
    outputs: Sequence[PromptOutput],
    gamma: int,
    baseline_tps: float | None,
    baseline_step_s: float | None,
    verify_cost: dict[int, float],
) -> RunSummary:
    """The numbers every consumer wants: α (two ways), acceptance length and rates, c, speedups."""
    common = {
        "tokens_per_s": metrics.tokens_per_second(outputs),
        "steps": stats.steps,
        "tokens": sum(len(o.token_ids) for o in outputs),
        "mean_acceptance_length": stats.tokens_per_call(),
        "verify_cost": dict(verify_cost),
    }
    if gamma == 0:
        return RunSummary(**common)
    per_pos = stats.per_position()
    mean_full = stats.tokens_per_call_at(gamma)
    draft_fwd = stats.draft_forward_time()
    c = (draft_fwd / baseline_step_s) if (draft_fwd and baseline_step_s) else 0.0
    v = verify_cost.get(gamma + 1, 1.0)
    return RunSummary(
        **common,
        alpha=stats.alpha(),
        alpha_from_acceptance_length=alpha_from_mean_accepted(mean_full, gamma) if mean_full else None,
        draft_acceptance_rate=stats.draft_acceptance_rate(),
        per_position_acceptance=per_pos,
        proposed_fraction=stats.full_fraction(gamma),
        c=c,
        speedup_measured=common["tokens_per_s"] / baseline_tps if baseline_tps else None,
        speedup_predicted=speedup_positional(per_pos, gamma, c, v) if per_pos else 1.0 / (1 + gamma * c),
    )


def run_sweep(
    settings: SessionSpec,
    prompts: Sequence[PromptText],
    pool: ModelPool | None = None,
    hooks: Hooks | None = None,
) -> dict[str, Any]:
    """Baseline + every draft × γ × temperature; returns a JSON-able report (the CLI's contract)."""
    validate(settings, len(prompts))
    pool = pool or ModelPool()
    hooks = hooks or Hooks()
    target = pool.get(settings.target, settings.dtype, settings.device, settings.trust_remote_code)
    encoded = []
    for p in prompts:
        ids = encode_prompt(target.tokenizer, p.text, settings.chat_template)
        check_context(len(ids), settings.max_new_tokens, target.max_context, f"prompt {p.prompt_id}")
        encoded.append((p, ids))
    drafts = {}
    for ref in settings.drafts:
        if ref != "none":
            drafts[ref] = make_draft(
                ref, target, lambda r: pool.get(r, settings.dtype, settings.device, settings.trust_remote_code)
            )
    combos = [(d, g, t) for d in drafts for g in sorted(set(settings.gammas)) for t in settings.temperatures]
    total = len(prompts) * (1 + len(combos))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        hooks.progress(done, total)

    hooks.progress(0, total)
    max_gamma = max(settings.gammas) if combos else 1
    verify_cost = (
        verify_cost_curve(target, encoded[0][1], max_gamma + 1) if settings.measure_verify_cost else {1: 1.0}
    )

    # the baseline: target alone, greedy, with top logits recorded for the fidelity verdicts
    base_cfg = DecodeConfig(0, SamplingConfig(0.0), settings.max_new_tokens, settings.seed, TOP_LOGITS_K)
    base_key = {"draft": "none", "gamma": 0, "temperature": 0.0, "kind": "baseline"}
    base_run = hooks.run_started(base_key)
    baseline = _decode_all(target, NoDraft(), encoded, base_cfg, hooks, base_run, tick)
    base_tps = metrics.tokens_per_second(baseline.outputs)
    base_step = baseline.stats.single_token_step_time()
    base_summary = summarise_run(baseline.stats, baseline.outputs, 0, base_tps, base_step, verify_cost)
    hooks.run_finished(base_run, base_summary)

    report: dict[str, Any] = {
        "target": settings.target,
        "dtype": settings.dtype,
        "device": target.device,
        "settings": settings.to_dict(),
        "verify_cost": {str(k): v for k, v in verify_cost.items()},
        "baseline": _public_run(base_key, base_summary, baseline.outputs, None),
        "runs": [],
    }
    agreement_cache: dict[str, list[list[int]]] = {}
    for draft_ref, gamma, temperature in combos:
        source = drafts[draft_ref]
        cfg = DecodeConfig(
            gamma, SamplingConfig(temperature, settings.top_k, settings.top_p), settings.max_new_tokens, settings.seed
        )
        key = {"draft": draft_ref, "gamma": gamma, "temperature": temperature, "kind": "speculative"}
        run = hooks.run_started(key)
        t0 = time.perf_counter()

        def judge(index: int, out: PromptOutput, greedy: bool = cfg.sampling.greedy) -> dict:
            return classify(baseline.outputs[index], out, settings.dtype, greedy).__dict__

        outcome = _decode_all(target, source, encoded, cfg, hooks, run, tick, judge)
        summary = summarise_run(outcome.stats, outcome.outputs, gamma, base_tps, base_step, verify_cost)
        summary.wall_s = time.perf_counter() - t0
        if draft_ref not in agreement_cache:
            pairs = zip(encoded, baseline.outputs, strict=True)
            agreement_cache[draft_ref] = [agreement_runs(source, ids, out.token_ids) for (_, ids), out in pairs]
        summary.agreement_runs = agreement_cache[draft_ref]
        summary.method = source.method
        hooks.run_finished(run, summary)
        report["runs"].append(_public_run(key, summary, outcome.outputs, outcome.divergences))
    return report


def _public_run(
    key: dict[str, Any], summary: RunSummary, outputs: Sequence[PromptOutput], divergences: list[dict] | None
) -> dict[str, Any]:
    return key | {k: v for k, v in summary.to_dict().items() if k != "verify_cost"} | {
        "outputs": [
            {"prompt_id": o.prompt_id, "text": o.text, "token_ids": o.token_ids, "from_draft": o.from_draft}
            for o in outputs
        ],
        "divergences": divergences,
    }
