"""The evidence under the Recommend headline without Streamlit: the batch sweep and v(k) frames, the γ curve and
the draft comparison, as DataFrames, Stylers and captions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from app.recommend_view.exports import fingerprint
from app.recommend_view.headline import pct
from engine.service.api import (
    COMPUTE_BOUND,
    DraftMeasurement,
    DraftSummary,
    GammaPoint,
    Recommendation,
    cost_per_token_multiplier,
    crossover_from_curve,
    gamma_curve,
    kind_of_method,
    regime_of,
)

RECOMMENDED_MARK = "◀ recommended"

CROSSOVER_MARK = "crossover"

MEASUREMENT_ERROR_MARK = "⚠ measurement error"

EXTRAPOLATED_MARK = "v(γ+1) extrapolated"

BEYOND_DEPTH_MARK = "beyond the measured depth"

NOISY_MEASURED_MARK = "⚠ measured speedup too noisy to tell"

HIGHLIGHT = "background-color: rgba(46, 160, 67, 0.25); font-weight: bold"

NVML_NOTE = (
    "GPU utilisation (NVML) is deliberately not evidence: it is the share of time *any* kernel was running, so a "
    "batch-1 decode that streams weights and leaves the tensor cores idle reads about 100%. It says nothing about "
    "whether you are memory- or compute-bound — the batch sweep and v(k) do."
)

CURVE_FORMATS = {  # keyed by curve_frame's columns
    "tokens per call": "{:.2f}",
    "predicted speedup": "{:.2f}×",
    "ops multiplier": "{:.2f}×",
    "measured speedup": "{:.2f}×",
}

CURVE_CAPTION = (
    "Predicted speedup: the one model E/(γc + v(γ+1)) bent through the measured speedups (never past γ+1) — what "
    "the recommender ranks on. Ops multiplier: (γĉ + γ + 1)/E. Crossover "
    "(red): the first γ where the ops multiplier exceeds the speedup; a γ whose verify step is compute-bound has to "
    "stay below it. Diamonds: measured speedups; a measured speedup above its physical bound is marked as a "
    "measurement error and not calibrated to."
)

COMPARISON_FORMATS = {
    "α": "{:.3f}",
    "c": "{:.3f}",
    "predicted speedup": "{:.2f}×",
    "measured speedup": "{:.2f}×",
    "at γ": "{:.0f}",
    "ops multiplier": "{:.2f}×",
}

ENGINE_NUMBERS = {
    "α": "%.3f", "tokens per call": "%.2f", "draft acceptance rate": "%.3f", "c": "%.3f", "tokens/s": "%.1f",
    "speedup measured": "%.2f×", "speedup predicted": "%.2f×",
}  # fmt: skip

COMPARISON_HELP = {
    "α": "acceptance rate measured on your prompts",
    "c": "draft forward time / target forward time (profiled)",
    "best γ": "the draft's best γ for this objective",
    "predicted speedup": "at the draft's best γ for this objective",
    "measured speedup": "the best possible speedup a session measured for this draft (impossible ones left out)",
    "at γ": "the γ of that measured speedup",
    "ops multiplier": "Theorem 3.11's arithmetic bill at the best γ",
}

SWEEP_CAPTION = (
    "Flat: extra rows ride on the weight stream (memory-bound). About linear past the knee (red): compute is "
    "saturated. Grey dashed: the serving batch."
)


def sweep_frame(batch_sizes: Sequence[int], step_times_s: Sequence[float]) -> pd.DataFrame:
    """Long form: batch, quantity ('step time' | 'time per row'), milliseconds."""
    rows = []
    for b, t in zip(batch_sizes, step_times_s, strict=True):
        rows.append({"batch": int(b), "quantity": "step time", "ms": float(t) * 1e3})
        rows.append({"batch": int(b), "quantity": "time per row", "ms": float(t) * 1e3 / int(b)})
    return pd.DataFrame(rows, columns=["batch", "quantity", "ms"])


def verify_frame(verify_cost: Mapping[int, float] | None, max_k: int = 9) -> pd.DataFrame:
    """Measured v(k) points plus the free (v = 1) and fully billed (v = k) references, long form."""
    measured = {int(k): float(v) for k, v in (verify_cost or {}).items()}
    measured.setdefault(1, 1.0)  # the unit, not a measurement
    top = max(max_k, max(measured))
    rows = [{"k": k, "curve": "measured", "v": v} for k, v in sorted(measured.items())]
    for k in range(1, top + 1):
        rows.append({"k": k, "curve": "free: v = 1", "v": 1.0})
        rows.append({"k": k, "curve": "billed: v = k", "v": float(k)})
    return pd.DataFrame(rows, columns=["k", "curve", "v"])


CURVE_COLUMNS = [
    "γ",
    "mark",
    "tokens per call",
    "predicted speedup",
    "ops multiplier",
    "cost / token",
    "measured speedup",
    "check",
]


def curve_frame(
    curve: Sequence[GammaPoint], regime: str, recommended: int | None, batch_size: int = 1, knee: int | None = None
) -> pd.DataFrame:
    """One row per γ: tokens per call, the one model's predicted speedup, ops, cost change in the regime,
    measured, marks (Theorem 3.8's single-α figure is no column: reference_line says it once, labelled).

    The crossover is the first γ where the ops multiplier exceeds the predicted speedup. 'cost / token' is
    judged in the regime each γ's verify step runs in (the knee at width batch·(γ+1) when there is
    one, else `regime`). 'check' says when a measured speedup is impossible or v(γ+1) extrapolated.
    """
    cross = crossover_from_curve(curve)
    regime_at = regime_of(regime, batch_size, knee)
    rows = []
    for p in curve:
        marks = []
        if recommended is not None and p.gamma == recommended:
            marks.append(RECOMMENDED_MARK)
        if cross is not None and p.gamma == cross:
            marks.append(CROSSOVER_MARK)
        checks = []
        if p.measured_flag:
            checks.append(MEASUREMENT_ERROR_MARK)
        elif p.measured_noisy:
            checks.append(NOISY_MEASURED_MARK)
        if p.verify_extrapolated:
            checks.append(EXTRAPOLATED_MARK)
        if p.extrapolated:
            checks.append(BEYOND_DEPTH_MARK)
        checks.extend(p.flags)
        rows.append(
            {
                "γ": int(p.gamma),
                "tokens per call": p.expected_tokens,
                "predicted speedup": p.speedup_predicted,
                "ops multiplier": p.ops_multiplier,
                "cost / token": pct(
                    cost_per_token_multiplier(p.speedup_predicted, p.ops_multiplier, regime_at(p.gamma)) - 1.0
                ),
                "measured speedup": p.measured_speedup,
                "mark": " · ".join(marks),
                "check": " · ".join(checks),
            }
        )
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def curve_chart_frames(curve: Sequence[GammaPoint]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(lines: γ, quantity, ×) and (measured points: γ, quantity, ×) for the curve chart.

    Impossible measured speedups are labelled as measurement errors, not as measurements.
    """
    lines = []
    measured = []
    for p in curve:
        lines.append({"γ": p.gamma, "quantity": "predicted speedup", "×": p.speedup_predicted})
        lines.append({"γ": p.gamma, "quantity": "ops multiplier", "×": p.ops_multiplier})
        if p.measured_speedup is not None:
            what = "measurement error (impossible)" if p.measured_flag else "measured speedup"
            measured.append({"γ": p.gamma, "quantity": what, "×": p.measured_speedup})
    return (
        pd.DataFrame(lines, columns=["γ", "quantity", "×"]),
        pd.DataFrame(measured, columns=["γ", "quantity", "×"]),
    )


