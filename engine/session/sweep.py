"""The one sweep driver: a session's plan measured in any engine (a Runner), interleaved prompt by prompt.

For each prompt the runner first primes it, untimed, as far as its loop needs (a decode's first pass over a prompt's
shapes runs slower than every later one: in an eager loop on a GPU 1.5–4.5×, which a baseline that always decodes
first would pay alone); then every configuration decodes it, the baseline at each temperature included and, on a
stratified subset of the prompts (engine.session.aa_check), a second measurement of the target alone (the A/A check),
in an order that rotates from prompt to prompt (so whatever the first decode after the prime still
pays lands on each configuration in turn, and no configuration is always another's neighbour).
Each speedup is a median of per-prompt ratios of neighbouring measurements, with its spread and a noise verdict,
and a change in the machine's load between minutes does not show up as a speedup. The A/A ratios are the session's
measurement floor (engine.measure.noise.MeasurementFloor): when target ÷ target lands outside its own noise band,
every speedup of the sweep is marked too noisy to tell. The machine's load is read around every decode; every output
is judged against the baseline at its temperature (engine.session.judging). The CLI's `run` and the worker's
sessions both go through `run_sweep`; hooks let the worker log every step to the store and honour cancellation, and,
for a re-queued session, hand back what an earlier attempt measured (`measured`): those configuration × prompt pairs
are counted as they were, not decoded again (engine.service.worker.resume)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.step_overhead import LoopPoint, StepOverhead, fit_step_overhead
from engine.analysis.theory import fit_verify_cost
from engine.core.records import Cancelled
from engine.drafts.kinds import draft_method
from engine.measure import noise
from engine.measure.noise import MeasurementFloor, MeasurementOverhead
from engine.measure.telemetry import LoadMeter
from engine.session.aa_check import aa_prompts, decode_orders, sweep_decodes
from engine.session.hooks import Hooks, PhaseClock
from engine.session.judging import Judge
from engine.session.runner import (
    DecodeContext,
    Decoded,
    EngineOutputs,
    Enough,
    PromptText,
    RunFailed,
    RunKey,
    Runner,
    plan_runs,
)
from engine.session.spec import SessionSpec, gammas_and_policies, widest_draft
from engine.session.summarise import RunTally, policy_live, public_run, summarise
from engine.session.summary import RunSummary

__all__ = ["Hooks", "PromptText", "SweepReport", "run_sweep"]


@dataclass
class SweepReport:
    """What a sweep measured, the same fields for every engine (`to_dict()` is the CLI's JSON contract)."""

    target: str
    engine: str
    dtype: str
    device: str
    settings: dict[str, Any]
    verify_cost: dict[int, float]
    baseline: dict[str, Any]  # the baseline at temperature 0 (else the first temperature)
    baselines: list[dict[str, Any]]  # one per temperature
    runs: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    noisy_runs: list[str] = field(default_factory=list)
    impossible_runs: list[str] = field(default_factory=list)  # runs whose measured speedup breaks its bound
    machine_load: dict[str, Any] | None = None
    machine_note: str | None = None
    phase_times_s: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None  # why the engine stopped the session early (what it measured is kept)
    hardware: str | None = None  # what the numbers ran on, where that is not this machine (a deployment)
    quick: dict[str, Any] | None = None  # a quick session: what the probe led to and its confirmation
    confirmation: dict[str, Any] | None = None  # a full session's headline confirmed (engine.service.worker.sweeps)
    engine_info: dict[str, Any] = field(default_factory=dict)  # the runner's own fields (a build, a version)
    measurement_floor: dict[str, Any] | None = None  # the A/A check (noise.MeasurementFloor.to_dict())
    measurement_overhead: dict[str, Any] | None = None  # the prime's and the A/A's cost (noise.MeasurementOverhead)

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "engine_info"}
        data["verify_cost"] = {str(k): v for k, v in self.verify_cost.items()}
        data["baseline_tokens_per_s"] = self.baseline.get("tokens_per_s")
        return data | self.engine_info


