"""The same sweep as spectune's own loop, measured in llama.cpp: one llama-server per configuration.

Configurations are the target alone (the baseline), each draft × γ, n-gram lookup, and each draft model ×
speculation policy llama-server can run as is (engine.llamacpp.policy_flags), each a llama-server on 127.0.0.1
started with its own flags. All of them run side by side and the prompts go
through them prompt by prompt (baseline, then every configuration), so every speedup is a ratio of
neighbouring measurements. Per request the server reports its timings and draft counts; its /metrics
counters before and after give the target calls and the per-position acceptance exactly.

What llama.cpp cannot give is named, not guessed: β per position (so α as mean β) and which output tokens
came from the draft. α is estimated from the mean acceptance length instead (`alpha_from_acceptance_length`).
c is the draft alone's time per token ÷ the target alone's, both measured by llama-server on the same
prompts; v(k) comes from llama-bench (engine/llamacpp/bench.py).

A session also records each draft model's trace for the policy replay: the draft, loaded in
PyTorch (float32), teacher-forced along llama.cpp's own target-alone outputs at temperature 0; each policy run's
`replayed` figures are that trace replayed in llama-server's loop (engine.analysis.policy_replay, llamacpp=True).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.analysis.theory import alpha_from_mean_accepted, speedup_positional, verify_cost_per_call
from engine.core.acceptance import per_call_rates
from engine.core.policy import FixedGamma, SpeculationPolicy
from engine.core.records import Cancelled, PromptOutput, StepRecord
from engine.drafts.model import ModelDraft
from engine.drafts.refs import is_ngram, parse_ngram_spec
from engine.errors import ModelError, SpectuneError
from engine.llamacpp import client
from engine.llamacpp.binaries import LlamaBuild, find_llama
from engine.llamacpp.policy_flags import draft_forwards, llamacpp_fields
from engine.llamacpp.server import ManagedServer, ServerConfig, ServerError
from engine.measure import noise
from engine.measure.agreement import draft_trace
from engine.measure.fidelity import classify
from engine.measure.telemetry import LoadMeter
from engine.measure.verify_cost import llamacpp_verify_cost_curve
from engine.models.bundled import BUNDLED, assembled_gguf
from engine.models.pool import ModelPool
from engine.session.spec import SessionSpec, gammas_and_policies, validate, widest_draft
from engine.session.summary import RunSummary
from engine.session.sweep import NOT_PUBLIC, Hooks, PromptText, policy_live

ENGINE = "llama.cpp"
TOP_LOGPROBS = 4  # the baseline's top log-probs per token, for the fidelity verdicts
# what llama.cpp does not report, named in every llama.cpp run's summary and the CLI JSON
UNAVAILABLE = ("alpha", "beta_per_position", "from_draft")


def gguf_for(ref: str, role: str) -> Path:
    """The GGUF file llama.cpp loads for a bundled model name or a .gguf path."""
    if ref in BUNDLED:
        return assembled_gguf(BUNDLED[ref], progress=False)
    path = Path(ref).expanduser()
    if ref.endswith(".gguf") and path.is_file():
        return path
    if ref.endswith(".gguf"):
        raise ModelError(f"{role} file not found: {ref}")
    raise ModelError(f"{role} '{ref}': the llama.cpp engine loads GGUF files; give a bundled model or a .gguf path")


@dataclass
class _Config:
    """One configuration under test: its run key, its server and what it has measured so far."""

    key: dict[str, Any]
    server_config: ServerConfig
    policy: SpeculationPolicy | None = None  # a policy run (its key's γ is 0); None: the baseline or a fixed γ
    server: ManagedServer | None = None
    run: Any = None
    failed: str | None = None
    outputs: list[PromptOutput] = field(default_factory=list)
    divergences: list[dict | None] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # tokens/s per prompt
    loads: list[dict[str, float]] = field(default_factory=list)  # the machine's load around each request
    counters: client.SpecCounters = field(default_factory=client.SpecCounters)

    @property
    def most_drafted(self) -> int:
        """γ, or the policy's most tokens per step."""
        return self.policy.max_draft() if self.policy is not None else int(self.key["gamma"])


