"""Recommendation → tables, chart frames and text for the Recommend page. Pure functions, no Streamlit.

Everything here reads a Recommendation (engine.analysis.recommend), the Evidence it rests on (engine.service.evidence)
or a stored regime dict, and returns DataFrames or strings, so the page stays thin and the numbers
can be tested without a browser. Text that may carry user input (draft and session names) is
escaped by the page, not here, except where a function says it returns markdown.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from engine.analysis.recommend import DraftMeasurement, DraftSummary, GammaPoint, Recommendation, crossover_from_curve
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, cost_per_token_multiplier

OBJECTIVE_LABELS = {
    "latency": "Latency (fastest decoding)",
    "cost": "Cost per token",
    "latency_within_budget": "Latency within a cost budget",
}
REGIME_CHOICES = ("auto", MEMORY_BOUND, COMPUTE_BOUND)
REGIME_LABELS = {"auto": "auto (measured)", MEMORY_BOUND: MEMORY_BOUND, COMPUTE_BOUND: COMPUTE_BOUND}
RECOMMENDED_MARK = "◀ recommended"
CROSSOVER_MARK = "crossover"
_SPLIT = re.compile(r"[,;\s]+")


# ----------------------------------------------------------------------------------------------------------------------
# inputs


def parse_session_param(raw: Any) -> list[int]:
    """'?session=3' or '?session=3,5' → [3] / [3, 5]; malformed items are dropped, order kept, no repeats."""
    if raw is None:
        return []
    ids: list[int] = []
    for item in (x for x in _SPLIT.split(str(raw).strip()) if x):
        try:
            value = int(item)
        except ValueError:
            continue
        if value not in ids:
            ids.append(value)
    return ids


def split_preselection(wanted: Sequence[int], sessions: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[str]]:
    """(ids that can be preselected, one problem line per id that cannot: missing or not done)."""
    by_id = {int(s["id"]): s for s in sessions}
    ok: list[int] = []
    problems: list[str] = []
    for sid in wanted:
        session = by_id.get(int(sid))
        if session is None:
            problems.append(f"session #{sid} (from the address bar) does not exist")
        elif session.get("status") != "done":
            problems.append(
                f"session #{sid} is {session.get('status')}, not done: only finished sessions can be used for a "
                "recommendation"
            )
        else:
            ok.append(int(sid))
    return ok, problems


def budget_fraction(percent: float | int | None) -> float | None:
    return None if percent is None else float(percent) / 100.0


def price_or_none(price: float | int | None) -> float | None:
    """0 (or less, or nothing) means no price was given."""
    if price is None:
        return None
    value = float(price)
    return value if math.isfinite(value) and value > 0 else None


def override_or_none(choice: str | None) -> str | None:
    return None if choice in (None, "", "auto") else str(choice)


# ----------------------------------------------------------------------------------------------------------------------
# formatting


def pct(change: float | None) -> str:
    """+0.40 → '+40%'; None → '—'."""
    if change is None or not math.isfinite(change):
        return "—"
    return f"{change * 100:+.0f}%"


def money(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def decision_parts(rec: Recommendation) -> dict[str, str]:
    """The decision's numbers as display strings (names unescaped)."""
    if rec.off:
        return {"draft": "none", "gamma": "0 (off)", "speedup": "1.00×", "ops": "1.00×", "cost": pct(0.0)}
    return {
        "draft": str(rec.draft_name),
        "gamma": str(rec.gamma),
        "speedup": f"{rec.predicted_speedup:.2f}×",
        "ops": f"{rec.ops_multiplier:.2f}×",
        "cost": pct(rec.cost_change),
    }


def money_change(rec: Recommendation) -> float | None:
    """Fractional change of money per million tokens, when both sides are known."""
    before, after = rec.cost_per_million_baseline, rec.cost_per_million
    if before is None or after is None or before <= 0:
        return None
    return after / before - 1.0


# ----------------------------------------------------------------------------------------------------------------------
# regime


def stored_sweep(regime: Mapping[str, Any] | None) -> tuple[list[int], list[float]] | None:
    """The stored batch sweep (batch sizes, step times in s) when it is usable, else None."""
    if not isinstance(regime, Mapping):
        return None
    sweep = regime.get("batch_sweep")
    if not isinstance(sweep, Mapping):
        return None
    try:
        bs = [int(b) for b in sweep.get("batch_sizes") or []]
        ts = [float(t) for t in sweep.get("step_times_s") or []]
    except (TypeError, ValueError):
        return None
    if not bs or len(bs) != len(ts) or any(b < 1 for b in bs) or any(not (t > 0) for t in ts):
        return None
    pairs = sorted(zip(bs, ts, strict=True))
    return [b for b, _ in pairs], [t for _, t in pairs]