def styled_curve(table: pd.DataFrame, highlight: int | None, cross: int | None) -> Any:
    """The crossover table styled: the recommended (or best) γ highlighted, the crossover in red."""

    def _style(row: Any) -> list[str]:
        if row["γ"] == highlight:
            return [HIGHLIGHT] * len(row)
        if cross is not None and row["γ"] == cross:
            return ["color: #d62728"] * len(row)
        return [""] * len(row)

    return table.style.apply(_style, axis=1).format(CURVE_FORMATS, na_rep="—")


def candidates(measurements: Iterable[DraftMeasurement]) -> list[DraftMeasurement]:
    """The measurements the recommender compared, index-aligned with rec.comparison."""
    return [m for m in measurements if kind_of_method(m.method).speculates]


def candidate_label(summary: DraftSummary, measurement: DraftMeasurement | None, show_temperature: bool) -> str:
    label = summary.name
    if show_temperature and measurement is not None:
        label += f" (T={measurement.temperature:g})"
    return label


def candidate_labels(rec: Recommendation, cands: Sequence[DraftMeasurement]) -> list[str]:
    """One label per compared candidate, with the temperature when the candidates differ in it."""
    show_t = len({m.temperature for m in cands}) > 1
    return [candidate_label(s, m, show_t) for s, m in zip(rec.comparison, cands, strict=True)]


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


def default_candidate(rec: Recommendation, cands: Sequence[DraftMeasurement]) -> int | None:
    """The curve to show first: the winner's, or (speculation off) the best candidate's."""
    if not cands:
        return None
    winner = winner_index(rec, cands)
    if winner is not None:
        return winner
    return max(range(len(cands)), key=lambda i: rec.comparison[i].best_speedup)


def curve_picker_key(rec: Recommendation, cands: Sequence[DraftMeasurement]) -> str:
    """Widget key of the draft picker: a new set of candidates (or a new winner) starts from the winner again."""
    return f"rec_curve_{fingerprint({'labels': candidate_labels(rec, cands), 'winner': winner_index(rec, cands)}, '')}"


