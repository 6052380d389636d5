"""From stored sessions to the recommender's inputs: one DraftMeasurement per draft × temperature.

The recommender works on plain numbers; this module is the only place that knows how a session's
runs, summaries and regime evidence are laid out in the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from engine.analysis.recommend import DraftMeasurement, Recommendation, gamma_schedule, recommend
from engine.analysis.regime import RegimeReport
from engine.analysis.theory import MEMORY_BOUND
from engine.drafts.refs import parse_ngram_spec
from engine.errors import SpectuneError

OBJECTIVES = ("latency", "cost", "latency_within_budget")


@dataclass
class Evidence:
    measurements: list[DraftMeasurement]
    regime_label: str
    regime: dict[str, Any] | None
    knee_batch: int | None
    baseline_tokens_per_s: float | None
    session_ids: list[int]
    notes: list[str]


def gather(store: Any, session_ids: list[int]) -> Evidence:
    """Collect measurements and regime evidence from finished sessions."""
    if not session_ids:
        raise SpectuneError("choose at least one session")
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    baseline_tps: list[float] = []
    regime: dict[str, Any] | None = None
    notes: list[str] = []
    for sid in session_ids:
        session = store.get_session(sid)
        if session is None:
            raise SpectuneError(f"session {sid} does not exist")
        if session["status"] != "done":
            raise SpectuneError(f"session {sid} is {session['status']}, not done: only finished sessions can be used")
        regime = regime or session.get("regime")
        verify_cost = (session.get("summary") or {}).get("verify_cost") or {}
        for run in store.list_runs(sid):
            if run.get("status") != "done":
                continue
            if run["kind"] == "baseline":
                if run.get("tokens_per_s"):
                    baseline_tps.append(run["tokens_per_s"])
                continue
            run = dict(run, session_id=sid, session_verify_cost=verify_cost)
            groups.setdefault((run["draft"], float(run["temperature"])), []).append(run)
    if not groups:
        raise SpectuneError("the chosen sessions have no finished speculative runs to recommend from")
    measurements = [_measurement(draft, temp, runs) for (draft, temp), runs in sorted(groups.items())]
    label = (regime or {}).get("label") or "unknown"
    if label not in ("memory-bound", "compute-bound"):
        notes.append("regime unknown (no batch-sweep evidence stored): assumed memory-bound, batch 1")
        label = MEMORY_BOUND
    knee = ((regime or {}).get("batch_classification") or {}).get("knee_batch")
    return Evidence(
        measurements=measurements,
        regime_label=label,
        regime=regime,
        knee_batch=knee,
        baseline_tokens_per_s=median(baseline_tps) if baseline_tps else None,
        session_ids=list(session_ids),
        notes=notes,
    )


def _measurement(draft: str, temperature: float, runs: list[dict[str, Any]]) -> DraftMeasurement:
    runs = sorted(runs, key=lambda r: r["gamma"])
    widest = runs[-1]
    summary = widest.get("summary") or {}
    alphas = [r["alpha"] for r in runs if r.get("alpha") is not None]
    cs = [r["c"] for r in runs if r.get("c") is not None]
    verify: dict[int, float] = {}
    for r in runs:
        source = r.get("verify_cost") or r.get("session_verify_cost") or {}
        verify |= {int(k): float(v) for k, v in source.items()}
    method = "ngram" if draft.startswith("ngram") else "draft_model"
    window = {}
    if method == "ngram":
        lo, hi = parse_ngram_spec(draft)
        window = {"ngram_max": hi, "ngram_min": lo}
    return DraftMeasurement(
        name=draft,
        method=method,
        model_ref=None if method == "ngram" else draft,
        alpha=sum(alphas) / len(alphas) if alphas else 0.0,
        per_position_acceptance=list(widest.get("per_position_acceptance") or []),
        c=median(cs) if cs and method != "ngram" else 0.0,
        verify_cost=verify or {1: 1.0},
        agreement_runs=[list(x) for x in summary.get("agreement_runs") or []],
        temperature=temperature,
        measured_speedup={int(r["gamma"]): float(r["speedup_measured"]) for r in runs if r.get("speedup_measured")},
        session_ids=sorted({int(r["session_id"]) for r in runs}),
        **window,
    )


def recommend_from_store(
    store: Any,
    session_ids: list[int],
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    price_per_hour: float | None = None,
    regime_override: str | None = None,
) -> tuple[Recommendation, Evidence, RegimeReport | None]:
    """The recommendation for these sessions, with the evidence it rests on."""
    if objective not in OBJECTIVES:
        raise SpectuneError(f"objective '{objective}': choose one of {', '.join(OBJECTIVES)}")
    if objective == "latency_within_budget" and budget is None:
        raise SpectuneError("the latency-within-budget objective needs a cost budget (e.g. 0.2 for +20%)")
    if batch_size < 1:
        raise SpectuneError(f"batch size {batch_size}: must be at least 1")
    ev = gather(store, session_ids)
    label = regime_override or ev.regime_label
    if ev.knee_batch is not None and regime_override is None:
        label = "compute-bound" if batch_size >= ev.knee_batch else "memory-bound"
    try:
        rec = recommend(
            ev.measurements, objective, label, budget=budget, batch_size=batch_size,
            price_per_hour=price_per_hour, baseline_tokens_per_s=ev.baseline_tokens_per_s,
        )
    except ValueError as exc:
        raise SpectuneError(str(exc)) from exc
    if rec.measurement is not None and not rec.off:
        rec.schedule = gamma_schedule(rec.measurement, knee_batch=ev.knee_batch)
    rec.notes.extend(ev.notes)
    report = None
    if ev.regime:
        report = RegimeReport(
            label=label, evidence=list(ev.regime.get("evidence") or []), votes=dict(ev.regime.get("votes") or {}),
            agree=True,
        )
    return rec, ev, report