def stored_knee(regime: Mapping[str, Any] | None) -> int | None:
    if not isinstance(regime, Mapping):
        return None
    classification = regime.get("batch_classification")
    knee = classification.get("knee_batch") if isinstance(classification, Mapping) else None
    try:
        return None if knee is None else int(knee)
    except (TypeError, ValueError):
        return None


def sweep_frame(batch_sizes: Sequence[int], step_times_s: Sequence[float]) -> pd.DataFrame:
    """Long form: batch, quantity ('step time' | 'time per row'), milliseconds."""
    rows = []
    for b, t in zip(batch_sizes, step_times_s, strict=True):
        rows.append({"batch": int(b), "quantity": "step time", "ms": float(t) * 1e3})
        rows.append({"batch": int(b), "quantity": "time per row", "ms": float(t) * 1e3 / int(b)})
    return pd.DataFrame(rows, columns=["batch", "quantity", "ms"])


def regime_source(rec: Recommendation, override: str | None, knee: int | None, has_evidence: bool) -> str:
    """One sentence saying where the regime label came from."""
    if override:
        return f"Set by hand to {override} (the stored evidence is shown below for reference)."
    if knee is not None:
        side = "at or past" if rec.batch_size >= knee else "below"
        return f"From the stored batch sweep: serving batch {rec.batch_size} is {side} the knee at batch {knee}."
    if has_evidence:
        return "From the stored regime evidence of the chosen sessions."
    return "No regime evidence is stored for these sessions: assumed memory-bound (batch 1)."


def verify_frame(verify_cost: Mapping[int, float] | None, max_k: int = 9) -> pd.DataFrame:
    """Measured v(k) points plus the free (v = 1) and fully billed (v = k) references, long form."""
    measured = {int(k): float(v) for k, v in (verify_cost or {}).items()}
    measured.setdefault(1, 1.0)
    top = max(max_k, max(measured))
    rows = [{"k": k, "curve": "measured", "v": v} for k, v in sorted(measured.items())]
    for k in range(1, top + 1):
        rows.append({"k": k, "curve": "free: v = 1", "v": 1.0})
        rows.append({"k": k, "curve": "billed: v = k", "v": float(k)})
    return pd.DataFrame(rows, columns=["k", "curve", "v"])


# ----------------------------------------------------------------------------------------------------------------------
# the γ curve (crossover table)


CURVE_COLUMNS = [
    "γ",
    "mark",
    "mean acceptance length",
    "speedup (model)",
    "speedup (calibrated)",
    "speedup (Thm 3.8, one α)",
    "ops multiplier",
    "cost / token",
    "measured speedup",
]


