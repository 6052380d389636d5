"""What one run of a sweep measured, tallied as it decodes and summarised once, the same way for every engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.analysis.bounds import MEASURED_SLACK, BoundFlag, check_measured_speedup
from engine.analysis.prediction import IN_PROCESS_LOOP, CostModel, DraftingLoop, positional
from engine.analysis.step_overhead import LoopPoint, StepOverhead
from engine.analysis.theory import alpha_from_mean_accepted, fit_verify_cost, measured_verify_points
from engine.core.counters import SpecCounters
from engine.core.records import PromptOutput, StepRecord
from engine.drafts.kinds import draft_kind
from engine.measure import noise
from engine.measure.stats import StepStats
from engine.session.runner import Decoded, RunKey
from engine.session.summary import RunSummary


@dataclass
class RunTally:
    """One configuration while the sweep interleaves: its store handle and what it has measured so far."""

    key: RunKey
    handle: Any
    outputs: list[PromptOutput] = field(default_factory=list)
    by_index: dict[int, PromptOutput] = field(default_factory=dict)  # per prompt index: its output
    divergences: list[dict | None] = field(default_factory=list)
    decoded: dict[int, tuple[int, float]] = field(default_factory=dict)  # per prompt index: (tokens, decode s)
    calls: dict[int, tuple[float, float]] = field(default_factory=dict)  # per prompt index: (emitted, target calls)
    loads: list[dict[str, float]] = field(default_factory=list)  # per prompt: the machine's load while decoding
    counters: SpecCounters = field(default_factory=SpecCounters)
    stats: StepStats = field(default_factory=StepStats)  # from step records: β (α) where the engine reports it
    draft_calls: int = 0
    tokens: int = 0  # every request's tokens (at a concurrency above 1, the prompts decoded alongside too)
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    decode_s: float = 0.0
    wall_s: float = 0.0
    failed: str | None = None
    enough: str | None = None  # why it decodes no further prompt (a cap), keeping what it measured

    def step(self, record: StepRecord) -> None:
        self.stats.add(record)
        self.draft_calls += record.draft_forwards

    def add(self, index: int, decoded: Decoded, wall_s: float) -> None:
        self.outputs.append(decoded.output)
        self.by_index[index] = decoded.output
        self.counters = self.counters.plus(decoded.counters)
        self.decode_s += decoded.decode_s
        self.wall_s += wall_s
        tokens = decoded.tokens if decoded.tokens is not None else len(decoded.output.token_ids)
        self.tokens += tokens
        self.ttft_s += decoded.ttft_s
        self.itl_s += decoded.itl_s
        if decoded.decode_s > 0 and tokens:
            self.decoded[index] = (tokens, decoded.decode_s)
        if decoded.counters.target_calls > 0:
            self.calls[index] = (decoded.counters.emitted, decoded.counters.target_calls)

    @property
    def rates(self) -> dict[int, float]:
        """Per prompt index: decode tokens/s."""
        return {i: tokens / seconds for i, (tokens, seconds) in self.decoded.items()}

    def ratios(self, baseline: RunTally | None) -> list[float]:
        """Per prompt: this run's tokens/s ÷ the baseline's on the same prompt, measured side by side."""
        return list(self.prompt_ratios(baseline).values())

    def prompt_ratios(self, baseline: RunTally | None) -> dict[int, float]:
        """Per prompt index: this run's tokens/s ÷ the baseline's on the same prompt (the spread's ratios)."""
        if baseline is None:
            return {}
        base = baseline.rates
        return {i: r for i, rate in sorted(self.rates.items()) if i in base and (r := noise.ratio(base[i], rate))}

    def prompt_tokens_per_call(self, index: int) -> float | None:
        """One prompt's tokens per target call (None where the engine counted no call for it)."""
        emitted, calls = self.calls.get(index, (0.0, 0.0))
        return emitted / calls if calls > 0 else None

    def whole_run(self, baseline: RunTally | None) -> float | None:
        """This run's tokens/s over every prompt ÷ the baseline's over the same prompts: the whole run's speedup,
        the statistic the one model predicts (tokens over summed step costs); None without a shared prompt."""
        if baseline is None:
            return None
        shared = [i for i in self.decoded if i in baseline.decoded]
        if not shared:
            return None
        rate = sum(self.decoded[i][0] for i in shared) / sum(self.decoded[i][1] for i in shared)
        base = sum(baseline.decoded[i][0] for i in shared) / sum(baseline.decoded[i][1] for i in shared)
        return rate / base


def summarise(
    tally: RunTally,
    baseline: RunTally | None,
    c: float,
    verify_cost: dict[int, float],
    engine: str,
    overhead: StepOverhead | None = None,
    loop_point: LoopPoint | None = None,
    floor: noise.MeasurementFloor | None = None,
) -> RunSummary:
    """α (mean β where the engine reports β, and from the mean acceptance length), acceptance, c, v(k), the
    measured speedup (the median of per-prompt ratios, with its spread; and over the whole run, the statistic the
    prediction is) and the predicted one. A measurement `floor` that does not hold marks the speedup too noisy to
    tell, whatever its own spread."""
    counters = tally.counters
    tokens = tally.tokens
    common: dict[str, Any] = {
        "tokens_per_s": tokens / tally.decode_s if tally.decode_s > 0 else 0.0,
        "steps": int(counters.target_calls),
        "tokens": tokens,
        "tokens_per_call": counters.tokens_per_call(),
        "verify_cost": dict(verify_cost),
        "machine_load": noise.load_summary(tally.loads),
        "wall_s": tally.wall_s,
        "engine": engine,
        "concurrency": tally.key.concurrency,
        **latency(tally.ttft_s, "ttft"),
        **latency(tally.itl_s, "itl"),
    }
    if tally.key.kind == "baseline":
        return RunSummary(**common)
    gamma = tally.key.most_drafted
    per_pos = counters.per_position_acceptance()
    drafting = counters.drafting_fraction()
    whole = tally.whole_run(baseline)
    steps = int(counters.target_calls)
    bound = SpeedupBound(
        gamma,
        c,
        tally.draft_calls / steps if steps else None,
        verify_cost,
        loop_point.v if loop_point is not None else None,
    )
    above = prompts_above_bound(tally, baseline, bound)
    spread = in_bound_spread(tally, baseline, above)
    if spread is not None and floor is not None and not floor.holds:
        spread = replace(spread, verdict="too noisy to tell")
    measured = spread.median if spread else None
    overhead = overhead or StepOverhead()
    cost = CostModel(c, verify_cost or None, overhead=overhead)
    predicted = (
        positional(
            per_pos, 1.0 if drafting is None else drafting, gamma, cost, draft_kind(tally.key.draft).costs_forwards
        )
        if gamma
        else None
    )
    return RunSummary(
        **common,
        alpha=tally.stats.alpha(),
        alpha_from_acceptance_length=_alpha_from(counters.mean_acceptance_length(), gamma),
        draft_acceptance_rate=counters.draft_acceptance_rate(),
        mean_acceptance_length=counters.mean_acceptance_length(),
        per_position_acceptance=per_pos,
        drafting_fraction=drafting,
        c=c,
        step_overhead=overhead.to_dict() if overhead else None,
        verify_in_loop=loop_point.to_dict() if loop_point is not None else None,
        speedup_measured=measured,
        speedup_whole_run=whole,
        speedup_spread=spread.to_dict() if spread else None,
        speedup_above_bound=above,
        speedup_flag=bound.flag(measured, counters.tokens_per_call(), whole),
        speedup_predicted=predicted.predicted_speedup if predicted else None,
        mean_drafted_per_step=counters.drafted_per_call(),
        draft_calls=tally.draft_calls,
    )


def in_bound_spread(
    tally: RunTally, baseline: RunTally | None, above: Sequence[Mapping[str, float]]
) -> noise.Spread | None:
    """The run's per-prompt spread over the ratios that stand: a prompt above its bound (`above`) is a measurement
    error, left out of the median and the verdict and counted in `dropped`. Where none stands, every ratio, too
    noisy to tell."""
    thrown = {int(x["prompt"]) - 1 for x in above}
    ratios = tally.prompt_ratios(baseline)
    standing = [r for i, r in ratios.items() if i not in thrown]
    if not standing:
        spread = noise.spread_of(list(ratios.values()))
        return None if spread is None else replace(spread, verdict="too noisy to tell", dropped=len(thrown))
    spread = noise.spread_of(standing)
    return None if spread is None else replace(spread, dropped=len(thrown))


@dataclass(frozen=True)
class SpeedupBound:
    """The one bound a measured speedup has (engine.analysis.bounds.check_measured_speedup): speedup ≤ tokens per
    call ÷ (v_min + the draft's share of a call, c · draft forwards per step), γ+1 where the tokens per call are
    unknown. v_min is the cheapest verify measured side by side: the engine's v(k) probe up to the run's widest
    (1 unless a k-token forward measured cheaper than a one-token one). The run's verify in the loop (`loop_v`)
    may lower it only as far as that probe corroborates (verify_floor_of); `most_drafted`: the run's γ (a policy:
    its widest draft)."""

    most_drafted: int
    c: float = 0.0
    draft_calls_per_step: float | None = None
    verify_cost: Mapping[Any, float] | None = None
    loop_v: float | None = None

    def check(self, speedup: float, tokens_per_call: float | None, whole_run: bool = False) -> BoundFlag | None:
        """The bound check of one speedup (a whole run's, or one prompt's with that prompt's tokens per call)."""
        share = float(self.c or 0.0) * float(self.draft_calls_per_step or 0.0)
        floor = verify_floor_of(self.verify_cost, max(int(self.most_drafted), 1) + 1, self.loop_v)
        return check_measured_speedup(
            float(speedup), self.most_drafted, tokens_per_call, share, floor, whole_run=whole_run
        )

    def flag(self, speedup: float | None, tokens_per_call: float | None, whole_run: float | None = None) -> str | None:
        """Why the run's speedup is impossible, or None: the whole-run speedup is what it judges where there is one
        (the bound is on the whole run: its tokens per call and share are the run's), else `speedup`."""
        judged = whole_run or speedup
        if not judged:
            return None
        found = self.check(float(judged), tokens_per_call, whole_run=bool(whole_run))
        return found.message if found is not None else None


def verify_floor_of(verify_cost: Mapping[Any, float] | None, widest: int, loop_v: float | None = None) -> float:
    """The cheapest verify of at most `widest` tokens that a measured speedup's bound may divide by.

    The fitted v(k) probe's floor (1 unless a k-token forward timed cheaper than a one-token one, side by side).
    A verify measured inside the run's loop is in units of the baseline's step, timed in another decode: a
    baseline timed slow (its position, the load) makes it cheap by the same factor that inflates the speedup it
    would excuse. So it lowers the floor only as far as the probe's own cheapest point allows (less the measured
    slack), and not at all where the probe timed no k-token forward cheaper than one."""
    points = {k: v for k, v in measured_verify_points(verify_cost).items() if k <= widest}
    floor = fit_verify_cost(verify_cost).floor(widest) if verify_cost else 1.0
    cheapest = min(points.values(), default=1.0)
    if loop_v is None or cheapest >= 1.0:
        return floor
    return min(floor, max(float(loop_v), cheapest * (1.0 - MEASURED_SLACK)))


def speedup_flag(
    speedup: float | None,
    most_drafted: int,
    tokens_per_call: float | None,
    c: float,
    draft_calls_per_step: float | None,
    verify_cost: Mapping[Any, float] | None = None,
    whole_run: float | None = None,
    loop_v: float | None = None,
) -> str | None:
    """Why a measured speedup is impossible, or None when it stands (or none was measured): SpeedupBound's check
    of the whole-run speedup where there is one (a median of per-prompt ratios can exceed it honestly), else of
    `speedup`."""
    bound = SpeedupBound(most_drafted, c, draft_calls_per_step, verify_cost, loop_v)
    return bound.flag(speedup, tokens_per_call, whole_run)


def prompts_above_bound(tally: RunTally, baseline: RunTally | None, bound: SpeedupBound) -> list[dict[str, float]]:
    """Each prompt whose ratio beside the baseline breaks its own bound (the prompt's tokens per call ÷ (v_min +
    the run's draft share)): its number (from 1), its ratio and the bound; [] when every prompt stands."""
    out = []
    for index, ratio in tally.prompt_ratios(baseline).items():
        found = bound.check(ratio, tally.prompt_tokens_per_call(index))
        if found is not None:
            out.append({"prompt": index + 1, "speedup": round(ratio, 4), "bound": round(found.bound, 4)})
    return out


def run_speedup(run: Mapping[str, Any]) -> float | None:
    """A stored run's speedup: the one figure every page shows and the bound check judges. Over the whole run
    (tokens/s over every prompt ÷ the baseline's over the same prompts, what the one model predicts) where it was
    stored, else the median of its per-prompt ratios (a run stored before the whole-run figure existed); a live
    policy's under policy_live. `run`: a runs row (its summary JSON under "summary") or a run of a session
    summary (its fields at the top)."""
    whole = whole_run_speedup(run)
    if whole is not None:
        return whole
    live = (run.get("summary") or {}).get("policy_live") or run.get("policy_live") or {}
    median = run.get("speedup_measured") if run.get("speedup_measured") is not None else live.get("speedup_measured")
    return None if median is None else float(median)


def whole_run_speedup(run: Mapping[str, Any]) -> float | None:
    """A stored run's speedup over the whole run (run_speedup's first choice), or None where none was stored.
    `run`: either shape run_speedup reads."""
    summary = run.get("summary") or {}
    live = summary.get("policy_live") or run.get("policy_live") or {}
    for where in (summary, run, live):
        if where.get("speedup_whole_run"):
            return float(where["speedup_whole_run"])
    return None


def stored_speedup_flag(run: Mapping[str, Any]) -> str | None:
    """A stored run's speedup flag: the one its summary was stored with (`speedup_flag`, decided when it was
    summarised); for a run stored before runs carried one, the same check on its stored figures (run_speedup).
    `run`: a runs row (its summary JSON under "summary") or a run of a session summary (its fields at the top)."""
    summary = run.get("summary") or {}
    for where in (summary, run):
        if "speedup_flag" in where:
            return where["speedup_flag"]
    if run.get("kind") == "baseline":
        return None
    live = summary.get("policy_live") or {}
    per_call = run.get("tokens_per_call") if run.get("tokens_per_call") is not None else live.get("tokens_per_call")
    whole = any(where.get("speedup_whole_run") for where in (summary, run, live))
    speedup = run_speedup(run)
    return stored_bound(run).flag(speedup, per_call, speedup if whole else None)


def stored_bound(run: Mapping[str, Any]) -> SpeedupBound:
    """The SpeedupBound of a stored run (either shape run_speedup reads)."""
    from engine.core.policy import parse_policy

    summary = run.get("summary") or {}
    policy = run.get("policy") or summary.get("policy")
    most = parse_policy(policy).max_draft() if policy else int(run.get("gamma") or 0)
    steps, calls = summary.get("steps") or run.get("steps") or 0, summary.get("draft_calls") or run.get("draft_calls")
    loop = summary.get("verify_in_loop") or run.get("verify_in_loop") or {}
    return SpeedupBound(
        most,
        float(run.get("c") or 0.0),
        calls / steps if calls and steps else 0.0,
        run.get("verify_cost") or summary.get("verify_cost"),
        loop.get("v"),
    )


def spread_above_bound(run: Mapping[str, Any]) -> list[dict[str, float]]:
    """The prompts of a stored run whose per-prompt ratio breaks its bound: as the run was stored with them
    (`speedup_above_bound`, each prompt against its own tokens per call); for a run stored before, its highest
    ratio against γ+1 tokens per call (the bound every prompt has), as prompt 0 (not known which)."""
    spread = run_spread(run)
    if spread is None or run.get("kind") == "baseline":
        return []
    summary = run.get("summary") or {}
    live = summary.get("policy_live") or run.get("policy_live") or {}
    for where in (summary, run, live):
        if isinstance(where.get("speedup_above_bound"), list):
            return [dict(x) for x in where["speedup_above_bound"] if isinstance(x, Mapping)]
    bound = stored_bound(run)
    found = bound.check(float(spread["max"]), None) if bound.most_drafted >= 1 else None
    return [] if found is None else [{"prompt": 0, "speedup": float(spread["max"]), "bound": found.bound}]


SPREAD_NUMBERS = ("min", "max", "median")


def run_spread(run: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A stored run's per-prompt speedup spread (a live policy's under policy_live), or None. `run`: a runs row
    (its summary JSON under "summary") or a run of a session summary (its fields at the top)."""
    summary = run.get("summary") or {}
    live = summary.get("policy_live") or run.get("policy_live") or {}
    for spread in (summary.get("speedup_spread"), run.get("speedup_spread"), live.get("speedup_spread")):
        if isinstance(spread, Mapping) and all(isinstance(spread.get(k), int | float) for k in SPREAD_NUMBERS):
            return spread
    return None


@dataclass(frozen=True)
class BestSpeedup:
    """A session's best measured speedup: the best that stands (an impossible one is never the best) and is clear
    of noise; the best of those too noisy to tell (`noisy`) only when no run is clear."""

    speedup: float
    noisy: bool

    def text(self) -> str:
        return f"{self.speedup:.2f}×" + (" (too noisy to tell)" if self.noisy else "")


def best_speedup(runs: Sequence[Mapping[str, Any]]) -> BestSpeedup | None:
    """The BestSpeedup of stored runs (either shape run_spread reads), None when no speculative run measured one."""
    standing = [
        BestSpeedup(speedup, noise.stored_noisy(run_spread(r)) is True)
        for r in runs
        if r.get("kind") != "baseline" and (speedup := run_speedup(r)) and stored_speedup_flag(r) is None
    ]
    return max(standing, key=lambda b: (not b.noisy, b.speedup), default=None)


def latency(values: list[float], name: str) -> dict[str, float | None]:
    """The p50 and p95 of a latency (time to first token, inter-token gap); None where the engine gives none."""
    if not values:
        return {f"{name}_p50_s": None, f"{name}_p95_s": None}
    ordered = sorted(values)
    return {
        f"{name}_p50_s": ordered[len(ordered) // 2],
        f"{name}_p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    }


def _alpha_from(mean_length: float | None, gamma: int) -> float | None:
    if not mean_length or gamma < 1:
        return None
    try:
        return alpha_from_mean_accepted(min(mean_length, gamma + 1.0), gamma)
    except ValueError:
        return None


def policy_live(
    summary: RunSummary,
    spec: str,
    traces: Sequence[dict[str, Any]] = (),
    temperature: float = 0.0,
    verify_cost: dict[int, float] | None = None,
    loop: DraftingLoop = IN_PROCESS_LOOP,
) -> RunSummary:
    """A policy run's summary: its figures under `policy_live` (with what the replay of the session's own trace
    predicted for it in its engine's drafting `loop`, `replayed`), and the columns the fixed-γ recommender
    reads (α, the measured and predicted speedups, acceptance by position) emptied, since its γ varies per step."""
    from engine.analysis.policy_replay import CostModel, replay
    from engine.core.policy import parse_policy

    steps = summary.steps or 1
    summary.policy = spec
    summary.policy_live = {
        "policy": spec,
        "tokens_per_call": summary.tokens_per_call,
        "tokens_per_s": summary.tokens_per_s,
        "speedup_measured": summary.speedup_measured,
        "speedup_whole_run": summary.speedup_whole_run,
        "speedup_spread": summary.speedup_spread,
        "speedup_above_bound": summary.speedup_above_bound,
        "speedup_flag": summary.speedup_flag,
        "alpha": summary.alpha,
        "draft_acceptance_rate": summary.draft_acceptance_rate,
        "steps": summary.steps,
        "tokens": summary.tokens,
        "mean_drafted_per_step": summary.mean_drafted_per_step,
        "draft_calls": summary.draft_calls,
        "draft_calls_per_step": (summary.draft_calls or 0) / steps,
    }
    try:
        cost = CostModel(summary.c, verify_cost or {}, overhead=StepOverhead.from_dict(summary.step_overhead))
        predicted = replay(traces, parse_policy(spec), cost, temperature, loop)
        summary.policy_live["replayed"] = {
            "tokens_per_call": predicted.tokens_per_call,
            "draft_calls_per_step": predicted.draft_calls_per_step,
            "mean_drafted_per_step": predicted.drafted_per_step,
            "speedup": predicted.predicted_speedup,
            "basis": predicted.basis,
        }
    except ValueError:  # no usable trace (a draft with another tokenizer), or no β at this temperature
        summary.policy_live["replayed"] = None
    summary.alpha = summary.alpha_from_acceptance_length = None
    summary.speedup_measured = summary.speedup_predicted = summary.speedup_whole_run = None
    summary.per_position_acceptance = []
    return summary


NOT_PUBLIC = ("verify_cost", "policy_trace")  # v(k) is the report's; a trace is stored with its run only


def public_run(tally: RunTally, summary: RunSummary) -> dict[str, Any]:
    """A run as the report (and the CLI's JSON) shows it: its key, its summary and its outputs."""
    return (
        tally.key.as_dict()
        | {k: v for k, v in summary.to_dict().items() if k not in NOT_PUBLIC}
        | {
            "outputs": [
                {"prompt_id": o.prompt_id, "text": o.text, "token_ids": o.token_ids, "from_draft": o.from_draft or None}
                for o in tally.outputs
            ],
            "divergences": tally.divergences if tally.key.kind != "baseline" else None,
        }
    )