def run_sweep(
    runner: Runner,
    spec: SessionSpec,
    prompts: Sequence[PromptText],
    hooks: Hooks | None = None,
    levels: Sequence[int] = (1,),
    plan: list[RunKey] | None = None,
    verify_cost: dict[int, float] | None = None,
    traces: bool = True,
    aa_check: bool = True,
) -> SweepReport:
    """`plan` (by default the baseline at each temperature + every draft × γ × temperature + every draft × policy ×
    temperature, each at every concurrency of `levels`) measured in `runner`, which is stopped on the way out,
    whatever happens; `verify_cost` given (measured before, in the same session) is not measured again, nor the
    drafts' traces when `traces` is False (a quick session's confirmation: its probe recorded them), nor the A/A
    check when `aa_check` is False (a confirmation, judged by its session's floor). The spec is validated by its
    engine first (engine.engines.registry.sweep)."""
    hooks = hooks or Hooks()
    clock = PhaseClock(hooks)
    plan = plan if plan is not None else plan_runs(spec, levels)
    ctx = DecodeContext(
        on_step=lambda record: None, should_stop=hooks.should_stop, phase=clock.start, record_traces=traces
    )
    try:
        failures = runner.start(spec, prompts, plan, ctx)
        tallies = {key: RunTally(key, hooks.run_started(key.as_dict())) for key in plan}
        for key, message in failures.items():
            _fail(tallies[key], hooks, f"{key.label()}: {message}")
        _require_a_baseline(tallies)
        restored = _restore(tallies, hooks)
        verify_cost, notes = (verify_cost, []) if verify_cost is not None else _verify_cost(runner, spec, clock)
        clock.start("warming up", 0, 1)
        runner.warm_up([key for key, t in tallies.items() if t.failed is None])
        floor, overhead = _decode_all(runner, prompts, tallies, hooks, clock, restored, aa_check)
        baselines = _baselines(tallies)
        lowest = min(key.concurrency for key in plan) if plan else 1
        alone = {key.temperature: t.outputs for key, t in baselines.items() if key.concurrency == lowest}
        extra = runner.finish(alone, ctx)
        report = _report(runner, spec, tallies, baselines, verify_cost, notes + extra.notes, extra, hooks, clock, floor)
        report.measurement_overhead = overhead.to_dict()
        return report
    finally:
        runner.stop()


def _verify_cost(runner: Runner, spec: SessionSpec, clock: PhaseClock) -> tuple[dict[int, float], list[str]]:
    if not spec.measure_verify_cost:
        return {1: 1.0}, []
    clock.start("measuring v(k)", 0, 1)
    return runner.verify_cost(widest_draft(*gammas_and_policies(spec)) + 1)


def _restore(tallies: dict[RunKey, RunTally], hooks: Hooks) -> dict[RunKey, set[int]]:
    """What an earlier attempt of a resumed session measured (hooks with `measured`: the worker's), counted in each
    configuration's tally as if decoded now; per configuration, the prompt indices not to decode again."""
    measured = getattr(hooks, "measured", None)
    restored: dict[RunKey, set[int]] = {}
    if measured is None:
        return restored
    for key, tally in tallies.items():
        earlier = measured(tally.handle) if tally.failed is None else {}
        for index in sorted(earlier):
            for record in earlier[index].records:
                tally.step(record)
            tally.add(index, earlier[index].decoded, earlier[index].wall_s)
            tally.divergences.append(earlier[index].divergence)
        restored[key] = set(earlier)
    return restored