def curve_frame(curve: Sequence[GammaPoint], regime: str, recommended: int | None) -> pd.DataFrame:
    """One row per γ: expected tokens, the three speedups, ops, cost change in the regime, measured, marks.

    'speedup (calibrated)' is what the recommender ranks on (the model bent through the measured
    speedups); the crossover is the first γ where the ops multiplier exceeds it.
    """
    cross = crossover_from_curve(curve)
    rows = []
    for p in curve:
        marks = []
        if recommended is not None and p.gamma == recommended:
            marks.append(RECOMMENDED_MARK)
        if cross is not None and p.gamma == cross:
            marks.append(CROSSOVER_MARK)
        rows.append(
            {
                "γ": int(p.gamma),
                "mean acceptance length": p.expected_tokens,
                "speedup (model)": p.speedup_predicted,
                "speedup (calibrated)": p.speedup_estimate,
                "speedup (Thm 3.8, one α)": p.speedup_one_alpha,
                "ops multiplier": p.ops_multiplier,
                "cost / token": pct(cost_per_token_multiplier(p.speedup_estimate, p.ops_multiplier, regime) - 1.0),
                "measured speedup": p.measured_speedup,
                "mark": " · ".join(marks),
            }
        )
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def curve_chart_frames(curve: Sequence[GammaPoint]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(lines: γ, quantity, ×) and (measured points: γ, ×) for the curve chart."""
    lines = []
    measured = []
    for p in curve:
        lines.append({"γ": p.gamma, "quantity": "predicted speedup", "×": p.speedup_estimate})
        lines.append({"γ": p.gamma, "quantity": "ops multiplier", "×": p.ops_multiplier})
        if p.measured_speedup is not None:
            measured.append({"γ": p.gamma, "quantity": "measured speedup", "×": p.measured_speedup})
    return (
        pd.DataFrame(lines, columns=["γ", "quantity", "×"]),
        pd.DataFrame(measured, columns=["γ", "quantity", "×"]),
    )


def candidates(measurements: Iterable[DraftMeasurement]) -> list[DraftMeasurement]:
    """The measurements the recommender compared, index-aligned with rec.comparison."""
    return [m for m in measurements if m.method != "none"]


def candidate_label(summary: DraftSummary, measurement: DraftMeasurement | None, show_temperature: bool) -> str:
    label = summary.name
    if show_temperature and measurement is not None:
        label += f" (T={measurement.temperature:g})"
    return label


def winner_index(rec: Recommendation, cands: Sequence[DraftMeasurement]) -> int | None:
    """Index of the recommended measurement among the candidates (None when speculation is off)."""
    if rec.off or rec.measurement is None:
        return None
    for i, m in enumerate(cands):
        if m is rec.measurement:
            return i
    for i, m in enumerate(cands):
        if m.name == rec.draft_name and m.temperature == rec.temperature:
            return i
    return None


# ----------------------------------------------------------------------------------------------------------------------
# draft comparison and schedule


COMPARISON_COLUMNS = [
    "draft",
    "α",
    "c",
    "best γ",
    "predicted speedup",
    "measured speedup",
    "at γ",
    "ops multiplier",
    "cost / token",
    "crossover γ",
    "decision",
]


def comparison_frame(
    summaries: Sequence[DraftSummary], winner: int | None, labels: Sequence[str] | None = None
) -> pd.DataFrame:
    """The seed's T5 table (draft, α, c, best γ, predicted speedup, measured speedup) plus what was decided.

    'measured speedup' is the best speedup a session measured for the draft, 'at γ' its γ.
    """
    rows = []
    for i, s in enumerate(summaries):
        measured_gamma, measured = None, None
        if s.measured_speedup:
            measured_gamma, measured = max(s.measured_speedup.items(), key=lambda kv: (kv[1], -int(kv[0])))
        rows.append(
            {
                "draft": labels[i] if labels is not None else s.name,
                "α": s.alpha,
                "c": s.c,
                "best γ": int(s.best_gamma),
                "predicted speedup": s.best_speedup,
                "measured speedup": None if measured is None else float(measured),
                "at γ": None if measured_gamma is None else int(measured_gamma),
                "ops multiplier": s.ops_multiplier,
                "cost / token": pct(s.cost_change),
                "crossover γ": "none ≤ 32" if s.crossover_gamma is None else str(s.crossover_gamma),
                "decision": RECOMMENDED_MARK
                if winner is not None and i == winner
                else ("pays, not the best" if s.pays else "does not pay"),
            }
        )
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def schedule_frame(schedule: Mapping[int, int] | None, batch_size: int, knee: int | None) -> pd.DataFrame:
    """Batch size → γ (0 = off), with the serving batch and the knee marked."""
    rows = []
    for b, g in sorted((schedule or {}).items()):
        note = []
        if int(b) == int(batch_size):
            note.append("serving batch")
        if knee is not None and int(b) == int(knee):
            note.append("knee")
        rows.append({"batch size": int(b), "γ": "off" if int(g) == 0 else str(int(g)), "note": ", ".join(note)})
    return pd.DataFrame(rows, columns=["batch size", "γ", "note"])


def schedule_gamma_at(schedule: Mapping[int, int] | None, batch_size: int) -> int | None:
    """γ the schedule gives at this batch (the nearest sampled batch not above it), None without a schedule."""
    if not schedule:
        return None
    points = sorted((int(b), int(g)) for b, g in schedule.items())
    chosen = points[0][1]
    for b, g in points:
        if b <= batch_size:
            chosen = g
    return chosen


# ----------------------------------------------------------------------------------------------------------------------
# history


def inputs_dict(
    session_ids: Sequence[int],
    objective: str,
    budget: float | None,
    batch_size: int,
    price: float | None,
    override: str | None,
) -> dict[str, Any]:
    return {
        "session_ids": [int(x) for x in session_ids],
        "objective": objective,
        "budget": budget,
        "batch_size": int(batch_size),
        "price_per_hour": price,
        "regime_override": override,
    }


def fingerprint(inputs: Mapping[str, Any], spectune_text: str) -> str:
    """Same inputs and same result → same key (one stored recommendation however many files are saved)."""
    blob = json.dumps(inputs, sort_keys=True, default=str) + "\n" + spectune_text
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def payload(rec: Recommendation, inputs: Mapping[str, Any], spectune_text: str) -> dict[str, Any]:
    """What store.save_recommendation keeps: the inputs, the decision, and spectune's own full record."""
    try:
        record = json.loads(spectune_text)
    except ValueError:
        record = None
    return {
        "inputs": dict(inputs),
        "speculation": "off" if rec.off else rec.method,
        "draft": rec.draft_name,
        "gamma": int(rec.gamma),
        "predicted_speedup": _finite(rec.predicted_speedup),
        "ops_multiplier": _finite(rec.ops_multiplier),
        "cost_change": _finite(rec.cost_change),
        "regime": rec.regime,
        "batch_size": int(rec.batch_size),
        "explanation": rec.explanation,
        "record": record,
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def history_frame(recommendations: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Stored recommendations (newest first), tolerant of payloads written by older code or the CLI."""
    rows = []
    for r in recommendations:
        p = r.get("payload") if isinstance(r.get("payload"), Mapping) else {}
        speculation = p.get("speculation")
        gamma = p.get("gamma")
        if speculation == "off" or gamma == 0:
            decision = "speculation OFF"
        elif p.get("draft") is not None:
            decision = f"{p.get('draft')} γ={gamma}"
        else:
            decision = "—"
        inputs = p.get("inputs") if isinstance(p.get("inputs"), Mapping) else {}
        rows.append(
            {
                "id": r.get("id"),
                "created": r.get("created_at"),
                "sessions": ", ".join(f"#{s}" for s in r.get("session_ids") or []),
                "objective": r.get("objective"),
                "batch": inputs.get("batch_size", p.get("batch_size")),
                "regime": p.get("regime"),
                "decision": decision,
                "speedup": p.get("predicted_speedup"),
                "explanation": str(p.get("explanation") or ""),
            }
        )
    columns = ["id", "created", "sessions", "objective", "batch", "regime", "decision", "speedup", "explanation"]
    return pd.DataFrame(rows, columns=columns)


def verify_points(m: DraftMeasurement | None) -> dict[int, float]:
    """The measured v(k) table of a measurement (v(1) = 1 added), empty without one."""
    if m is None:
        return {}
    table = {int(k): float(v) for k, v in (m.verify_cost or {}).items()}
    table.setdefault(1, 1.0)
    return table


def regime_evidence(
    regime: Mapping[str, Any] | None, batch_size: int, override: str | None, verify_cost: Mapping[int, float] | None
) -> list[str]:
    """The evidence lines the page shows (and the spectune export records), judged at the chosen batch.

    The stored evidence was judged at the session's serving batch; the batch sweep and v(k) are
    re-judged here (pure engine.analysis.regime classifiers) so the lines match the label for this batch.
    """
    from engine.analysis.regime import classify_batch_sweep, classify_verify_curve

    lines: list[str] = []
    if override:
        lines.append(f"regime set by hand to {override}; the measured evidence follows for reference")
    skip: list[str] = []
    sweep = stored_sweep(regime)
    if sweep is not None:
        judged = classify_batch_sweep(sweep[0], sweep[1], max(int(batch_size), 1))
        lines += [f"batch sweep (judged at batch {batch_size}): {e}" for e in judged.evidence]
        skip.append("batch sweep:")
    table = {int(k): float(v) for k, v in (verify_cost or {}).items()}
    if any(k > 1 for k in table):
        k = 8 if max(table) >= 8 else max(table)
        lines += [f"verify curve: {e}" for e in classify_verify_curve(table, k=k).evidence]
        skip.append("verify curve:")
    stored = [str(e) for e in (regime or {}).get("evidence") or []] if isinstance(regime, Mapping) else []
    stored = [e for e in stored if not e.startswith(tuple(skip))]
    if stored:
        served = regime.get("serving_batch") if isinstance(regime, Mapping) else None
        where = f" (serving batch {served})" if served is not None else ""
        lines += [f"stored with the session{where}: {e}" for e in stored]
    if not any(line.startswith("verify curve") or "verify curve:" in line for line in lines):
        lines.append("verify curve: only v(1) is stored, so the cost of verification is not evidence here")
    return lines


def rejudged_knee(regime: Mapping[str, Any] | None, batch_size: int) -> int | None:
    """The knee of the stored sweep (re-found from the raw timings; the stored knee when there are none)."""
    sweep = stored_sweep(regime)
    if sweep is None:
        return stored_knee(regime)
    from engine.analysis.regime import classify_batch_sweep

    return classify_batch_sweep(sweep[0], sweep[1], max(int(batch_size), 1)).knee_batch