def _draft_server(target: Path, draft: Path, policy: SpeculationPolicy, threads: int | None) -> ServerConfig:
    """A llama-server drafting with a draft model under a policy it runs as is (a fixed γ or a confidence stop)."""
    fields = llamacpp_fields(policy)
    assert fields is not None, f"validate() lets only policies llama.cpp runs through, not {policy.spec()}"
    return ServerConfig(target, draft=draft, spec_type="draft-simple", threads=threads, **fields)


def _configs(spec: SessionSpec, target: Path, threads: int | None) -> tuple[list[_Config], dict[str, Path]]:
    """The baseline per temperature, then each draft × γ × temperature, then each draft model × policy ×
    temperature; and the draft GGUFs (for c)."""
    configs: list[_Config] = []
    draft_models = {ref: gguf_for(ref, "draft") for ref in spec.drafts if ref != "none" and not is_ngram(ref)}
    gammas, policies = gammas_and_policies(spec)
    base = ServerConfig(target, threads=threads)
    for temperature in spec.temperatures:
        configs.append(_Config({"draft": "none", "gamma": 0, "temperature": temperature, "kind": "baseline"}, base))
    for ref in spec.drafts:
        if ref == "none":
            continue
        for gamma in gammas:
            if is_ngram(ref):
                _, longest = parse_ngram_spec(ref)
                cfg = ServerConfig(target, spec_type="ngram-simple", draft_n_max=gamma, draft_n_min=0,
                                   ngram_size_n=longest, ngram_size_m=gamma, threads=threads)  # fmt: skip
            else:
                cfg = _draft_server(target, draft_models[ref], FixedGamma(gamma), threads)
            configs += _per_temperature(spec, {"draft": ref, "gamma": gamma}, cfg)
    for ref, draft in draft_models.items():
        for policy in policies:  # stored with γ 0: their γ varies step by step
            cfg = _draft_server(target, draft, policy, threads)
            configs += _per_temperature(spec, {"draft": ref, "gamma": 0}, cfg, policy)
    return configs, draft_models


def _per_temperature(
    spec: SessionSpec, key: dict[str, Any], cfg: ServerConfig, policy: SpeculationPolicy | None = None
) -> list[_Config]:
    return [_Config(key | {"temperature": t, "kind": "speculative"}, cfg, policy) for t in spec.temperatures]


def _start(config: _Config, build: LlamaBuild, hooks: Hooks) -> None:
    config.server = ManagedServer(config.server_config, build=build)
    try:
        config.server.start()
        if config.server_config.spec_type is not None and not client.speculating(config.server.url):
            errors = "; ".join(line.split(": ", 1)[-1] for line in config.server.log_errors()) or "no reason logged"
            raise ServerError(f"llama-server started with speculation off ({errors})")
    except ServerError as exc:
        _fail(config, hooks, f"{_label(config)}: {exc}")


def _fail(config: _Config, hooks: Hooks, message: str) -> None:
    config.failed = message
    if config.server is not None:
        config.server.stop()
    if config.run is not None:
        hooks.run_failed(config.run, message)


def _label(config: _Config) -> str:
    key = config.key
    how = config.policy.spec() if config.policy is not None else f"γ={key['gamma']}"
    return "baseline" if key["kind"] == "baseline" else f"{key['draft']} {how} T={key['temperature']}"


def _request(config: _Config, prompt: str, spec: SessionSpec, temperature: float, n_probs: int) -> tuple[
    client.Completion, client.SpecCounters
]:
    assert config.server is not None
    url = config.server.url
    before = client.metrics(url)
    completion = client.complete(url, prompt, spec.max_new_tokens, temperature, spec.seed, spec.top_k, spec.top_p,
                                 n_probs=n_probs)  # fmt: skip
    return completion, client.metrics(url).minus(before)


