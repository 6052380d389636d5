"""vLLM as a session engine: one managed vLLM server on 127.0.0.1 per distinct configuration, measured like a
deployment.

Configurations are the target alone, each draft model × γ (`{"method": "draft_model", …}`), n-gram lookup × γ
(`{"method": "ngram", "prompt_lookup_min/max": …}`), suffix decoding × γ (`{"method": "suffix", …}` as the export
writes it; its global tree learns the session's prompts in the order the driver sends them), and γ by batch size
(a `batch:B=G,..` policy, launched with `num_speculative_tokens_per_batch_size` exactly as the vLLM export writes
it); temperatures and concurrency levels share a server. vLLM batches continuously, so every configuration is
measured at each concurrency level of the session (n prompts in flight at once, streamed): tokens/s over the batch,
time to first token, inter-token gaps, and acceptance from vLLM's own /metrics counters over exactly that batch.
What vLLM cannot give is named, not guessed: β per position (so α as mean β), which output tokens came from the
draft, v(k) and c. The dtype is chosen per CPU: bfloat16 only where the CPU has bf16 instructions (AVX512_BF16 or
AMX), float32 otherwise; a CUDA build takes the session's."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from engine.analysis.export.vllm import suffix_config, vllm_schedule
from engine.analysis.prediction import DraftingLoop
from engine.analysis.step_overhead import InLoop, loop_points
from engine.core.counters import SpecCounters
from engine.core.records import Cancelled, PromptOutput
from engine.drafts.kinds import draft_kind
from engine.drafts.refs import parse_ngram_spec, parse_suffix_spec
from engine.engines.vllm import client
from engine.engines.vllm.binaries import VllmInstall, find_vllm
from engine.engines.vllm.options import VllmOptions
from engine.engines.vllm.server import VllmConfig, VllmServer, VllmServerError
from engine.errors import SettingsError
from engine.measure.fidelity import TargetTop
from engine.measure.hardware import cpu_has_bf16
from engine.models.pool import ModelPool
from engine.serving.transport import EndpointError
from engine.session.runner import (
    DecodeContext,
    Decoded,
    EngineOutputs,
    PromptText,
    RunFailed,
    RunKey,
    baseline_of,
)
from engine.session.spec import SessionSpec, gammas_and_policies, validate

TOP_LOGPROBS = 16  # the target's top log-probs where an output diverged, for the fidelity verdict (≤ max_logprobs)
REQUEST_TIMEOUT_S = 600.0
WARM_UP_TEXT = "Warm-up request."


def validate_vllm(spec: SessionSpec, n_prompts: int | None = None) -> None:
    """The common checks, then what vLLM runs here: fixed γ with a draft model or n-gram lookup."""
    validate(spec, n_prompts)
    _, varying = gammas_and_policies(spec)
    per_step = [p for p in varying if p.varies_per_step]
    if per_step:
        specs = ", ".join(p.spec() for p in per_step)
        raise SettingsError(
            f"vLLM sessions run fixed γ and γ by batch size (batch:B=G,..) only ({specs} varies γ "
            "per step): use spectune or llama.cpp"
        )


def choose_dtype(requested: str, build: str, cpuinfo: str | None = None) -> tuple[str, str | None]:
    """(dtype, note): on the CPU build bfloat16/float16 only with bf16 instructions, float32 otherwise."""
    if build != "cpu" or requested == "float32":
        return requested, None
    if cpu_has_bf16(cpuinfo):
        return "bfloat16", None if requested == "bfloat16" else f"{requested} → bfloat16 (vLLM's CPU build)"
    return "float32", f"{requested} requested; this CPU has no bf16 instructions (avx512_bf16, amx_bf16): float32"


def _ngram(ref: str, draft_dir: str | None, gamma: int) -> dict[str, Any]:
    lo, hi = parse_ngram_spec(ref)
    return {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_max": hi, "prompt_lookup_min": lo}


def _draft_model(ref: str, draft_dir: str | None, gamma: int) -> dict[str, Any]:
    return {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": gamma}


# vLLM's speculative_config for each draft kind it runs, by method: (reference, draft model dir, γ) -> its fields
METHODS: dict[str, Callable[[str, str | None, int], dict[str, Any]]] = {
    "ngram": _ngram,
    "suffix": lambda ref, draft_dir, gamma: suffix_config(parse_suffix_spec(ref), gamma),
    "draft_model": _draft_model,
}


def speculative_config(key: RunKey, draft_dir: str | None) -> dict[str, Any] | None:
    """vLLM's --speculative-config for one configuration (None for the target alone)."""
    if key.kind == "baseline":
        return None
    schedule = key.policy.batch_schedule() if key.policy is not None else None
    gamma = max(schedule.values()) if schedule else key.gamma
    config = METHODS[draft_kind(key.draft).method](key.draft, draft_dir, gamma)
    if schedule:  # γ by batch size as the vLLM export writes it (vLLM ≥ 0.24's dynamic speculative decoding)
        config["num_speculative_tokens_per_batch_size"] = vllm_schedule(schedule)
    return config


