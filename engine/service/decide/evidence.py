"""From stored sessions to the recommender's inputs: one DraftMeasurement per draft × temperature.

The recommender works on plain numbers; this module is the only place that knows how a session's
runs, summaries and regime evidence are laid out in the store. The regime is judged by
engine.analysis.regime.judge_regime — the same function the worker and the dashboard use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from engine.analysis.bounds import usable_verify_points
from engine.analysis.policy_replay import trace_usable
from engine.analysis.prediction import DraftingLoop
from engine.analysis.recommend import OBJECTIVES, UNKNOWN, DraftMeasurement, Recommendation, recommend
from engine.analysis.regime import RegimeReport, judge_regime
from engine.analysis.step_overhead import StepOverhead
from engine.analysis.theory import REGIMES
from engine.drafts.kinds import draft_kind
from engine.engines.registry import drafting_loop, sweep_engines
from engine.engines.registry import get as get_engine
from engine.errors import SpectuneError
from engine.measure import noise
from engine.models.bundled import parameter_count
from engine.service.decide.surface import with_measured_schedule
from engine.service.report.runs import run_concurrency, run_spread, spread_text
from engine.session.spec import session_engine
from engine.session.summarise import run_speedup, stored_speedup_flag

# the engines whose sessions measure α, c and v(k) (an endpoint session measures serving, not drafts)
RECOMMEND_ENGINES = sweep_engines()


def choose_engine(store: Any, session_ids: list[int], engine: str | None, export_format: str | None = None) -> str:
    """The engine whose numbers a recommendation rests on: the one asked for; else the engine the export is for,
    when its sessions were chosen; else the in-process loop (spectune's) when its sessions were chosen (or none
    were); else the engine that measured them."""
    if engine is not None:
        if engine not in RECOMMEND_ENGINES:
            raise SpectuneError(f"engine '{engine}': choose one of {', '.join(RECOMMEND_ENGINES)}")
        return engine
    present = {session_engine(s) for sid in session_ids if (s := store.get_session(sid)) is not None}
    measured = [name for name in RECOMMEND_ENGINES if name in present]
    native = [name for name in measured if export_format and get_engine(name).export_format == export_format]
    in_process = [name for name in measured or RECOMMEND_ENGINES if get_engine(name).in_process]
    return (native or in_process or measured)[0]


@dataclass
class Evidence:
    measurements: list[DraftMeasurement]
    regime_label: str  # the label stored with the sessions ("unknown" when none): not yet judged at a batch
    regime: dict[str, Any] | None
    knee_batch: int | None  # the knee of the stored batch sweep (re-found from its raw timings)
    baseline_tokens_per_s: float | None
    session_ids: list[int]
    notes: list[str]
    verify_cost: dict[int, float] = field(default_factory=dict)  # the target's measured v(k), k ≥ 2; empty = none
    target: str | None = None  # the sessions' target model (None when they measured different targets)


def engine_comparison(store: Any, session_ids: list[int]) -> list[dict[str, Any]]:
    """Each finished run of the sessions, one row per engine × draft × γ × temperature, side by side.

    α should agree between engines within noise (same models, same text); c, v(k) and speed belong to the
    engine and the machine and will not. llama.cpp's α is the estimate from the mean acceptance length (vLLM's).
    """
    rows = []
    for sid in session_ids:
        session = store.get_session(sid)
        if session is None or session.get("status") != "done":
            continue
        for run in store.list_runs(sid):
            if run.get("status") != "done" or run["kind"] != "speculative":
                continue
            summary = run.get("summary") or {}
            spread = summary.get("speedup_spread") or {}
            verdict = f" ({spread['verdict']})" if spread else ""
            rows.append(
                {
                    "engine": session_engine(session),
                    "session": sid,
                    "draft": run["draft"],
                    "γ": run["gamma"],
                    "T": run["temperature"],
                    "α": run.get("alpha")
                    if run.get("alpha") is not None
                    else summary.get("alpha_from_acceptance_length"),
                    "α measured as": "mean β" if run.get("alpha") is not None else "from acceptance length",
                    "tokens per call": run.get("tokens_per_call"),
                    "draft acceptance rate": summary.get("draft_acceptance_rate"),
                    "c": run.get("c"),
                    "tokens/s": run.get("tokens_per_s"),
                    "speedup measured": run_speedup(run),
                    "spread": f"{spread_text(run)}{verdict}" if spread else None,
                    "speedup predicted": run.get("speedup_predicted"),
                    "bound": "⚠ impossible" if stored_speedup_flag(run) else None,
                }
            )
    return sorted(rows, key=lambda r: (r["draft"], r["γ"], r["T"], r["engine"]))


def gather(
    store: Any,
    session_ids: list[int],
    engine: str | None = None,
    temperature: float | None = None,
    in_progress: int | None = None,
) -> Evidence:
    """Collect measurements and regime evidence from finished sessions measured with `engine` (None: any), at the
    deployment `temperature` (None: the sessions' single temperature; SpectuneError asking for one when mixed).
    `in_progress`: a running session whose finished runs count (a quick session deciding what to confirm)."""
    if not session_ids:
        raise SpectuneError("choose at least one session")
    if engine is not None:
        chosen = [sid for sid in session_ids if (s := store.get_session(sid)) is None or session_engine(s) == engine]
        if not chosen:
            raise SpectuneError(f"none of the chosen sessions was measured with {engine}: run one with that engine")
        session_ids = chosen
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    baseline_tps: list[Any] = []
    regime: dict[str, Any] | None = None
    verify_cost: dict[int, float] = {}
    unusable: dict[str, None] = {}  # the flagged v(k) points, as notes
    targets: set[str] = set()
    levels: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for sid in session_ids:
        session = store.get_session(sid)
        if session is None:
            raise SpectuneError(f"session {sid} does not exist")
        if session["status"] != "done" and not (sid == in_progress and session["status"] == "running"):
            raise SpectuneError(f"session {sid} is {session['status']}, not done: only finished sessions can be used")
        regime = regime or session.get("regime")
        targets.add(str(session.get("target")))
        session_verify, flags = usable_verify_points((session.get("summary") or {}).get("verify_cost"))
        verify_cost |= session_verify
        unusable |= dict.fromkeys(f"session {sid}: {flag} — not used for any prediction" for flag in flags)
        for run in store.list_runs(sid):
            if run.get("status") != "done":
                continue
            if run_concurrency(run) != SERVING_LEVEL:
                if run["kind"] == "speculative":
                    levels.setdefault((run["draft"], float(run["temperature"])), []).append(run)
                continue
            if run["kind"] == "baseline":
                if run.get("tokens_per_s"):
                    baseline_tps.append((float(run["temperature"]), run["tokens_per_s"]))
                continue
            verify_cost |= usable_verify_points(run.get("verify_cost"))[0]
            run = dict(
                run,
                session_id=sid,
                session_verify_cost=session_verify,
                target=session.get("target"),
                drafting_loop=drafting_loop(session_engine(session)),
            )
            groups.setdefault((run["draft"], float(run["temperature"])), []).append(run)
    if not groups:
        raise SpectuneError("the chosen sessions have no finished speculative runs to recommend from")
    temperature = deployment_temperature({temp for _, temp in groups}, temperature)
    measurements = [
        _measurement(draft, temp, runs, levels.get((draft, temp), []))
        for (draft, temp), runs in sorted(groups.items())
        if abs(temp - temperature) < 1e-9
    ]
    baseline_tps = [tps for temp, tps in baseline_tps if abs(temp - temperature) < 1e-9]
    label = (regime or {}).get("label") or UNKNOWN
    judged = judge_regime(regime, 1)
    return Evidence(
        measurements=measurements,
        regime_label=label if label in REGIMES else UNKNOWN,
        regime=regime,
        knee_batch=judged.knee_batch,
        baseline_tokens_per_s=median(baseline_tps) if baseline_tps else None,
        session_ids=list(session_ids),
        notes=([f"measured with {engine}: sessions {', '.join(map(str, session_ids))}"] if engine else [])
        + list(unusable),
        verify_cost=verify_cost,
        target=next(iter(targets)) if len(targets) == 1 else None,
    )


def deployment_temperature(measured: set[float], asked: float | None) -> float:
    """The temperature to recommend for: the one asked (it must have been measured), else the sessions' single one."""
    shown = ", ".join(f"{t:g}" for t in sorted(measured))
    if asked is not None:
        if not any(abs(asked - t) < 1e-9 for t in measured):
            raise SpectuneError(f"temperature {asked:g} was not measured in these sessions (measured: {shown})")
        return float(asked)
    if len(measured) > 1:
        raise SpectuneError(
            f"the sessions measured temperatures {shown}: choose the temperature you deploy at (--temperature; "
            f"the Temperature choice on the page) — acceptance, and so the answer, differs between them"
        )
    return next(iter(measured))


def measured_temperatures(store: Any, session_ids: list[int]) -> list[float]:
    """The temperatures the sessions' finished speculative runs measured, lowest first."""
    temps = {
        float(r["temperature"])
        for sid in session_ids
        for r in store.list_runs(sid)
        if r.get("status") == "done" and r["kind"] == "speculative"
    }
    return sorted(temps)


SERVING_LEVEL = 1  # the recommender reads one request in flight; other levels are the vLLM surface's


def draft_arithmetic(draft: str, target: str | None, c: float) -> tuple[float, str]:
    """ĉ — the draft's arithmetic per token relative to the target's — and where it came from.

    From parameter counts when both models are known (the bundled ones), else from the measured
    time ratio c (a memory-bound forward's time follows the bytes streamed, i.e. the parameters),
    else 0 (unknown: the chapter's simplification).
    """
    p_draft, p_target = parameter_count(draft), parameter_count(target or "")
    if p_draft and p_target:
        return p_draft / p_target, f"from parameter counts: {p_draft / 1e6:,.0f}M / {p_target / 1e6:,.0f}M"
    if c > 0:
        return c, "from the measured draft cost c"
    return 0.0, ""


def _noisy(run: dict[str, Any]) -> bool:
    """A measured speedup whose per-prompt ratios straddle 1 or spread widely, or that rests on one prompt (no
    spread to judge it by): never calibrated to. A run stored without per-prompt ratios (before they were kept)
    is taken as it is."""
    return bool(noise.stored_noisy((run.get("summary") or {}).get("speedup_spread")))


def _noise_why(run: dict[str, Any]) -> str:
    spread = (run.get("summary") or {}).get("speedup_spread")
    if int(spread.get("n") or 0) < 2:
        return "measured on one prompt (no spread): too noisy to calibrate to"
    return f"per-prompt ratios {spread['min']:.2f}–{spread['max']:.2f}×: too noisy to calibrate to"


def fixed_speedup(run: dict[str, Any]) -> float | None:
    """A fixed-γ run's one speedup (engine.session.summarise.run_speedup: over the whole run, what its bound check
    judges); None for a policy run, whose γ varies step by step (the fixed-γ recommender never reads it)."""
    if run.get("policy") or (run.get("summary") or {}).get("policy"):
        return None
    return run_speedup(run)


def traces_from_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The draft's recorded pass, one trace per prompt, from the first run of each session that kept one."""
    traces: list[dict[str, Any]] = []
    seen: set[int] = set()
    for run in runs:
        trace = (run.get("summary") or {}).get("policy_trace")
        if trace and run["session_id"] not in seen:
            seen.add(run["session_id"])
            traces.extend(t for t in trace if trace_usable(t))
    return traces


def level_speedups(runs: list[dict[str, Any]]) -> dict[int, dict[int, tuple[float, bool]]]:
    """Requests in flight -> γ -> (measured speedup, too noisy to tell) of a batching engine's fixed-γ runs at more
    than one request in flight (a policy's γ varies; a run that breaks its bound is left out)."""
    out: dict[int, dict[int, tuple[float, bool]]] = {}
    for run in runs:
        summary = run.get("summary") or {}
        speedup = run_speedup(run)
        if run.get("policy") or summary.get("policy") or not speedup or stored_speedup_flag(run):
            continue
        out.setdefault(run_concurrency(run), {})[int(run["gamma"])] = (speedup, _noisy(run))
    return out


def _measurement(
    draft: str, temperature: float, runs: list[dict[str, Any]], other_levels: Sequence[dict[str, Any]] = ()
) -> DraftMeasurement:
    runs = sorted(runs, key=lambda r: r["gamma"])
    widest = runs[-1]
    summary = widest.get("summary") or {}
    # llama.cpp cannot report β, so its runs carry α estimated from the mean acceptance length instead
    alphas = [
        r["alpha"] if r.get("alpha") is not None else (r.get("summary") or {}).get("alpha_from_acceptance_length")
        for r in runs
    ]
    alphas = [a for a in alphas if a is not None]
    cs = [r["c"] for r in runs if r.get("c") is not None]
    verify: dict[int, float] = {}
    for r in runs:
        verify |= usable_verify_points(r.get("verify_cost") or r.get("session_verify_cost"))[0]
    kind = draft_kind(draft)  # "ngram" and "suffix" need no second model: c = 0
    method, window = kind.method, kind.measured_as(draft)
    forwards = kind.costs_forwards
    c = median(cs) if cs and forwards else 0.0
    c_hat, c_hat_source = draft_arithmetic(draft, widest.get("target"), c) if forwards else (0.0, "")
    return DraftMeasurement(
        name=draft,
        method=method,
        model_ref=draft if kind.needs_model else None,
        alpha=sum(alphas) / len(alphas) if alphas else 0.0,
        per_position_acceptance=list(widest.get("per_position_acceptance") or []),
        c=c,
        verify_cost=verify,  # empty when v(k) was not measured: the recommender says so
        agreement_runs=[list(x) for x in summary.get("agreement_runs") or []],
        temperature=temperature,
        measured_speedup={int(r["gamma"]): s for r in runs if (s := fixed_speedup(r))},
        run_flags={int(r["gamma"]): stored_speedup_flag(r) for r in runs if fixed_speedup(r)},
        noisy_speedup={int(r["gamma"]): _noise_why(r) for r in runs if fixed_speedup(r) and _noisy(r)},
        session_ids=sorted({int(r["session_id"]) for r in runs}),
        c_hat=c_hat,
        c_hat_source=c_hat_source,
        drafting_fraction=1.0 if summary.get("drafting_fraction") is None else float(summary["drafting_fraction"]),
        traces=traces_from_runs(runs),
        drafting_loop=widest.get("drafting_loop") or DraftingLoop(),
        c_values=[float(x) for x in cs],
        step_overhead=_step_overhead(runs),
        c_in_loop=any((r.get("summary") or {}).get("verify_in_loop") for r in runs),
        level_speedups=level_speedups(list(other_levels)),
        measured_band={int(r["gamma"]): band for r in runs if fixed_speedup(r) and (band := _band(r))},
        measured_tokens_per_call={
            int(r["gamma"]): float(r["tokens_per_call"]) for r in runs if r.get("tokens_per_call")
        },
        **window,
    )


def _band(run: dict[str, Any]) -> tuple[float, float] | None:
    """The run's lowest and highest per-prompt speedup (its noise band), or None without a spread."""
    spread = run_spread(run)
    return None if spread is None else (float(spread["min"]), float(spread["max"]))


def _step_overhead(runs: list[dict[str, Any]]) -> StepOverhead:
    """The engine's step overhead for this draft: each term's median over the runs that carry one (each session
    fits one over its runs of the draft)."""
    fitted = [StepOverhead.from_dict(o) for r in runs if (o := (r.get("summary") or {}).get("step_overhead"))]
    if not fitted:
        return StepOverhead()
    return StepOverhead(median(o.per_step for o in fitted), median(o.per_token for o in fitted))


def recommend_from_store(
    store: Any,
    session_ids: list[int],
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    price_per_hour: float | None = None,
    regime_override: str | None = None,
    engine: str | None = None,
    temperature: float | None = None,
    in_progress: int | None = None,
) -> tuple[Recommendation, Evidence, RegimeReport]:
    """The recommendation for these sessions, the evidence it rests on, and the regime judged at its γ.

    The regime is judged by judge_regime at the serving batch; with a knee (and no override) the
    recommender judges each γ at the verify width batch·(γ+1), and the returned report is judged at
    the chosen γ, so its label is the recommendation's regime (or "unknown", assumed memory-bound).
    """
    if objective not in OBJECTIVES:
        raise SpectuneError(f"objective '{objective}': choose one of {', '.join(OBJECTIVES)}")
    if objective == "latency_within_budget" and budget is None:
        raise SpectuneError("the latency-within-budget objective needs a cost budget (e.g. 0.2 for +20%)")
    if batch_size < 1:
        raise SpectuneError(f"batch size {batch_size}: must be at least 1")
    ev = gather(store, session_ids, engine, temperature, in_progress)
    try:
        first = judge_regime(ev.regime, batch_size, 0, ev.verify_cost, regime_override)
        knee = None if regime_override else first.knee_batch
        rec = recommend(
            ev.measurements,
            objective,
            first.label if first.label in REGIMES else UNKNOWN,
            budget=budget,
            batch_size=batch_size,
            price_per_hour=price_per_hour,
            baseline_tokens_per_s=ev.baseline_tokens_per_s,
            knee_batch=knee,
            regime_votes=first.votes,
        )
        batching = [
            sid
            for sid in ev.session_ids  # only an engine that batches measured a surface of our drafts
            if (s := store.get_session(sid)) is not None and get_engine(session_engine(s)).batches
        ]
        with_measured_schedule(rec, store, batching)
        report = judge_regime(ev.regime, batch_size, rec.gamma, ev.verify_cost, regime_override)
    except ValueError as exc:
        raise SpectuneError(str(exc)) from exc
    rec.notes.extend(ev.notes)
    rec.notes.extend(f"regime evidence: {flag}" for flag in report.flags)
    return rec, ev, report


def store_recommendation(
    store: Any,
    payload: dict[str, Any],
    files: dict[str, tuple[str, str]],
    rec_id: int | None = None,
    already: list[str] | None = None,
) -> tuple[int, list[str]]:
    """Keep a recommendation payload (engine.analysis.export.recommendation_payload) and its export files.

    `rec_id` is a recommendation stored before for the same result (it is stored again if it was
    deleted since); files whose format is in `already` are not stored twice. Returns the id and
    the formats stored now. The CLI and the Recommend page both store through here.
    """
    already = [] if already is None else already
    if rec_id is None or store.get_recommendation(rec_id) is None:
        inputs = payload["inputs"]
        rec_id = store.save_recommendation(inputs["session_ids"], inputs["objective"], payload)
        already.clear()
    added = [fmt for fmt in files if fmt not in already]
    for fmt in added:
        filename, text = files[fmt]
        store.save_export(rec_id, fmt, filename, text)
        already.append(fmt)
    return rec_id, added