def run_llamacpp_sweep(
    spec: SessionSpec, prompts: Sequence[PromptText], hooks: Hooks | None = None, build: LlamaBuild | None = None
) -> dict[str, Any]:
    """Baseline + every draft × γ × temperature in llama.cpp; the same report shape as run_sweep."""
    validate(spec, len(prompts))
    hooks = hooks or Hooks()
    build = build or find_llama()
    target = gguf_for(spec.target, "target")
    threads = None
    configs, draft_models = _configs(spec, target, threads)
    drafts_alone = {  # each draft model alone, on the same prompts: its time per token gives c
        ref: _Config({"draft": ref, "gamma": 0, "temperature": 0.0, "kind": "draft-alone"}, ServerConfig(path))
        for ref, path in draft_models.items()
    }
    total = len(prompts) * len(configs)
    done = 0
    hooks.progress(0, total)
    for config in configs:
        config.run = hooks.run_started(config.key | {"engine": ENGINE})
        if config.policy is not None:
            config.key["policy"] = config.policy.spec()
    meter = LoadMeter()
    try:
        servers = [*configs, *drafts_alone.values()]
        for started, config in enumerate(servers):
            hooks.phase(f"starting llama-server {started + 1} of {len(servers)}", started, len(servers), None)
            _start(config, build, hooks)
        prompt_texts: list[str] = []
        live = next((c for c in configs if c.failed is None and c.server is not None), None)
        if live is None:
            raise ServerError(next((c.failed for c in configs if c.failed), "no llama-server could be started"))
        for p in prompts:
            prompt_texts.append(client.chat_prompt(live.server.url, p.text) if spec.chat_template else p.text)
        baselines = {c.key["temperature"]: c for c in configs if c.key["kind"] == "baseline"}
        t0 = time.monotonic()
        for index, (prompt, text) in enumerate(zip(prompts, prompt_texts, strict=True)):
            eta = (time.monotonic() - t0) / index * (len(prompts) - index) if index else None
            hooks.phase(f"decoding prompt {index + 1} of {len(prompts)}", index, len(prompts), eta)
            for config in [*configs, *drafts_alone.values()]:
                if hooks.should_stop():
                    raise Cancelled()
                if config.failed is not None:
                    if config.key["kind"] != "draft-alone":
                        done += 1
                        hooks.progress(done, total)
                    continue
                meter.mark()
                _measure(config, index, prompt, text, spec, baselines, hooks)
                config.loads.append(meter.read())
                if config.key["kind"] != "draft-alone":
                    done += 1
                    hooks.progress(done, total)
        verify_cost: dict[int, float] = {}
        notes: list[str] = []
        if spec.measure_verify_cost:
            hooks.phase("measuring v(k) with llama-bench", 0, 1, None)
            try:
                widest = widest_draft(*gammas_and_policies(spec)) + 1
                verify_cost = llamacpp_verify_cost_curve(build, target, widest, threads)
            except ServerError as exc:
                notes.append(f"v(k) not measured: {exc}")
        traces: dict[str, list[dict[str, Any]]] = {}
        speculated = [ref for ref in draft_models if any(c.key["draft"] == ref and c.failed is None for c in configs)]
        if speculated:  # every draft model's trace: the Policies page replays any llama.cpp session
            traces = _draft_traces(spec, speculated, baselines.get(0.0), prompt_texts, hooks, notes)
        return _report(spec, build, configs, drafts_alone, baselines, verify_cost, notes, hooks, traces)
    finally:
        for config in [*configs, *drafts_alone.values()]:
            if config.server is not None:
                config.server.stop()


