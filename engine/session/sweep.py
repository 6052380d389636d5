"""Run a sweep: the autoregressive baseline and every draft × γ × temperature, on the same prompts.

Everything is measured in one process, interleaved prompt by prompt (the baseline, then every
configuration, on prompt 1; then on prompt 2; …), so each speedup is a ratio of neighbouring measurements
and a change in the machine's load between minutes does not show up as a speedup.
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
from engine.core.policy import PolicyRun, parse_policy
from engine.core.proposal import DraftSource, NoDraft
from engine.core.records import PromptOutput, StepRecord
from engine.core.sampling import SamplingConfig
from engine.drafts.factory import make_draft
from engine.measure import noise
from engine.measure import stats as metrics
from engine.measure.agreement import draft_trace
from engine.measure.fidelity import classify
from engine.measure.telemetry import LoadMeter
from engine.measure.verify_cost import verify_cost_curve
from engine.models.pool import ModelPool
from engine.session.spec import SessionSpec, check_context, gammas_and_policies, validate, widest_draft
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

    def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
        """What the sweep does now ("loading models", "decoding prompt 3 of 8", "agreement pass", …), its own
        progress (done of total) and an estimate of the seconds it has left (None when unknown)."""

    def run_failed(self, run: Any, message: str) -> None:
        """One configuration could not be measured (e.g. its server crashed); the sweep goes on."""


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


def summarise_run(
    stats: metrics.StepStats,
    outputs: Sequence[PromptOutput],
    gamma: int,
    baseline_tps: float | None,
    baseline_step_s: float | None,
    verify_cost: dict[int, float],
    ratios: Sequence[float] | None = None,
) -> RunSummary:
    """The numbers every consumer wants: α (two ways), acceptance length and rates, c, speedups.

    ``ratios``: per-prompt speedups measured side by side (tokens/s ÷ the baseline's on the same prompt);
    when given, the measured speedup is their median and ``speedup_spread`` says how far they spread.
    Without them it is the ratio of the two runs' overall tokens/s."""
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
    spread = noise.spread_of(ratios) if ratios else None
    overall = common["tokens_per_s"] / baseline_tps if baseline_tps else None
    return RunSummary(
        **common,
        alpha=stats.alpha(),
        alpha_from_acceptance_length=alpha_from_mean_accepted(mean_full, gamma) if mean_full else None,
        draft_acceptance_rate=stats.draft_acceptance_rate(),
        per_position_acceptance=per_pos,
        proposed_fraction=stats.full_fraction(gamma),
        c=c,
        speedup_measured=spread.median if spread else overall,
        speedup_spread=spread.to_dict() if spread else None,
        speedup_predicted=speedup_positional(per_pos, gamma, c, v) if per_pos else 1.0 / (1 + gamma * c),
    )


def run_sweep(
    settings: SessionSpec,
    prompts: Sequence[PromptText],
    pool: ModelPool | None = None,
    hooks: Hooks | None = None,
) -> dict[str, Any]:
    """Baseline + every draft × γ × temperature; returns a JSON-able report (the CLI's contract).

    Interleaved at the prompt level: for each prompt the baseline decodes it, then every configuration,
    so each configuration's speedup on a prompt is its tokens/s ÷ the baseline's on that prompt measured
    moments before. A run's measured speedup is the median of those per-prompt ratios, with their spread
    (engine.measure.noise) in ``speedup_spread``; the machine's load around each decode is in ``machine_load``.
    """
    validate(settings, len(prompts))
    pool = pool or ModelPool()
    hooks = hooks or Hooks()
    clock = _PhaseClock(hooks)
    clock.start("loading models", 0, 1)
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
    # speculation policies (engine.core.policy) run beside the fixed γs; a fixed:G policy is just γ = G
    gammas, policies = gammas_and_policies(settings)
    combos = [(d, g, t) for d in drafts for g in gammas for t in settings.temperatures]
    policy_combos = [(d, p, t) for d in drafts for p in policies for t in settings.temperatures]
    total = len(prompts) * (1 + len(combos) + len(policy_combos))
    hooks.progress(0, total)
    max_gamma = widest_draft(gammas, policies) if combos or policy_combos else 1
    if settings.measure_verify_cost:
        clock.start("measuring v(k)", 0, 1)
        verify_cost = verify_cost_curve(target, encoded[0][1], max_gamma + 1)
    else:
        verify_cost = {1: 1.0}
    clock.start("warming up", 0, 1 + len(drafts))
    _warm_up(target, [NoDraft(), *drafts.values()], encoded[0][1], settings, hooks)

    # every run is open from the start: the baseline, then each configuration, in the order they decode
    base_cfg = DecodeConfig(0, SamplingConfig(0.0), settings.max_new_tokens, settings.seed, TOP_LOGITS_K)
    base_key = {"draft": "none", "gamma": 0, "temperature": 0.0, "kind": "baseline"}
    baseline = _OpenRun(base_key, NoDraft(), base_cfg, hooks.run_started(base_key))
    configs = []
    for draft_ref, gamma, temperature in combos:
        cfg = DecodeConfig(
            gamma, SamplingConfig(temperature, settings.top_k, settings.top_p), settings.max_new_tokens, settings.seed
        )
        key = {"draft": draft_ref, "gamma": gamma, "temperature": temperature, "kind": "speculative"}
        configs.append(_OpenRun(key, drafts[draft_ref], cfg, hooks.run_started(key)))
    for draft_ref, policy, temperature in policy_combos:  # stored with γ 0: their γ varies step by step
        sampling = SamplingConfig(temperature, settings.top_k, settings.top_p)
        cfg = DecodeConfig(policy.max_draft(), sampling, settings.max_new_tokens, settings.seed, policy=policy)
        key = {"draft": draft_ref, "gamma": 0, "temperature": temperature, "kind": "speculative"}
        handle = hooks.run_started(key)
        key["policy"] = policy.spec()
        configs.append(_OpenRun(key, drafts[draft_ref], cfg, handle, policy_run=PolicyRun(policy)))

    meter = LoadMeter(gpu=str(target.device).startswith("cuda"))
    done = 0
    decode_start = time.perf_counter()
    for index, (prompt, ids) in enumerate(encoded):
        for run in (baseline, *configs):
            elapsed = time.perf_counter() - decode_start
            eta = elapsed / done * (total - done) if done else None
            clock.start(f"decoding prompt {index + 1} of {len(encoded)}", done, total, eta)

            def judge(out: PromptOutput, greedy: bool = run.cfg.sampling.greedy, at: int = index) -> dict | None:
                return classify(baseline.outcome.outputs[at], out, settings.dtype, greedy).__dict__

            _decode_one(target, run, index, prompt, ids, hooks, meter, None if run is baseline else judge)
            if run is not baseline:
                run.pairs.append((_rate(baseline.outcome.outputs[index]), _rate(run.outcome.outputs[index])))
            done += 1
            hooks.progress(done, total)

    base_tps = metrics.tokens_per_second(baseline.outcome.outputs)
    base_step = baseline.outcome.stats.single_token_step_time()
    base_summary = summarise_run(baseline.outcome.stats, baseline.outcome.outputs, 0, base_tps, base_step, verify_cost)
    base_summary.wall_s = baseline.wall_s
    base_summary.machine_load = noise.load_summary(baseline.loads)
    hooks.run_finished(baseline.handle, base_summary)

    session_load = noise.load_summary([r for run in (baseline, *configs) for r in run.loads])
    report: dict[str, Any] = {
        "target": settings.target,
        "dtype": settings.dtype,
        "device": target.device,
        "settings": settings.to_dict(),
        "verify_cost": {str(k): v for k, v in verify_cost.items()},
        "baseline": _public_run(base_key, base_summary, baseline.outcome.outputs, None),
        "baseline_tokens_per_s": base_tps,
        "runs": [],
        "machine_load": session_load,
        "machine_note": noise.busy_note(session_load),
        "noisy_runs": [],
    }
    agreement_cache: dict[str, list[list[int]]] = {}
    trace_cache: dict[str, list[dict[str, Any]]] = {}
    if configs and drafts:
        clock.start("agreement pass", 0, len(drafts))
    hot = [SamplingConfig(t, settings.top_k, settings.top_p) for t in settings.temperatures if t > 0]
    for run in configs:
        draft_ref = run.key["draft"]
        summary = summarise_run(
            run.outcome.stats, run.outcome.outputs, run.cfg.speculation_policy().max_draft(), base_tps, base_step,
            verify_cost, noise.ratios(run.pairs),
        )  # fmt: skip
        summary.wall_s = run.wall_s
        summary.machine_load = noise.load_summary(run.loads)
        if draft_ref not in agreement_cache:
            # one teacher-forced pass per draft: agreement runs, and the trace every policy replays from
            clock.start("agreement pass", len(agreement_cache), len(drafts))
            pairs = zip(encoded, baseline.outcome.outputs, strict=True)
            traces = [
                draft_trace(run.source, ids, out.token_ids, settings.max_new_tokens, target=target, samplings=hot)
                for (_, ids), out in pairs
            ]
            agreement_cache[draft_ref] = [[min(r, 32) for r in trace["runs"]] for trace in traces]
            summary.policy_trace = trace_cache[draft_ref] = traces  # kept once per draft, on its first run
        summary.agreement_runs = agreement_cache[draft_ref]
        summary.method = run.source.method
        stats = run.outcome.stats
        summary.mean_drafted_per_step = stats.drafted / stats.steps if stats.steps else None
        summary.draft_calls = run.draft_calls
        if "policy" in run.key:
            policy_live(summary, run.key["policy"], trace_cache[draft_ref], run.key["temperature"], verify_cost)
        hooks.run_finished(run.handle, summary)
        public = _public_run(run.key, summary, run.outcome.outputs, run.outcome.divergences)
        public["speedup_noisy"] = noise.is_noisy(_spread(summary))
        if public["speedup_noisy"]:
            report["noisy_runs"].append(_label(run.key))
        report["runs"].append(public)
    report["phase_times_s"] = clock.finish()
    return report


def batch_sweep_eta_s(step_s: float | None, serving_batch: int = 1) -> float | None:
    """About how long regime detection's batch sweep takes, from one single-token decode step's seconds on
    this machine (None when unknown): each batch size b prefills 32·b tokens and times 3 steps, which on the
    machines measured so far came to roughly (4 + 1.5·b) steps per size, over the sizes worker.detect_regime
    uses (1…64, the serving batch and twice it). An upper bound: the sweep stops once growth is linear."""
    if not step_s or step_s <= 0:
        return None
    sizes = {1, 2, 4, 8, 16, 32, 64, serving_batch, serving_batch * 2}
    return step_s * sum(4 + 1.5 * b for b in sizes)


def verify_cost_eta_s(step_s: float | None, max_gamma: int, reps: int = 5) -> float | None:
    """About how long the v(k) measurement takes: k-token forwards for k = 1, 2, 4, … γ+1, ``reps`` each
    (after a warm-up), each costing at most k single steps (at least one)."""
    if not step_s or step_s <= 0:
        return None
    ks = {k for k in (1, 2, 4, 8, 16) if k <= max_gamma + 1} | {1, max_gamma + 1}
    return step_s * (reps + 1) * sum(max(1.0, k / 4) for k in ks)


def _label(key: dict[str, Any]) -> str:
    """'draft γ=2 T=0' (or the policy instead of γ) for messages."""
    how = key.get("policy") or f"γ={key['gamma']}"
    return f"{key['draft']} {how} T={key['temperature']:g}"


def _spread(summary: RunSummary) -> noise.Spread | None:
    return noise.Spread(**summary.speedup_spread) if summary.speedup_spread else None


def _rate(out: PromptOutput) -> float:
    """One prompt's decode tokens/s (prefill excluded), 0 when it has no decode time."""
    return metrics.tokens_per_second([out])


@dataclass
class _OpenRun:
    """One configuration while the sweep interleaves: what it decodes with and what it has measured."""

    key: dict[str, Any]
    source: DraftSource
    cfg: DecodeConfig
    handle: Any
    outcome: RunOutcome = field(default_factory=lambda: RunOutcome(outputs=[]))
    pairs: list[tuple[float, float]] = field(default_factory=list)  # per prompt: (baseline, this run) tokens/s
    loads: list[dict[str, float]] = field(default_factory=list)  # per prompt: the machine's load while decoding
    wall_s: float = 0.0
    policy_run: PolicyRun | None = None  # a policy's state, carried over the run's prompts (None: fixed γ)
    draft_calls: int = 0  # draft forwards so far


def _decode_one(
    target: LoadedModel,
    run: _OpenRun,
    index: int,
    prompt: PromptText,
    ids: list[int],
    hooks: Hooks,
    meter: LoadMeter,
    judge: Callable[[PromptOutput], dict | None] | None,
) -> PromptOutput:
    """Decode one prompt for one run; its output is judged and handed to the hooks as soon as it is done."""

    def on_step(rec: StepRecord) -> None:
        run.outcome.stats.add(rec)
        run.draft_calls += rec.draft_forwards
        hooks.step(run.handle, rec)

    meter.mark()
    t0 = time.perf_counter()
    out, _ = decode_prompt(
        target, run.source, ids, run.cfg, prompt_index=index, prompt_id=prompt.prompt_id,
        on_step=on_step, should_stop=hooks.should_stop, policy_run=run.policy_run,
    )  # fmt: skip
    run.wall_s += time.perf_counter() - t0
    run.loads.append(meter.read())
    run.outcome.outputs.append(out)
    divergence = judge(out) if judge is not None else None
    run.outcome.divergences.append(divergence)
    hooks.output(run.handle, out, divergence)
    return out


WARM_UP_TOKENS = 4


def _warm_up(
    target: LoadedModel, sources: Sequence[DraftSource], ids: list[int], settings: SessionSpec, hooks: Hooks
) -> None:
    """A few tokens through the target alone and each draft first: the first forward of a model pays for
    lazy initialisation, which would otherwise land on the first prompt's ratio. Nothing is recorded."""
    gamma = min(settings.gammas) if settings.gammas else 1
    for source in sources:
        cfg = DecodeConfig(0 if source.method == "none" else gamma, SamplingConfig(0.0), WARM_UP_TOKENS, settings.seed)
        decode_prompt(target, source, ids, cfg, on_step=lambda rec: None, should_stop=hooks.should_stop)


class _PhaseClock:
    """Tells the hooks what the sweep is doing now and keeps how long each phase took."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._since = time.perf_counter()

    def start(self, name: str, done: int, total: int, eta_s: float | None = None) -> None:
        self._close()
        self._name, self._since = _phase_key(name), time.perf_counter()
        self.hooks.phase(name, done, total, eta_s)

    def _close(self) -> None:
        if self._name is not None:
            self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._since
            self._name = None

    def finish(self) -> dict[str, float]:
        self._close()
        return {name: round(seconds, 3) for name, seconds in self.times.items()}


def _phase_key(name: str) -> str:
    """'decoding prompt 3 of 8' → 'decoding': phase times are kept per kind of phase."""
    return "decoding" if name.startswith("decoding prompt") else name


def policy_live(
    summary: RunSummary,
    spec: str,
    traces: Sequence[dict[str, Any]] = (),
    temperature: float = 0.0,
    verify_cost: dict[int, float] | None = None,
    llamacpp: bool = False,
) -> RunSummary:
    """A policy run's summary: its figures under `policy_live` (with what the replay of the session's own trace
    predicted for it, `replayed`: in llama-server's loop when `llamacpp`), and the columns the fixed-γ recommender
    reads (α, the measured and predicted speedups, acceptance by position) emptied, since its γ varies per step."""
    from engine.analysis.policy_replay import CostModel, replay

    steps = summary.steps or 1
    summary.policy = spec
    summary.policy_live = {
        "policy": spec, "tokens_per_call": summary.mean_acceptance_length, "tokens_per_s": summary.tokens_per_s,
        "speedup_measured": summary.speedup_measured, "speedup_spread": summary.speedup_spread,
        "alpha": summary.alpha, "draft_acceptance_rate": summary.draft_acceptance_rate, "steps": summary.steps,
        "tokens": summary.tokens, "mean_drafted_per_step": summary.mean_drafted_per_step,
        "draft_calls": summary.draft_calls, "draft_calls_per_step": (summary.draft_calls or 0) / steps,
    }  # fmt: skip
    try:
        cost = CostModel(summary.c, verify_cost)
        predicted = replay(traces, parse_policy(spec), cost, temperature, llamacpp=llamacpp)
        summary.policy_live["replayed"] = {
            "tokens_per_call": predicted.tokens_per_call, "draft_calls_per_step": predicted.draft_calls_per_step,
            "mean_drafted_per_step": predicted.drafted_per_step, "speedup": predicted.predicted_speedup,
            "basis": predicted.basis,
        }  # fmt: skip
    except ValueError:  # no usable trace (a draft with another tokenizer), or no β at this temperature
        summary.policy_live["replayed"] = None
    summary.alpha = summary.alpha_from_acceptance_length = summary.proposed_fraction = None
    summary.speedup_measured = summary.speedup_predicted = None
    summary.per_position_acceptance = []
    return summary


NOT_PUBLIC = ("verify_cost", "policy_trace")  # v(k) is the report's; a trace is stored with its run only


def _public_run(
    key: dict[str, Any], summary: RunSummary, outputs: Sequence[PromptOutput], divergences: list[dict] | None
) -> dict[str, Any]:
    return key | {k: v for k, v in summary.to_dict().items() if k not in NOT_PUBLIC} | {
        "outputs": [
            {"prompt_id": o.prompt_id, "text": o.text, "token_ids": o.token_ids, "from_draft": o.from_draft}
            for o in outputs
        ],
        "divergences": divergences,
    }