def _decode_all(
    runner: Runner,
    prompts: Sequence[PromptText],
    tallies: dict[RunKey, RunTally],
    hooks: Hooks,
    clock: PhaseClock,
    restored: dict[RunKey, set[int]] | None = None,
    aa_check: bool = True,
) -> tuple[MeasurementFloor | None, MeasurementOverhead]:
    """Every configuration on prompt 1, then on prompt 2, …: each prompt primed untimed (as far as the engine's loop
    needs it), then every configuration, the baselines included and, on the prompts the A/A check covers, a second
    measurement of the target alone, in an order that rotates per prompt (engine.session.aa_check), so that whatever
    the first decode after a prime pays lands on each configuration in turn and cancels in the per-prompt median. A
    decode that ran before its baseline is judged once the baseline has decoded the prompt. A configuration × prompt
    in `restored` (measured by an earlier attempt) is not decoded again; a prompt all of whose configurations are
    restored is skipped whole. Returns the measurement floor (None without a baseline, or without `aa_check`) and
    what the primes, the A/A decodes and the fidelity references cost beside the configurations' decodes."""
    restored = restored or {}
    plan = list(tallies)
    reference = _floor_key([key for key in plan if key.kind == "baseline"]) if aa_check else None
    floor = RunTally(reference, None) if reference is not None else None
    checked = aa_prompts([p.category for p in prompts], len(plan)) if floor else []
    orders = decode_orders(plan, len(prompts), checked)
    judge = Judge(runner)
    total = sweep_decodes(plan, len(prompts), aa_check)
    meter = LoadMeter(gpu=str(runner.device).startswith("cuda"))
    done = 0
    started = time.perf_counter()
    spent = {"prime": 0.0, "aa": 0.0, "decoding": 0.0}
    hooks.progress(0, total)
    for index, order in enumerate(orders):
        if restored and all(index in restored.get(key, ()) for key in plan):  # measured whole by an earlier attempt
            done += len(order)
            hooks.progress(done, total)
            continue
        clock.start(f"priming prompt {index + 1} of {len(prompts)}", done, total, None)
        t0 = time.perf_counter()
        runner.prime(index, _quiet(hooks))
        spent["prime"] += time.perf_counter() - t0
        waiting: list[tuple[RunKey, Decoded]] = []
        for key in order:
            if hooks.should_stop():
                raise Cancelled()
            if key is not None and index in restored.get(key, ()):
                done += 1
                continue
            eta = (time.perf_counter() - started) / done * (total - done) if done else None
            clock.start(f"decoding prompt {index + 1} of {len(prompts)}", done, total, eta)
            t0 = time.perf_counter()
            if key is None:
                assert floor is not None
                _decode_floor(runner, floor, tallies[floor.key], index, hooks)
                spent["aa"] += time.perf_counter() - t0
            elif tallies[key].failed is None and tallies[key].enough is None:
                meter.mark()
                decoded = _decode_one(runner, tallies, key, index, hooks)
                spent["decoding"] += time.perf_counter() - t0
                tallies[key].loads.append(meter.read())
                if decoded is not None:
                    waiting.append((key, decoded))
                    waiting = judge.ready(tallies, index, hooks, waiting)
            done += 1
            hooks.progress(done, total)
        judge.ready(tallies, index, hooks, waiting, last=True)
        runner.side_measure(index)
    overhead = MeasurementOverhead(spent["prime"], spent["aa"], spent["decoding"], judge.spent_s)
    if floor is None:
        return None, overhead
    return MeasurementFloor(tuple(floor.ratios(tallies[floor.key])), len(floor.decoded)), overhead


def _floor_key(bases: list[RunKey]) -> RunKey | None:
    """The baseline measured twice: greedy (else the first temperature), at the lowest concurrency."""
    if not bases:
        return None
    return min(bases, key=lambda key: (key.concurrency, key.temperature != 0.0, bases.index(key)))


def _quiet(hooks: Hooks) -> DecodeContext:
    """A context that logs nothing and keeps nothing: a priming decode or the A/A measurement."""
    return DecodeContext(
        on_step=lambda record: None, should_stop=hooks.should_stop, phase=lambda *a: None, record_traces=False
    )


def _decode_floor(runner: Runner, floor: RunTally, baseline: RunTally, index: int, hooks: Hooks) -> None:
    """The target alone on prompt `index` a second time, for the A/A check: timed as every run is, never stored."""
    if baseline.failed is not None:
        return
    t0 = time.perf_counter()
    try:
        decoded = runner.decode(floor.key, index, _quiet(hooks), reference=False)
    except (RunFailed, Enough):
        return
    floor.add(index, decoded, time.perf_counter() - t0)


def _decode_one(
    runner: Runner, tallies: dict[RunKey, RunTally], key: RunKey, index: int, hooks: Hooks
) -> Decoded | None:
    """One prompt through one configuration, counted in its tally; None when it failed or was capped."""
    tally = tallies[key]

    def on_step(record: Any) -> None:
        tally.step(record)
        hooks.step(tally.handle, record)

    ctx = DecodeContext(
        on_step=on_step,
        should_stop=hooks.should_stop,
        phase=lambda *a: None,
        on_requests=lambda rows: hooks.requests(tally.handle, rows),
    )
    t0 = time.perf_counter()
    try:
        decoded = runner.decode(key, index, ctx, reference=key.kind == "baseline")
    except RunFailed as exc:
        _fail(tally, hooks, f"{key.label()}: {exc}")
        return None
    except Enough as exc:
        tally.enough = str(exc)
        if not tally.outputs:
            _fail(tally, hooks, f"{key.label()}: {exc}")
        return None
    tally.add(index, decoded, time.perf_counter() - t0)
    return decoded


def _fail(tally: RunTally, hooks: Hooks, message: str) -> None:
    tally.failed = message
    hooks.run_failed(tally.handle, message)


def _require_a_baseline(tallies: dict[RunKey, RunTally]) -> None:
    bases = [t for key, t in tallies.items() if key.kind == "baseline"]
    if bases and all(t.failed is not None for t in bases):
        raise RunFailed(bases[0].failed or "the target alone could not be measured")