def _measure(
    config: _Config, index: int, prompt: PromptText, text: str, spec: SessionSpec,
    baselines: dict[float, _Config], hooks: Hooks,
) -> None:  # fmt: skip
    """One request through one configuration: log it as a step, keep its output, judge it against the baseline."""
    temperature = float(config.key["temperature"])
    is_baseline = config.key["kind"] == "baseline"
    t0 = time.time()
    try:
        completion, delta = _request(config, text, spec, temperature, TOP_LOGPROBS if is_baseline else 0)
    except ServerError as exc:
        alive = config.server is not None and config.server.alive()
        tail = "" if alive else f"; its log ends:\n{config.server.log_tail() if config.server else ''}"
        _fail(config, hooks, f"{_label(config)}: {exc}{tail}")
        return
    seconds = completion.predicted_ms / 1000.0
    config.counters = config.counters.plus(delta)
    if seconds > 0 and completion.predicted_n:
        config.rates.append(completion.predicted_n / seconds)
    if config.key["kind"] == "draft-alone":
        return
    calls = int(delta.target_calls) or max(1, completion.predicted_n - completion.draft_n_accepted)
    record = StepRecord(
        prompt_index=index, step_index=0, gamma=completion.draft_n, accepted=completion.draft_n_accepted,
        accept_mask=[], beta=[], draft_time_s=0.0, verify_time_s=seconds, draft_forwards=int(delta.drafts),
        emitted=completion.predicted_n, target_calls=calls,
    )  # fmt: skip
    hooks.step(config.run, record)
    output = PromptOutput(
        prompt_index=index, prompt_id=prompt.prompt_id, prompt_tokens=completion.prompt_n,
        token_ids=completion.token_ids, text=completion.text, from_draft=[],
        wall_time_s=time.time() - t0, steps=calls, prefill_time_s=completion.prompt_ms / 1000.0,
        top_logits=[[lp for _, lp in top] for top in completion.top_logprobs] if is_baseline else None,
        top_ids=[[tid for tid, _ in top] for top in completion.top_logprobs] if is_baseline else None,
    )  # fmt: skip
    config.outputs.append(output)
    divergence = None
    if not is_baseline:
        baseline = baselines.get(temperature)
        reference = baseline.outputs[index] if baseline and len(baseline.outputs) > index else None
        if reference is not None:
            divergence = classify(reference, output, "gguf", greedy=temperature == 0).__dict__
    config.divergences.append(divergence)
    hooks.output(config.run, output, divergence)


def _summary(config: _Config, baseline: _Config | None, c: float, verify_cost: dict[int, float]) -> RunSummary:
    counters = config.counters
    tokens = sum(len(o.token_ids) for o in config.outputs)
    seconds = sum(o.wall_time_s - o.prefill_time_s for o in config.outputs)
    decode_s = counters.predicted_seconds or seconds
    common: dict[str, Any] = {
        "tokens_per_s": tokens / decode_s if decode_s > 0 else 0.0,
        "steps": int(counters.target_calls),
        "tokens": tokens,
        "mean_acceptance_length": counters.mean_acceptance_length(),
        "verify_cost": verify_cost,
        "engine": ENGINE,
        "method": None,
        "machine_load": noise.load_summary(config.loads),
    }
    if config.key["kind"] == "baseline":
        return RunSummary(**common)
    gamma = config.most_drafted
    per_pos = counters.per_position_acceptance()
    mal = counters.mean_acceptance_length()
    pairs = list(zip(baseline.rates, config.rates, strict=False)) if baseline else []
    spread = noise.spread_of(noise.ratios(pairs))
    ngram = is_ngram(str(config.key["draft"]))
    cost = 0.0 if ngram else c
    steps = counters.target_calls
    drafting = counters.drafts / steps if steps else 1.0
    v = verify_cost_per_call(verify_cost or None, gamma + 1, drafting)
    per_call = per_call_rates(per_pos, drafting)
    return RunSummary(
        **(common | {"method": "ngram" if ngram else "draft_model"}),
        mean_drafted_per_step=counters.draft_tokens / steps if steps else None,
        draft_calls=0 if ngram else draft_forwards(counters, len(config.outputs), config.server_config.draft_p_min),
        alpha=None,
        alpha_from_acceptance_length=alpha_from_mean_accepted(mal, gamma) if mal else None,
        draft_acceptance_rate=counters.draft_acceptance_rate(),
        per_position_acceptance=per_pos,
        drafting_fraction=drafting,
        c=cost,
        speedup_measured=spread.median if spread else None,
        speedup_predicted=speedup_positional(per_call, gamma, cost, v) if per_call else None,
        speedup_spread=spread.to_dict() if spread else None,
    )


