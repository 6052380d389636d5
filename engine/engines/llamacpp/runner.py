"""llama.cpp as a session engine: one llama-server on 127.0.0.1 per distinct configuration, managed by us.

Configurations are the target alone, each draft × γ, n-gram lookup, and each draft model × a policy llama-server
runs as is (engine.engines.llamacpp.policy_flags); temperatures share a server. Per request the server reports its
timings and draft counts; its /metrics counters before and after give the target calls and the per-position
acceptance exactly. What llama.cpp cannot give is named, not guessed: β per position (so α as mean β) and which
output tokens came from the draft. c is the draft alone's time per token ÷ the target alone's, both measured by
llama-server on the same prompts, interleaved with them, or where the server logged it, the draft's own time inside
the speculative loop (engine.engines.llamacpp.draft_stats) ÷ the target alone's time per call; v(k) comes from
llama-bench, and what a drafting step's target call costs beyond it (llama-server's step overhead) from each run's
own timings. Each draft model's trace for the policy replay is the draft in PyTorch (float32) teacher-forced along
llama.cpp's own target-alone outputs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any, ClassVar

from engine.analysis.export.refs import prepared_gguf
from engine.analysis.prediction import DraftingLoop
from engine.analysis.step_overhead import InLoop, loop_points
from engine.core.policy import FixedGamma
from engine.core.records import Cancelled, PromptOutput
from engine.drafts.kinds import draft_kind
from engine.drafts.model import ModelDraft
from engine.engines.llamacpp import client
from engine.engines.llamacpp.bench import batch_times
from engine.engines.llamacpp.binaries import LlamaBuild, find_llama
from engine.engines.llamacpp.draft_stats import TAIL_BYTES, DraftStats, after_request, last_stats
from engine.engines.llamacpp.launch import server_for_draft, speculative_server
from engine.engines.llamacpp.memory import (
    RESERVE_BYTES,
    ServerMemory,
    available_bytes,
    estimate,
    gib,
    need,
    plan_sentence,
    private_bytes,
    together,
)
from engine.engines.llamacpp.policy_flags import draft_forwards, llamacpp_fields, unmappable
from engine.engines.llamacpp.server import ManagedServer, ServerConfig, ServerError
from engine.errors import ModelError, SettingsError, SpectuneError
from engine.measure.agreement import draft_trace
from engine.measure.fidelity import TargetTop
from engine.measure.verify_cost import from_rounds, verify_ks
from engine.models.bundled import gguf_for
from engine.models.pool import ModelPool
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

WARM_UP_TEXT, WARM_UP_TOKENS = "Warm-up request.", 4  # each server's first request, untimed
TOP_LOGPROBS = 16  # the target's top log-probs where an output diverged, for the fidelity verdict
STOP_TIMEOUT_S = 2.0  # a server's grace between SIGTERM and SIGKILL when the session stops


def validate_llamacpp(spec: SessionSpec, n_prompts: int | None = None) -> None:
    """The common checks, then what llama-server can run: fixed γ and the confidence stop, with a draft model."""
    validate(spec, n_prompts)
    gammas, varying = gammas_and_policies(spec)
    for policy in varying:
        if llamacpp_fields(policy) is None:
            raise SettingsError(unmappable(policy))
    kinds = [draft_kind(d) for d in spec.drafts]
    unsure = sorted({k.label for k in kinds if k.speculates and not k.reports_confidence})  # no draft confidence
    if varying and not any(k.reports_confidence for k in kinds):
        without = f" ({', '.join(unsure)} has no draft confidence)" if unsure else ""
        specs = ", ".join(p.spec() for p in varying)
        raise SettingsError(f"llama.cpp runs {specs} with a draft model only{without}: add a draft model")
    if not gammas and unsure:
        raise SettingsError(f"no γ given for {', '.join(unsure)}: llama.cpp runs policies with draft models only")


def server_configs(
    spec: SessionSpec,
    plan: Sequence[RunKey],
    threads: int | None = None,
    locate: Callable[[str, str], Path] = gguf_for,
) -> tuple[dict[RunKey, ServerConfig], dict[str, ServerConfig]]:
    """The llama-servers a session runs: one per configuration of `plan` (the target alone, n-gram lookup, a draft
    model under a fixed γ or a policy), and each draft model alone (its time per token gives c). `locate`: a model
    reference and its role to its GGUF file (a session's gguf_for assembles a bundled one)."""
    target = locate(spec.target, "target")
    drafts = {
        k.draft: locate(k.draft, "draft") for k in plan if k.kind != "baseline" and draft_kind(k.draft).needs_model
    }

    def config(key: RunKey) -> ServerConfig:
        if key.kind == "baseline":
            return speculative_server(target, threads=threads)
        policy = key.policy if key.policy is not None else FixedGamma(key.gamma)
        return server_for_draft(target, key.draft, policy, lambda ref, role: drafts[ref], threads=threads)

    return {key: config(key) for key in plan}, {ref: speculative_server(path) for ref, path in drafts.items()}


def every_server(configs: dict[RunKey, ServerConfig], alone: dict[str, ServerConfig]) -> list[ServerConfig]:
    """Each distinct server of server_configs once, in the order they start."""
    return list(dict.fromkeys([*configs.values(), *alone.values()]))


def memory_plan(wanted: list[ServerConfig]) -> tuple[dict[ServerConfig, ServerMemory], int, str]:
    """Each server's memory estimate, how many of them fit at once in the memory available now, and the sentence
    saying so (engine.engines.llamacpp.memory.plan_sentence)."""
    memory = {config: estimate(config) for config in wanted}
    fit, sentence = plan_sentence([memory[c] for c in wanted], available_bytes())
    return memory, fit, sentence


def memory_before(spec: SessionSpec, plan: Sequence[RunKey]) -> tuple[int, str]:
    """What a session's llama-servers will hold at most together, and the sentence its start will note, said before
    it is queued, from the GGUF files on disk (ModelError for one not prepared yet: nothing is assembled here)."""
    memory, _, sentence = memory_plan(every_server(*server_configs(spec, plan, locate=_prepared)))
    return together(memory.values()), sentence


def _prepared(ref: str, role: str) -> Path:
    if (path := prepared_gguf(ref)) is None:
        raise ModelError(f"{role} {ref}: no GGUF file on disk yet")
    return path


class LlamaCppRunner:
    """Managed llama-servers behind the Runner interface."""

    name: ClassVar[str] = "llama.cpp"
    unavailable: ClassVar[tuple[str, ...]] = ("alpha", "beta_per_position", "from_draft")
    # llama-server's draft sampler stops on its top-10 p, n_decode counts the token sampled from the prompt's forward,
    # and ngram-simple looks up one length (launch.ngram_simple_size)
    drafting_loop: ClassVar[DraftingLoop] = DraftingLoop(confidence="top10", prompt_call=True, one_ngram_length=True)
    dtype = "gguf"
    device = "cpu"

    def __init__(
        self, pool: ModelPool | None = None, build: LlamaBuild | None = None, threads: int | None = None
    ) -> None:
        """`pool` is not used: the drafts' float32 copies for their traces live in a pool of their own, freed after
        each trace, so the worker's pool never holds them."""
        self.build = build
        self.threads = threads
        self.spec: SessionSpec | None = None
        self.target: Path | None = None
        self.configs: dict[RunKey, ServerConfig] = {}
        self.servers: dict[ServerConfig, ManagedServer] = {}
        self.alone: dict[str, ServerConfig] = {}  # each draft model alone: its time per token gives c
        self.alone_rates: dict[str, list[float]] = {}
        self.target_rates: list[float] = []
        self.texts: list[str] = []
        self.prompt_ids: list[str] = []
        self.memory: dict[ServerConfig, ServerMemory] = {}  # each server's estimate (engine.engines.llamacpp.memory)
        self.resident_limit = 0  # how many servers may run at once: as many as fit in memory
        self.failed: dict[ServerConfig, str] = {}  # servers that would not start or crashed: not started again
        self.restarts = 0  # servers started after the first round of starts, to take their turn
        self.notes: list[str] = []
        self.call_ms: dict[int, list[float]] = {}  # per prompt: the target alone's ms per call (T=0)
        self.in_loop: dict[RunKey, list[InLoop]] = {}  # per draft-model run: each request's split of its time
        self.should_stop: Callable[[], bool] = lambda: False  # the session's: a stop interrupts what is running

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        self.spec, self.should_stop = spec, ctx.should_stop
        self.build = self.build or find_llama()
        self.target = gguf_for(spec.target, "target")
        self.configs, self.alone = server_configs(spec, plan, self.threads)
        wanted = every_server(self.configs, self.alone)
        self.resident_limit = self._fit(wanted, ctx)
        turns = f" ({self.resident_limit} fit in memory at once)" if self.resident_limit < len(wanted) else ""
        for started, config in enumerate(wanted[: self.resident_limit]):
            if ctx.should_stop():
                raise Cancelled()
            ctx.phase(f"starting llama-server {started + 1} of {len(wanted)}{turns}", started, len(wanted), None)
            try:
                self.servers[config] = self._start(config)
            except ServerError as exc:
                self.failed[config] = str(exc)
        if ctx.should_stop():  # told to stop while a server started: that is no failure of its configuration
            raise Cancelled()
        live = next((s for s in self.servers.values()), None)
        if live is None:
            raise ServerError(next(iter(self.failed.values()), "no llama-server could be started"))
        self.prompt_ids = [p.prompt_id for p in prompts]
        self.texts = [client.chat_prompt(live.url, p.text) if spec.chat_template else p.text for p in prompts]
        return {key: self.failed[config] for key, config in self.configs.items() if config in self.failed}

    def _fit(self, wanted: list[ServerConfig], ctx: DecodeContext) -> int:
        """How many of `wanted` may be resident at once, said before any starts (a phase and the report's notes);
        ServerError with the numbers when not even one fits."""
        ctx.phase("estimating the llama-servers' memory", 0, len(wanted), None)
        self.memory, fit, sentence = memory_plan(wanted)
        if fit == 0:
            raise ServerError(
                f"not enough memory for this session: {sentence} Close other programs or measure a smaller model."
            )
        self.notes.append(f"memory: {sentence}")
        return fit

    def _start(self, config: ServerConfig) -> ManagedServer:
        server = ManagedServer(config, build=self.build, should_stop=self.should_stop)
        server.start()
        if config.spec_type is not None and not client.speculating(server.url):
            errors = "; ".join(line.split(": ", 1)[-1] for line in server.log_errors()) or "no reason logged"
            server.stop()
            raise ServerError(f"llama-server started with speculation off ({errors})")
        return server

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        assert self.build is not None and self.target is not None
        try:
            rounds = batch_times(
                self.build, self.target, verify_ks(widest), 5, self.threads, should_stop=self.should_stop
            )  # llama-bench's k-token batches, interleaved
            return from_rounds(rounds).curve, []
        except ServerError as exc:
            return {}, [f"v(k) not measured: {exc}"]

    def warm_up(self, plan: list[RunKey]) -> None:
        """One short untimed request to each configuration's server, on a text of no prompt of the session: the
        servers start with --no-warmup, so a server's first request would otherwise pay its first pass."""
        for config in dict.fromkeys(self.configs[key] for key in plan if key in self.configs):
            if self.should_stop():
                return
            with contextlib.suppress(RunFailed, ServerError):
                client.complete(self._resident(config).url, WARM_UP_TEXT, WARM_UP_TOKENS)

    def prime(self, index: int, ctx: DecodeContext) -> None:
        """Nothing: a request caches no prompt (cache_prompt is off), and the warm-up took each server's first pass,
        so no first pass over a prompt lands on a timed request."""

    def reference_at(self, index: int, prefix: Sequence[int]) -> TargetTop | None:
        """One greedy request to the target-alone server, untimed: prompt `index`, then the tokens `prefix`, and one
        token predicted with its top TOP_LOGPROBS log-probs."""
        key = baseline_of(list(self.configs))
        if key is None or self.spec is None:
            return None
        server = self._resident(self.configs[key])
        prompt: str | list[str | int] = [self.texts[index], *prefix] if prefix else self.texts[index]
        try:
            done = client.complete(server.url, prompt, 1, 0.0, self.spec.seed, n_probs=TOP_LOGPROBS)
        except ServerError as exc:
            raise RunFailed(str(exc)) from None
        return TargetTop.of_pairs(done.top_logprobs[0]) if done.top_logprobs else None

    def _resident(self, config: ServerConfig) -> ManagedServer:
        """The running server of `config`, started now if it is not resident: the server used last is stopped to
        make room while too many run or the memory it needs is not available (every configuration is visited once
        per prompt, so the one used last is needed again the latest)."""
        if config in self.failed:
            raise RunFailed(f"its llama-server is not running ({self.failed[config].splitlines()[0]})")
        server = self.servers.pop(config, None)
        if server is None:
            self._make_room(config)
            try:
                server = self._start(config)
            except ServerError as exc:
                if self.should_stop():
                    raise Cancelled() from None
                self.failed[config] = str(exc)
                raise RunFailed(str(exc)) from None
            self.restarts += 1
        self.servers[config] = server  # last in the order: the one used last
        return server

    def _make_room(self, config: ServerConfig) -> None:
        """Stop resident servers (the one used last first) until `config`'s fits; RunFailed with the numbers when it
        does not fit with none left."""
        while True:
            short = self._shortfall(config)
            if short <= 0 and len(self.servers) < self.resident_limit:
                return
            if not self.servers:
                now = f"{gib(available_bytes())}, {gib(RESERVE_BYTES)} kept free"
                raise RunFailed(
                    f"not enough memory to start its llama-server: it needs {gib(short)} more than is "
                    f"available now ({now})"
                )
            last = next(reversed(self.servers))
            self.servers.pop(last).stop()

    def _shortfall(self, config: ServerConfig) -> int:
        """Bytes `config`'s server needs beyond what is available now, counting what the resident servers may still
        grow into (their estimate less what they hold, measured)."""
        resident = [self.memory[c] for c in self.servers]
        growth = 0
        for c, server in self.servers.items():
            held = private_bytes(server.proc.pid) if server.proc is not None else None
            growth += max(0, self.memory[c].private - (held if held is not None else 0))
        return need(self.memory[config], resident, growth) - (available_bytes() - RESERVE_BYTES)

    def _request(
        self, config: ServerConfig, text: str, temperature: float, n_probs: int
    ) -> tuple[client.Completion, Any]:
        assert self.spec is not None
        server = self._resident(config)
        s = self.spec
        try:
            before = client.metrics(server.url)
            done = self._until_stopped(
                server,
                lambda: client.complete(
                    server.url, text, s.max_new_tokens, temperature, s.seed, s.top_k, s.top_p, n_probs=n_probs
                ),
            )
            return done, client.metrics(server.url).minus(before)
        except ServerError as exc:
            if server.alive():
                raise RunFailed(str(exc)) from None
            tail = server.log_tail()
            server.stop()
            self.servers.pop(config, None)
            self.failed[config] = str(exc)
            raise RunFailed(f"{exc}; its log ends:\n{tail}") from None

    def _until_stopped(self, server: ManagedServer, call: Callable[[], client.Completion]) -> client.Completion:
        """`call` (one request to `server`), or Cancelled as soon as the session is told to stop: the server is
        stopped with the request in flight (a request decodes up to max_new_tokens, a minute on a busy CPU)."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["done"] = call()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name="llama-request", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.2)
            if thread.is_alive() and self.should_stop():
                raise Cancelled()  # the sweep's stop() stops the server, and the request dies with it
        if "error" in box:
            raise box["error"]
        return box["done"]

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        """One request; logged as one step record that covers all its target calls (the draft's share of its time
        where the server logged it)."""
        config = self.configs[key]
        t0 = time.time()
        before = self._draft_stats(config) if config.spec_type == "draft-simple" else None
        done, delta = self._request(config, self.texts[index], key.temperature, 0)
        drafted = self._drafted_since(config, before) if before is not None else None
        calls = int(delta.target_calls) or max(1, done.predicted_n - done.draft_n_accepted)
        if key.kind == "baseline" and key.temperature == 0 and done.predicted_ms > 0:
            self.target_rates.append(done.predicted_n / (done.predicted_ms / 1000.0))
            if calls > 1:  # the first token is sampled from the prompt's forward, timed as prompt_ms
                self.call_ms.setdefault(index, []).append(done.predicted_ms / (calls - 1))
        delta.target_calls, delta.emitted = float(calls), float(done.predicted_n)
        costs = key.kind != "baseline" and draft_kind(key.draft).costs_forwards
        forwards = draft_forwards(delta, 1, config.draft_p_min) if costs else 0
        draft_ms = drafted.ms if drafted is not None else 0.0
        if drafted is not None and drafted.calls > 0:
            target_ms, plain_calls = done.predicted_ms - draft_ms, max(0, calls - 1 - drafted.calls)
            step = InLoop(index, target_ms, draft_ms, drafted.calls, plain_calls, delta.draft_tokens, forwards)
            self.in_loop.setdefault(key, []).append(step)
        ctx.on_step(done.step_record(index, draft_ms, forwards, calls))
        output = done.prompt_output(index, self.prompt_ids[index], time.time() - t0, calls)
        return Decoded(output, delta, done.predicted_ms / 1000.0)

    def _draft_stats(self, config: ServerConfig) -> DraftStats:
        """The draft's statistics its server has logged so far (none yet: a server still to start counts from 0)."""
        server = self.servers.get(config)
        return (last_stats(server.log_tail(TAIL_BYTES)) if server is not None else None) or DraftStats()

    def _drafted_since(self, config: ServerConfig, before: DraftStats) -> DraftStats | None:
        """The draft's share of the request just made (None when its server did not log it in time)."""
        server = self.servers.get(config)
        if server is None:
            return None
        after = after_request(lambda: server.log_tail(TAIL_BYTES), before)
        return after.minus(before) if after is not None else None

    def side_measure(self, index: int) -> None:
        """Each draft model alone on this prompt, right after the prompt's round: c from neighbouring requests."""
        for ref, config in self.alone.items():
            try:
                done, _ = self._request(config, self.texts[index], 0.0, 0)
            except RunFailed:
                continue
            if done.predicted_ms > 0:
                self.alone_rates.setdefault(ref, []).append(done.predicted_n / (done.predicted_ms / 1000.0))

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        """c per draft model and its trace; the servers are stopped first: the traces' float32 drafts need the
        memory, and decoding is over."""
        self.stop()
        target_rate = median(self.target_rates) if self.target_rates else 0.0
        costs = {ref: target_rate / median(rates) for ref, rates in self.alone_rates.items() if rates and target_rate}
        points, in_loop = loop_points(self.in_loop, lambda key: self.call_ms)
        for ref, values in in_loop.items():
            alone = f"{costs[ref]:.3f}" if ref in costs else "not measured"
            self.notes.append(
                f"c of {ref}: {median(values):.3f} inside llama-server's loop (its logged draft time), "
                f"{alone} alone; the loop's is used"
            )
            costs[ref] = median(values)
        out = EngineOutputs(draft_costs=costs, notes=list(self.notes), loop_points=points)
        if self.build is not None and (why := self.build.describe()["no_repack"]):
            out.notes.append(
                f"kernels: {why} (engine.engines.llamacpp.kernels); its speeds are those of the plain kernels"
            )
        if self.restarts:
            out.notes.append(
                f"memory: {self.restarts} llama-server start(s) after the first round, each to take "
                f"its configuration's turn (at most {self.resident_limit} resident at once)"
            )
        speculated = [
            ref for ref in self.alone if any(k.draft == ref and c not in self.failed for k, c in self.configs.items())
        ]
        # every draft model's trace: the Policies page replays any llama.cpp session (a confirmation has them)
        if speculated and ctx.record_traces:
            out.traces = self._traces(speculated, baselines.get(0.0), ctx, out.notes)
        return out

    def _traces(
        self, drafts: list[str], outputs: list[PromptOutput] | None, ctx: DecodeContext, notes: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        """Per draft model, one trace per prompt: the draft in PyTorch (float32) teacher-forced along llama.cpp's
        own target-alone outputs at temperature 0 (none without that baseline on every prompt)."""
        assert self.spec is not None
        if outputs is None or len(outputs) != len(self.texts):
            notes.append("no policy replay: the target alone was not measured at temperature 0 on every prompt")
            return {}
        pool = ModelPool()
        traces: dict[str, list[dict[str, Any]]] = {}
        for done, ref in enumerate(drafts):
            if ctx.should_stop():
                raise Cancelled()
            ctx.phase(f"recording {ref}'s trace for the policy replay (PyTorch, float32)", done, len(drafts), None)
            try:
                draft = pool.get(ref, "float32", "cpu", self.spec.trust_remote_code)
            except SpectuneError as exc:
                notes.append(f"no policy replay for {ref}: {exc}")
                continue
            if any(t >= draft.vocab_size for output in outputs for t in output.token_ids):
                notes.append(f"no policy replay for {ref}: its vocabulary is not the target's")
            else:
                source = ModelDraft(draft, draft.vocab_size)
                traces[ref] = [
                    draft_trace(source, draft.tokenizer.encode(text), output.token_ids, self.spec.max_new_tokens)
                    for text, output in zip(self.texts, outputs, strict=True)
                ]
            pool.clear()
        return traces

    def describe(self) -> dict[str, Any]:
        return {"llama_cpp": self.build.describe()} if self.build is not None else {}

    def stop(self) -> None:
        """Stop every server at once (each is SIGKILLed if it has not exited 2 s after its SIGTERM): measurement is
        over, and a stop must not wait for servers one after another."""
        servers, self.servers = list(self.servers.values()), {}
        stopping = [threading.Thread(target=server.stop, args=(STOP_TIMEOUT_S,)) for server in servers]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
