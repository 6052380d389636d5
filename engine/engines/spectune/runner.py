"""spectune's own PyTorch loop as a session engine: the target and every draft loaded once, in-process.

Everything is timed in the loop, in units of the same prompt's target-alone step (its decode time ÷ its steps):
c is a request's draft-forward time per forward; each run's verify in the loop (what a drafting step costs beside
the draft's forwards: the target's forward, verification, the KV-cache crop, n-gram lookups) is a LoopPoint the
step overhead is fitted to (engine.analysis.step_overhead). v(k) is measured with k-token forwards of the target;
each draft's trace for the policy replay is recorded along the target-alone outputs (with β at every temperature
above 0). The session decodes in one loop, eager or compiled (engine.engines.spectune.loop), on a CPU with the
intra-op threads the free cores allow (engine.measure.threads); c, v(k) and every run are measured in that loop with
that count, and the report says which (`loop`, `threads`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import median
from typing import Any, ClassVar

from engine.analysis.prediction import DraftingLoop
from engine.analysis.step_overhead import InLoop, loop_points
from engine.core.compiled import use_compiled, use_eager
from engine.core.counters import SpecCounters
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.kvcache import top_after
from engine.core.model import LoadedModel
from engine.core.policy import PolicyRun
from engine.core.proposal import DraftSource, NoDraft
from engine.core.records import PromptOutput, StepRecord
from engine.core.sampling import SamplingConfig
from engine.drafts.factory import for_one_run, make_draft
from engine.drafts.kinds import kind_of_method
from engine.drafts.suffix import suffix_state
from engine.engines.spectune.loop import LoopChoice, choose_loop, widths_to_compile
from engine.engines.spectune.options import LoopOptions
from engine.measure.agreement import draft_trace
from engine.measure.fidelity import TargetTop
from engine.measure.first_pass import FirstPass
from engine.measure.threads import ThreadChoice, choose_threads
from engine.measure.verify_cost import verify_cost_curve
from engine.models.chat import encode_prompt
from engine.models.pool import ModelPool
from engine.session.aa_check import sweep_decodes
from engine.session.runner import DecodeContext, Decoded, EngineOutputs, PromptText, RunKey
from engine.session.spec import SessionSpec, check_context, gammas_and_policies, widest_draft

TOP_LOGITS_K = 16
LOOP_FIELDS = ("loop", "loop_basis", "compile_s", "threads", "threads_basis", "first_pass")  # its own report fields
WARM_UP_TOKENS = 4
PRIME_TOKENS = 4  # the compiled loop's prime: the prompt's prefill and this many steps


class SpectuneRunner:
    """The PyTorch loop (engine.core.decoder) behind the Runner interface."""

    name: ClassVar[str] = "spectune"
    unavailable: ClassVar[tuple[str, ...]] = ()
    drafting_loop: ClassVar[DraftingLoop] = DraftingLoop()

    def __init__(self, pool: ModelPool | None = None) -> None:
        self.pool = pool or ModelPool()
        self.dtype = "bfloat16"
        self.device = "cpu"
        self.target: LoadedModel | None = None
        self.drafts: dict[str, DraftSource] = {}
        self.encoded: list[tuple[PromptText, list[int]]] = []
        self.policy_runs: dict[RunKey, PolicyRun] = {}  # a policy's state, carried over the run's prompts
        self.run_drafts: dict[RunKey, DraftSource] = {}  # a stateful draft's state (suffix cache), one per run
        self.in_loop: dict[RunKey, list[InLoop]] = {}  # per speculative run: each prompt's split of its time
        self.call_ms: dict[float, dict[int, list[float]]] = {}  # per temperature, per prompt: a target-alone step
        self.spec: SessionSpec | None = None
        self.models: list[LoadedModel] = []  # every model this session decodes with: the target, then draft models
        self.threads: ThreadChoice | None = None
        self.threads_before: int | None = None
        self.loop = LoopChoice("eager", "not chosen yet")
        self.compile_s = 0.0
        self.first_pass = FirstPass()  # whether the eager loop still primes (engine.measure.first_pass)

    def _load(self, ref: str) -> LoadedModel:
        assert self.spec is not None
        model = self.pool.get(ref, self.spec.dtype, self.spec.device, self.spec.trust_remote_code)
        if all(model is not m for m in self.models):
            self.models.append(model)
        return model

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        self.spec, self.dtype = spec, spec.dtype
        options = LoopOptions.of(spec)
        ctx.phase("loading models", 0, 1, None)
        self.target = target = self._load(spec.target)
        self.device = str(target.device)
        self._set_threads(options.threads)
        for number, p in enumerate(prompts, start=1):  # named by its place in the session, not a database id
            ids = encode_prompt(target.tokenizer, p.text, spec.chat_template)
            check_context(len(ids), spec.max_new_tokens, target.max_context, f"prompt {number}")
            self.encoded.append((p, ids))
        for ref in dict.fromkeys(key.draft for key in plan if key.draft != "none"):
            self.drafts[ref] = make_draft(ref, target, self._load)
        self.policy_runs = {key: PolicyRun(key.policy) for key in plan if key.policy is not None}
        self.run_drafts = {key: for_one_run(self.drafts[key.draft]) for key in plan if key.draft in self.drafts}
        self._choose_loop(options.kind, ctx, sweep_decodes(plan, len(prompts)) * spec.max_new_tokens)
        return {}

    def _set_threads(self, requested: int | None) -> None:
        """On a CPU: the intra-op threads every configuration decodes with, from the cores free now (or as set)."""
        if self.device.startswith("cuda"):
            return
        import torch

        self.threads = choose_threads(requested)
        self.threads_before = torch.get_num_threads()
        torch.set_num_threads(self.threads.threads)

    def _choose_loop(self, asked: str, ctx: DecodeContext, tokens: int) -> None:
        """The loop every model of the session decodes in (auto: compiled only where it pays back over the sweep's
        `tokens`); a compiled loop compiles every width it will run now, as a phase of its own (a model compiled by
        an earlier session in this worker compiles nothing)."""
        assert self.target is not None and self.spec is not None
        from engine.measure.hardware import describe_hardware

        widest = widest_draft(*gammas_and_policies(self.spec)) + 1
        need = max(len(ids) for _, ids in self.encoded) + self.spec.max_new_tokens + widest + 1
        hardware = str(describe_hardware()["label"])
        pending = lambda: sum(widths_to_compile(m, need, widest) for m in self.models)  # noqa: E731
        self.loop = choose_loop(
            asked,
            self.target,
            self.encoded[0][1],
            need,
            widest,
            hardware,
            phase=lambda text: ctx.phase(text, 0, 1, None),
            tokens=tokens,
            to_compile=pending,
        )
        if self.loop.loop != "compiled":
            for model in self.models:
                use_eager(model)
            return
        started = time.perf_counter()
        try:
            for done, model in enumerate(self.models):
                ctx.phase(f"compiling {model.ref}", done, len(self.models), None)
                use_compiled(model, need, widest).compile(range(1, widest + 1))
        except Exception as exc:  # noqa: BLE001 - a model or backend that does not compile decodes eagerly, said so
            for model in self.models:
                use_eager(model)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.loop = LoopChoice("eager", f"the compiled loop failed to compile ({type(exc).__name__}: {reason})")
        self.compile_s = time.perf_counter() - started

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        assert self.target is not None
        return verify_cost_curve(self.target, self.encoded[0][1], widest), []

    def warm_up(self, plan: list[RunKey]) -> None:
        """A few tokens through the target alone and each draft: the first forward of a model pays for lazy
        initialisation, which would otherwise land on the first prompt's ratio. Nothing is recorded."""
        assert self.target is not None and self.spec is not None
        gamma = min(self.spec.gammas) if self.spec.gammas else 1
        for source in [NoDraft(), *self.drafts.values()]:
            drafted = gamma if kind_of_method(source.method).speculates else 0
            cfg = DecodeConfig(drafted, SamplingConfig(0.0), WARM_UP_TOKENS, self.spec.seed)
            decode_prompt(self.target, source, self.encoded[0][1], cfg, on_step=lambda rec: None)

    def prime(self, index: int, ctx: DecodeContext) -> None:
        """The target alone decodes prompt `index` untimed and unstored before any configuration does. The compiled
        loop, whose shapes are static: the prefill and PRIME_TOKENS steps. The eager loop, whose every new length is
        a new shape: every token, until the first passes of the first prompts are measured to cost no more than a
        later pass (engine.measure.first_pass); then nothing."""
        assert self.target is not None and self.spec is not None
        compiled = self.loop.loop == "compiled"
        if not compiled and not self.first_pass.needs_prime():
            return
        steps = [0]

        def count(record: StepRecord) -> None:
            steps[0] += 1

        tokens = PRIME_TOKENS if compiled else self.spec.max_new_tokens
        cfg = DecodeConfig(0, SamplingConfig(0.0), min(tokens, self.spec.max_new_tokens), self.spec.seed)
        out, _ = decode_prompt(
            self.target, NoDraft(), self.encoded[index][1], cfg, on_step=count, should_stop=ctx.should_stop
        )
        if not compiled and steps[0]:
            self.first_pass.primed(index, (out.wall_time_s - out.prefill_time_s) * 1000.0 / steps[0])

    def reference_at(self, index: int, prefix: Sequence[int]) -> TargetTop | None:
        """One eager forward of the target over prompt `index` and `prefix`: its top TOP_LOGITS_K logits next."""
        assert self.target is not None
        values, ids = top_after(self.target, self.encoded[index][1] + list(prefix), TOP_LOGITS_K)
        return TargetTop(values, ids)

    def _config(self, key: RunKey) -> DecodeConfig:
        assert self.spec is not None
        s = self.spec
        sampling = SamplingConfig(key.temperature, s.top_k, s.top_p)
        return DecodeConfig(key.most_drafted, sampling, s.max_new_tokens, s.seed, policy=key.policy)

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        assert self.target is not None
        prompt, ids = self.encoded[index]
        counters = SpecCounters()
        records: list[StepRecord] = []

        def on_step(rec: StepRecord) -> None:
            counters.add_step(rec.gamma, rec.accepted, rec.emitted, rec.accept_mask)
            records.append(rec)
            ctx.on_step(rec)

        source = self.run_drafts.get(key, NoDraft())
        out, _ = decode_prompt(
            self.target,
            source,
            ids,
            self._config(key),
            prompt_index=index,
            prompt_id=prompt.prompt_id,
            on_step=on_step,
            should_stop=ctx.should_stop,
            policy_run=self.policy_runs.get(key),
        )
        decode_s = out.wall_time_s - out.prefill_time_s
        if key.kind != "baseline" or reference:  # the A/A decode (no reference) is the floor's alone
            self._time_split(key, index, records, decode_s)
        return Decoded(out, counters, decode_s)

    def _time_split(self, key: RunKey, index: int, records: list[StepRecord], decode_s: float) -> None:
        """The prompt's decode time as the loop spent it: a target-alone step (the baseline), or the draft's
        forwards and the rest (a speculative run). A step that drafted without a forward (n-gram lookup, suffix
        tree) leaves its drafting time in the rest, which the step overhead charges."""
        if key.kind == "baseline":
            if records:
                step_ms = decode_s * 1000.0 / len(records)
                self.call_ms.setdefault(key.temperature, {}).setdefault(index, []).append(step_ms)
                self.first_pass.timed(index, step_ms)
            return
        forward = [r for r in records if r.draft_forwards > 0]
        draft_ms = 1000.0 * sum(r.draft_time_s for r in forward)
        forwards = sum(r.draft_forwards for r in forward)
        drafting = sum(1 for r in records if r.gamma > 0)
        self.in_loop.setdefault(key, []).append(
            InLoop(
                index,
                decode_s * 1000.0 - draft_ms,
                draft_ms,
                drafting,
                len(records) - drafting,
                float(sum(r.gamma for r in records)),
                forwards,
            )
        )

    def side_measure(self, index: int) -> None:
        pass

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        """c per draft and each run's verify, as the loop measured them; and (unless the context says they are
        recorded already) one teacher-forced pass per draft along the greedy baseline: agreement runs and the
        trace every policy replays from (β at each temperature above 0)."""
        assert self.target is not None and self.spec is not None
        points, in_loop = loop_points(self.in_loop, lambda key: self.call_ms.get(key.temperature, {}))
        costs = {ref: median(values) for ref, values in in_loop.items()}
        primed = [line for line in [self.first_pass.sentence(len(self.encoded))] if line]
        if not ctx.record_traces:
            return EngineOutputs(draft_costs=costs, loop_points=points, notes=primed)
        outputs = baselines.get(0.0) or next(iter(baselines.values()), [])
        hot = [SamplingConfig(t, self.spec.top_k, self.spec.top_p) for t in self.spec.temperatures if t > 0]
        traces: dict[str, list[dict[str, Any]]] = {}
        for done, (ref, source) in enumerate(self.drafts.items()):
            ctx.phase("agreement pass", done, len(self.drafts), None)
            source = for_one_run(source)  # a suffix cache sees the prompts in the runs' order, from empty
            traces[ref] = [
                draft_trace(source, ids, out.token_ids, self.spec.max_new_tokens, target=self.target, samplings=hot)
                for (_, ids), out in zip(self.encoded, outputs, strict=True)
            ]
        notes = [] if 0.0 in baselines else ["traces recorded along the sampled baseline: no greedy baseline ran"]
        notes = notes if traces else []
        return EngineOutputs(traces=traces, draft_costs=costs, loop_points=points, notes=primed + notes)

    def describe(self) -> dict[str, Any]:
        """The loop and threads every figure was measured with, the eager prime's first passes (None where it
        primed none), and the suffix drafts' cache state."""
        threads = self.threads
        primed = self.first_pass.to_dict(len(self.encoded)) if self.first_pass.prime_ms else None
        values = (
            self.loop.loop,
            self.loop.basis,
            round(self.compile_s, 1),
            threads.threads if threads else None,
            threads.basis if threads else None,
            primed,
        )
        loop = dict(zip(LOOP_FIELDS, values, strict=True))
        prompt_ids = [p.prompt_id for p, _ in self.encoded]
        return loop | suffix_state({k.label(): s for k, s in self.run_drafts.items()}, prompt_ids)

    def stop(self) -> None:
        self.drafts.clear()
        if self.threads_before is not None:
            import torch

            torch.set_num_threads(self.threads_before)
            self.threads_before = None