def _report(
    spec: SessionSpec, build: LlamaBuild, configs: list[_Config], drafts_alone: dict[str, _Config],
    baselines: dict[float, _Config], verify_cost: dict[int, float], notes: list[str], hooks: Hooks,
    traces: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:  # fmt: skip
    base0 = baselines.get(0.0) or next(iter(baselines.values()))
    target_rate = _median(base0.rates)
    c_by_draft = {ref: target_rate / _median(alone.rates) for ref, alone in drafts_alone.items()
                  if alone.failed is None and _median(alone.rates) and target_rate}  # fmt: skip
    report: dict[str, Any] = {
        "target": spec.target, "engine": ENGINE, "llama_cpp": build.describe(), "dtype": "gguf", "device": "cpu",
        "settings": spec.to_dict(), "verify_cost": {str(k): v for k, v in verify_cost.items()},
        "unavailable": list(UNAVAILABLE), "notes": notes, "runs": [], "failed": [],
        "machine_load": (load := noise.load_summary([r for c in configs for r in c.loads])),
        "machine_note": noise.busy_note(load),
    }  # fmt: skip
    traced: set[str] = set()
    for config in configs:
        if config.failed is not None:
            report["failed"].append({**config.key, "error": config.failed})
            continue
        baseline = baselines.get(float(config.key["temperature"]))
        ref = str(config.key["draft"])
        summary = _summary(config, baseline, c_by_draft.get(ref, 0.0), verify_cost)
        if config.policy is not None:
            temperature = float(config.key["temperature"])
            policy_live(summary, config.policy.spec(), traces.get(ref, ()), temperature, verify_cost, llamacpp=True)
        if ref in traces and ref not in traced:  # kept once per draft, on its first run
            summary.policy_trace = traces[ref]
            traced.add(ref)
        hooks.run_finished(config.run, summary)
        public = config.key | {k: v for k, v in summary.to_dict().items() if k not in NOT_PUBLIC} | {
            "outputs": [{"prompt_id": o.prompt_id, "text": o.text, "token_ids": o.token_ids, "from_draft": None}
                        for o in config.outputs],
            "divergences": config.divergences if config.key["kind"] != "baseline" else None,
        }  # fmt: skip
        if config is base0:
            report["baseline"] = public
        elif config.key["kind"] == "speculative":
            report["runs"].append(public)
    if "baseline" not in report:
        raise ServerError(report["failed"][0]["error"] if report["failed"] else "the baseline was not measured")
    return report


def _draft_traces(
    spec: SessionSpec, drafts: list[str], baseline: _Config | None, texts: list[str], hooks: Hooks, notes: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """Per draft model, one trace per prompt for the policy replay: the draft in PyTorch (float32) teacher-forced
    along llama.cpp's own target-alone outputs at temperature 0 (none without that baseline)."""
    if baseline is None or len(baseline.outputs) != len(texts):
        notes.append("no policy replay: the target alone was not measured at temperature 0 on every prompt")
        return {}
    pool = ModelPool()
    traces: dict[str, list[dict[str, Any]]] = {}
    for done, ref in enumerate(drafts):
        if hooks.should_stop():
            raise Cancelled()
        hooks.phase(f"recording {ref}'s trace for the policy replay (PyTorch, float32)", done, len(drafts), None)
        try:
            draft = pool.get(ref, "float32", "cpu", spec.trust_remote_code)
        except SpectuneError as exc:
            notes.append(f"no policy replay for {ref}: {exc}")
            continue
        if any(t >= draft.vocab_size for output in baseline.outputs for t in output.token_ids):
            notes.append(f"no policy replay for {ref}: its vocabulary is not the target's")
            pool.clear()
            continue
        source = ModelDraft(draft, draft.vocab_size)
        traces[ref] = [
            draft_trace(source, draft.tokenizer.encode(text), output.token_ids, spec.max_new_tokens)
            for text, output in zip(texts, baseline.outputs, strict=True)
        ]
        pool.clear()
    return traces


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