def _model_dir(ref: str) -> str:
    from engine.models.loading import resolve_model_dir

    return resolve_model_dir(ref)


class VllmRunner:
    """Managed vLLM servers behind the Runner interface."""

    name: ClassVar[str] = "vllm"
    unavailable: ClassVar[tuple[str, ...]] = ("alpha", "beta_per_position", "from_draft", "verify_cost", "c")
    drafting_loop: ClassVar[DraftingLoop] = DraftingLoop()
    device = "cpu"

    def __init__(
        self, pool: ModelPool | None = None, install: VllmInstall | None = None, threads: int | None = None
    ) -> None:
        """`pool` is not used: the models live in the vLLM servers."""
        self.install = install
        self.threads = threads
        self.request_timeout_s = REQUEST_TIMEOUT_S  # a request that takes longer: the server hangs
        self.dtype = "float32"
        self.spec: SessionSpec | None = None
        self.configs: dict[RunKey, VllmConfig] = {}
        self.servers: dict[VllmConfig, VllmServer] = {}
        self.prompts: list[list[int] | str] = []
        self.prompt_ids: list[str] = []
        self.notes: list[str] = []
        self.startups: list[dict[str, Any]] = []
        self.in_loop: dict[RunKey, list[InLoop]] = {}  # per speculative run alone in flight: each request's steps
        self.call_ms: dict[float, dict[int, list[float]]] = {}  # per temperature, per prompt: a target-alone step

    def _config(self, key: RunKey, target: str, drafts: dict[str, str]) -> VllmConfig:
        assert self.spec is not None
        spec = speculative_config(key, drafts.get(key.draft))
        options = VllmOptions.of(self.spec)
        common = {
            "dtype": self.dtype,
            "threads": self.threads or options.threads,
            "seed": self.spec.seed,
            "max_num_seqs": max(self.spec.concurrency),
            "max_model_len": options.max_model_len,
            "kv_cache_mib": options.kv_cache_mib,
            "enforce_eager": options.enforce_eager,
        }
        return VllmConfig.with_speculation(Path(target), spec, **common)

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        self.spec = spec
        self.install = self.install or find_vllm()
        self.device = "cpu" if self.install.build == "cpu" else "cuda"
        self.dtype, note = choose_dtype(spec.dtype, self.install.build)
        self.notes += [note] if note else []
        target = _model_dir(spec.target)
        drafts = {
            k.draft: _model_dir(k.draft) for k in plan if k.kind != "baseline" and draft_kind(k.draft).needs_model
        }
        self.configs = {key: self._config(key, target, drafts) for key in plan}
        wanted = list(dict.fromkeys(self.configs.values()))
        why: dict[VllmConfig, str] = {}
        for started, config in enumerate(wanted):
            if ctx.should_stop():
                raise Cancelled()
            ctx.phase(f"starting vLLM {started + 1} of {len(wanted)}", started, len(wanted), None)
            try:
                self.servers[config] = self._start(config)
            except VllmServerError as exc:
                why[config] = str(exc)
        live = next(iter(self.servers.values()), None)
        if live is None:
            raise RunFailed(next(iter(why.values()), "no vLLM server could be started"))
        self.prompt_ids = [p.prompt_id for p in prompts]
        model = str(live.config.model)
        self.prompts = [
            client.tokenize_chat(live.url, model, p.text) if spec.chat_template else p.text for p in prompts
        ]
        return {key: why[config] for key, config in self.configs.items() if config in why}

    def _start(self, config: VllmConfig) -> VllmServer:
        server = VllmServer(config, install=self.install).start()
        self.startups.append({"speculative_config": config.speculative_config, "startup_s": server.startup_s})
        return server

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        return {}, ["v(k) not measured: vLLM serves whole requests, it has no single-forward timing here"]

    def warm_up(self, plan: list[RunKey]) -> None:
        """One short request per server, on a text of no prompt of the session (a suffix server's global tree would
        learn it): first-request initialisation lands on no measurement."""
        assert self.spec is not None
        for server in self.servers.values():
            try:
                client.batch(server.url, str(server.config.model), [WARM_UP_TEXT], {"max_tokens": 4}, 0, 120.0)
            except EndpointError:
                pass

    def prime(self, index: int, ctx: DecodeContext) -> None:
        """Nothing: prefix caching is off, so a request leaves the next nothing to reuse, and the warm-up already took
        each server's first-request initialisation."""

    def reference_at(self, index: int, prefix: Sequence[int]) -> TargetTop | None:
        """One greedy request to the target-alone server, untimed: prompt `index`'s token ids, then `prefix`, and
        one token generated with its top TOP_LOGPROBS log-probs."""
        key = baseline_of(list(self.configs))
        server = self.servers.get(self.configs[key]) if key is not None else None
        if server is None:
            return None
        model, prompt = str(server.config.model), self.prompts[index]
        try:
            ids = prompt if isinstance(prompt, list) else client.tokenize(server.url, model, prompt)
            done = client.batch(
                server.url,
                model,
                [[*ids, *prefix]],
                self._sampling(0.0) | {"max_tokens": 1},
                TOP_LOGPROBS,
                self.request_timeout_s,
            ).completions[0]
        except EndpointError as exc:
            raise RunFailed(str(exc)) from None
        return TargetTop.of_pairs(done.top[0]) if done.top else None

    def _sampling(self, temperature: float) -> dict[str, Any]:
        assert self.spec is not None
        s = self.spec
        return {
            "max_tokens": s.max_new_tokens,
            "temperature": temperature,
            "seed": s.seed,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "ignore_eos": False,
        }

    def _batch(self, key: RunKey, index: int, top: int, ctx: DecodeContext) -> client.Batch:
        config = self.configs[key]
        server = self.servers.get(config)
        if server is None:
            raise RunFailed("its vLLM server is not running")
        order = [(index + j) % len(self.prompts) for j in range(key.concurrency)]
        prompts = [self.prompts[i] for i in order]
        try:
            return client.batch(
                server.url,
                str(config.model),
                prompts,
                self._sampling(key.temperature),
                top,
                self.request_timeout_s,
                ctx.should_stop,
            )
        except EndpointError as exc:
            tail = server.log_tail()
            if exc.kind != "timeout" and server.alive() and server.healthy():
                raise RunFailed(f"{exc}; its log ends:\n{tail}") from None
            server.stop()
            self.servers.pop(config, None)
            raise RunFailed(f"{exc}; its vLLM server is down or hung (stopped), its log ends:\n{tail}") from None

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        """Prompt `index` with concurrency − 1 neighbours in flight; logged as one step record for the batch."""
        t0 = time.time()
        batch = self._batch(key, index, 0, ctx)
        done = batch.completions[0]
        counters = batch.counters
        ctx.on_step(counters.step_record(index, batch.wall_s))
        output = PromptOutput(
            prompt_index=index,
            prompt_id=self.prompt_ids[index],
            prompt_tokens=done.prompt_tokens,
            token_ids=done.token_ids,
            text=done.text,
            from_draft=[],
            wall_time_s=time.time() - t0,
            steps=int(counters.target_calls),
            prefill_time_s=done.ttft_s or 0.0,
        )
        ttft = [c.ttft_s for c in batch.completions if c.ttft_s is not None]
        itl = [gap for c in batch.completions for gap in c.itl_s]
        self._time_split(key, index, counters, batch.wall_s)
        return Decoded(output, counters, batch.wall_s, tokens=int(counters.emitted), ttft_s=ttft, itl_s=itl)

    def _time_split(self, key: RunKey, index: int, counters: SpecCounters, wall_s: float) -> None:
        """One request alone in flight, as its steps spent the time: a target-alone step (the baseline), or its
        steps that verified a draft and those that did not. vLLM times neither its draft nor its verify apart, so
        the whole drafting step is the run's in-loop verify (engine.analysis.step_overhead): v(k) and c are not
        measured, and the step overhead fitted to these points is what a drafting step costs there."""
        calls = int(counters.target_calls)
        if calls < 1 or key.concurrency != 1:  # a batch's steps are shared by its requests: not one request's
            return
        if key.kind == "baseline":
            self.call_ms.setdefault(key.temperature, {}).setdefault(index, []).append(1000.0 * wall_s / calls)
            return
        drafts = int(counters.drafts)
        self.in_loop.setdefault(key, []).append(
            InLoop(index, 1000.0 * wall_s, 0.0, drafts, calls - drafts, float(counters.draft_tokens), 0)
        )

    def side_measure(self, index: int) -> None:
        pass

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        """Each speculative run's drafting step as measured with one request in flight (its LoopPoint)."""
        points, _ = loop_points(self.in_loop, lambda key: self.call_ms.get(key.temperature, {}))
        return EngineOutputs(notes=list(self.notes), loop_points=points)

    def describe(self) -> dict[str, Any]:
        """The vLLM install, the version the servers reported, the CPU kernel they loaded, start-up times."""
        if self.install is None:
            return {}
        live = next(iter(self.servers.values()), None)
        info = self.install.describe() | {"dtype": self.dtype, "startups": list(self.startups)}
        if live is not None:
            info |= {"server_version": live.version, "kernel": live.kernel}
        return {"vllm": info}

    def stop(self) -> None:
        for server in list(self.servers.values()):
            server.stop()
        self.servers.clear()