def curve_view(rec: Recommendation, cands: Sequence[DraftMeasurement], index: int) -> dict[str, Any]:
    """Everything the crossover section shows for candidate `index`: curve, table, marks and a headline."""
    winner = winner_index(rec, cands)
    m, summary = cands[index], rec.comparison[index]
    if index == winner:
        curve, highlight, mark = rec.curve, rec.gamma, RECOMMENDED_MARK
    else:
        curve, highlight = summary.curve or gamma_curve(m), summary.best_gamma  # as the recommender judged it
        mark = "◀ best γ for this draft (not recommended)"
    if rec.off:  # off is off: no γ is marked, highlighted or named as the answer
        highlight = None
    cross = crossover_from_curve(curve)
    table = curve_frame(curve, rec.regime_given, highlight, rec.batch_size, rec.knee_batch)
    if mark != RECOMMENDED_MARK:
        table["mark"] = table["mark"].str.replace(RECOMMENDED_MARK, mark, regex=False)
    source = curve[0].expected_tokens_source if curve else "positional"
    source_text = {
        "exact": "the recorded pass, replayed step by step",
        "estimated": "the recorded pass, β per position (expected values)",
    }.get(source, "per-position acceptance")
    c_fit = ""
    if summary.c_effective is not None and summary.calibration_flag is None:
        c_fit = f" (the model uses c {summary.c_effective:.3f}, fitted to the measured speedups)"
    headline = (
        f"α {m.alpha:.3f} (T = {m.temperature:g}), c {m.c:.3f}{c_fit}, ĉ {m.c_hat:.3f}; tokens per call from "
        f"{source_text} · crossover {'γ = ' + str(cross) if cross is not None else 'none up to γ = 32'} · "
        + (
            "speculation off: no γ pays"
            if highlight is None
            else f"{'recommended' if index == winner else 'best'} γ = {highlight}"
        )
    )
    warning = None
    chosen = next((p for p in curve if p.gamma == highlight), None)
    if chosen is not None and highlight is not None and cross is not None and highlight >= cross:
        at = regime_of(rec.regime_given, rec.batch_size, rec.knee_batch)(highlight)
        if at == COMPUTE_BOUND:
            warning = (
                f"γ = {highlight} is at or past the crossover γ = {cross}: on a compute-bound server the arithmetic "
                "grows faster than the speed."
            )
    return {
        "curve": curve,
        "highlight": highlight,
        "cross": cross,
        "table": table,
        "headline": headline,
        "warning": warning,
        "recommended": index == winner and highlight is not None,
        "reference": reference_line(curve, m, highlight),
    }


def reference_line(curve: Sequence[GammaPoint], m: DraftMeasurement, gamma: int | None) -> str:
    """The seed's Theorem 3.8 at one γ (the highlighted one, else the curve's first), labelled as a reference:
    one α, v = 1 and a full proposal at every call, so it is not a prediction and may exceed what was measured."""
    point = next((p for p in curve if p.gamma == gamma), curve[0] if curve else None)
    if point is None:
        return ""
    return (
        f"Reference, not a prediction: the seed's Theorem 3.8 with one α = {m.alpha:.3f} and c = {m.c:.3f} "
        f"(v = 1, γ tokens proposed at every call) gives {point.speedup_one_alpha:.2f}× at γ = {point.gamma}, "
        f"from {point.expected_tokens_one_alpha:.2f} tokens per call where the model above expects "
        f"{point.expected_tokens:.2f}."
    )


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
    "check",
]


def comparison_frame(
    summaries: Sequence[DraftSummary], winner: int | None, labels: Sequence[str] | None = None
) -> pd.DataFrame:
    """The seed's T5 table (draft, α, c, best γ, predicted speedup, measured speedup) plus what was decided.

    'measured speedup' is the best possible speedup a session measured for the draft, 'at γ' its
    γ; impossible ones (above their physical bound) are left out and named in 'check'.
    """
    rows = []
    for i, s in enumerate(summaries):
        measured_gamma, measured = None, None
        possible = {g: v for g, v in s.measured_speedup.items() if int(g) not in s.measured_flags}
        if possible:
            measured_gamma, measured = max(possible.items(), key=lambda kv: (kv[1], -int(kv[0])))
        flagged = sorted(int(g) for g in s.measured_flags)
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
                "check": comparison_check(flagged, measured_gamma, s.measured_noisy),
            }
        )
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def comparison_check(flagged: Sequence[int], shown_gamma: int | None, noisy: Mapping[int, str]) -> str:
    """The draft comparison's 'check': the γs whose measured speedup is impossible, and whether the one shown is too
    noisy to tell."""
    checks = [f"{MEASUREMENT_ERROR_MARK} at γ = " + ", ".join(map(str, flagged))] if flagged else []
    if shown_gamma is not None and shown_gamma in noisy:
        checks.append(f"{NOISY_MEASURED_MARK} (γ = {shown_gamma})")
    return " · ".join(checks)


def styled_comparison(table: pd.DataFrame, winner: int | None) -> Any:
    """The comparison table styled: the recommended draft highlighted."""

    def _style(row: Any) -> list[str]:
        return [HIGHLIGHT if winner is not None and row.name == winner else ""] * len(row)

    return table.style.apply(_style, axis=1).format(COMPARISON_FORMATS, na_rep="—")