def _baselines(tallies: dict[RunKey, RunTally]) -> dict[RunKey, RunTally]:
    """The baseline measured at each temperature and concurrency (a failed one left out)."""
    return {key: t for key, t in tallies.items() if key.kind == "baseline" and t.failed is None}


def step_overheads(points: dict[RunKey, LoopPoint], verify_cost: dict[int, float]) -> dict[str, StepOverhead]:
    """Per draft, its engine's step overhead fitted over the in-loop verifies of all its runs."""
    fit = fit_verify_cost(verify_cost) if verify_cost else None
    drafts = dict.fromkeys(key.draft for key in points)
    return {d: fit_step_overhead([p for k, p in points.items() if k.draft == d], fit) for d in drafts}


def _report(
    runner: Runner,
    spec: SessionSpec,
    tallies: dict[RunKey, RunTally],
    baselines: dict[RunKey, RunTally],
    verify_cost: dict[int, float],
    notes: list[str],
    extra: EngineOutputs,
    hooks: Hooks,
    clock: PhaseClock,
    floor: MeasurementFloor | None = None,
) -> SweepReport:
    """Every run summarised the same way (noise verdict and measurement floor included), handed to the hooks, and
    the report."""
    planned = any(key.kind == "baseline" for key in tallies)
    if planned and not baselines:
        raise RunFailed(next((t.failed for t in tallies.values() if t.failed), "the baseline was not measured"))
    first = next((t for key, t in baselines.items() if key.temperature == 0.0), next(iter(baselines.values()), None))
    public_bases: list[dict[str, Any]] = []
    report = SweepReport(
        target=spec.target,
        engine=runner.name,
        dtype=runner.dtype,
        device=str(runner.device),
        settings=spec.to_dict(),
        verify_cost=verify_cost,
        baseline={},
        baselines=public_bases,
        notes=notes,
        unavailable=list(runner.unavailable),
        engine_info=runner.describe(),
        stopped=extra.stopped,
        hardware=extra.hardware,
        measurement_floor=floor.to_dict() if floor is not None else None,
    )
    if floor is not None and not floor.holds:
        report.notes.append(floor.sentence())
    traced: set[str] = set()
    overheads = step_overheads(extra.loop_points, verify_cost)
    for key, tally in tallies.items():
        if tally.failed is not None:
            report.failed.append({**key.as_dict(), "error": tally.failed})
            continue
        baseline = baselines.get(key.baseline())
        summary = _run_summary(runner, key, tally, baseline, verify_cost, extra, overheads.get(key.draft), floor)
        traces = extra.traces.get(key.draft)
        if traces and key.draft not in traced:  # kept once per draft, on its first run
            summary.policy_trace = traces
            traced.add(key.draft)
        hooks.run_finished(tally.handle, summary)
        public = public_run(tally, summary)
        if key.kind == "baseline":
            public_bases.append(public)
            if tally is first:
                report.baseline = public
            continue
        public["speedup_noisy"] = noise.stored_noisy(summary.speedup_spread) if baseline is not None else None
        if public["speedup_noisy"]:
            report.noisy_runs.append(key.label())
        if summary.speedup_flag:
            report.impossible_runs.append(key.label())
        report.runs.append(public)
    report.machine_load = noise.load_summary([r for t in tallies.values() for r in t.loads])
    report.machine_note = noise.busy_note(report.machine_load)
    report.phase_times_s = clock.finish()
    return report


def _run_summary(
    runner: Runner,
    key: RunKey,
    tally: RunTally,
    baseline: RunTally | None,
    verify_cost: dict[int, float],
    extra: EngineOutputs,
    overhead: StepOverhead | None,
    floor: MeasurementFloor | None,
) -> RunSummary:
    """One run summarised: its figures, its drafting method and agreement runs, and a live policy's replay."""
    summary = summarise(
        tally,
        baseline,
        extra.draft_costs.get(key.draft, 0.0),
        verify_cost,
        runner.name,
        overhead,
        extra.loop_points.get(key),
        floor,
    )
    traces = extra.traces.get(key.draft)
    if key.kind != "baseline":
        summary.method = _method(key)
        if traces:
            summary.agreement_runs = [[min(r, 32) for r in trace["runs"]] for trace in traces]
    if key.policy is not None:
        policy_live(summary, key.policy.spec(), traces or (), key.temperature, verify_cost, loop=runner.drafting_loop)
    return summary


def _method(key: RunKey) -> str:
    """The drafting method a run used ("deployment": whatever the endpoint runs)."""
    return draft_method(key.draft) if key.gamma or key.policy is not None else "deployment"
