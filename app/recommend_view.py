"""Recommendation → tables, chart frames, styles and text for the Recommend page. Pure functions, no Streamlit.

Everything here reads a Recommendation (engine.analysis.recommend), the Evidence it rests on
(engine.service.evidence) or the RegimeReport judged for it (engine.analysis.regime.judge_regime),
and returns DataFrames, Stylers or strings, so the page stays layout only and the numbers can be
tested without a browser. Domain decisions (the regime, the knee, the payload) are made in
engine.analysis, not here. Text that may carry user input (draft and session names) is escaped by
the page, not here, except where a function says it returns markdown.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from app import data
from engine.service.api import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    VLLM_SCHEDULE_SINCE,
    DraftMeasurement,
    DraftSummary,
    GammaPoint,
    Recommendation,
    Surface,
    check_predicted_speedup,
    cost_per_token_multiplier,
    crossover_from_curve,
    gamma_curve,
    regime_of,
)

OBJECTIVE_LABELS = {
    "latency": "Latency (fastest decoding)",
    "cost": "Cost per token",
    "latency_within_budget": "Latency within a cost budget",
}
REGIME_CHOICES = ("auto", MEMORY_BOUND, COMPUTE_BOUND)
REGIME_LABELS = {"auto": "auto (measured)", MEMORY_BOUND: MEMORY_BOUND, COMPUTE_BOUND: COMPUTE_BOUND}
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
SCHEDULE_TEXT = (
    "The same objective and budget at every batch size. A verify step at batch b processes b·(γ+1) token rows: "
    "below the knee it rides on the weight stream (memory-bound, the extra arithmetic is free), at or past it the "
    "arithmetic is billed, so γ is capped below the crossover there; γ is off only where speculation stops paying "
    "under the objective. "
)
INTRO = (
    "Which draft and γ to serve with — or no speculation at all — for **your** objective at **your** batch size, "
    "from the α, c and speedups your sessions measured. Whether the extra arithmetic is free depends on the "
    "regime, so the regime and its evidence come first."
)
HELP = {
    "engine": "The chosen sessions were measured with more than one engine. α carries over between engines (same "
    "models, same text); c, v(k) and speed do not. `python -m engine recommend --engine` makes the same choice.",
    "sessions": "Their speculative runs are pooled per draft × temperature. Only finished (done) sessions are listed.",
    "objective": "Latency: the fastest decoding. Cost: the lowest cost per token. Latency within a budget: the "
    "fastest decoding whose cost per token rises by at most the budget.",
    "batch": "Concurrent sequences per decode step on the server: decides memory- vs compute-bound.",
    "price": "Optional (0 = none): shows money per million tokens before and after.",
    "regime": "Auto judges each γ's verify step (batch × (γ+1) token rows) against the stored batch sweep's knee. "
    "Override it only if you know better than the measurement.",
    "draft": "The recommended draft first; pick another to see why it lost.",
    "vllm": "The vLLM export is written for this version: it names it, and its keys follow it (before vLLM "
    f"{VLLM_SCHEDULE_SINCE} there is no γ by batch size, so a schedule becomes a fixed γ and the export says so). "
    "Default: the vLLM spectune checks its exports against. `python -m engine recommend --vllm-version` does the same.",
}
SWEEP_CAPTION = (
    "Flat: extra rows ride on the weight stream (memory-bound). About linear past the knee (red): compute is "
    "saturated. Grey dashed: the serving batch."
)


def regime_heading(regime: str, judged: str) -> str:
    """'Regime: memory-bound', or '… (assumed: the evidence says unknown)' when the evidence did not decide it."""
    if judged in (MEMORY_BOUND, COMPUTE_BOUND) or judged == regime:
        return f"Regime: {regime}"
    return f"Regime: {regime} (assumed: the evidence says {judged})"


def export_caption(rec: Recommendation) -> str:
    off = " — speculation off is exported too, as an explained absence, so nobody re-enables it by accident"
    return (
        f"Paste-ready configuration for each server{off if rec.off else ''}. Downloading a file also keeps it in the "
        "history below."
    )


# ----------------------------------------------------------------------------------------------------------------------
# inputs


def preselection_problems(raw: Any, sessions: Sequence[Mapping[str, Any]]) -> list[str]:
    """One problem line per session id in ?session= that cannot be used (missing, or not done)."""
    return split_preselection(data.parse_session_param(raw), sessions)[1]


def mixed_targets(sessions: Iterable[Mapping[str, Any]]) -> str | None:
    """A warning (plain text) when the chosen sessions measure different targets, else None."""
    targets = sorted({str(s.get("target")) for s in sessions})
    if len(targets) < 2:
        return None
    return (
        f"The chosen sessions measure different targets ({', '.join(targets)}): their drafts are compared as if "
        "they served one target."
    )


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
        "speedup": f"{rec.headline_speedup:.2f}×",
        "ops": f"{rec.ops_multiplier:.2f}×",
        "cost": pct(rec.cost_change),
    }


def no_sessions_text(stored: int) -> str:
    """What to do when no session is finished (`stored`: how many sessions exist at all)."""
    return (
        "No finished sessions yet. A recommendation is computed from the α, c and speedups a finished tuning session "
        "measured: start a session on the Run page, let it finish, then come back here."
        + (f" ({stored} session(s) are stored, none of them done.)" if stored else "")
    )


NOT_MEASURED = (
    "Not measured: no run of this configuration is stored, so the figure above is a prediction only. "
    "Confirm it with a run before deploying."
)


def confirm_queued_text(new_id: int, session_ids: Sequence[int], worker: str) -> str:
    """What the page says once a confirmation is queued: which session, and how to read its answer."""
    ids = ", ".join(f"#{i}" for i in [*session_ids, new_id])
    return (
        f"Session #{new_id} queued: the target alone and this configuration, on the same prompts. When it is "
        f"done, pick sessions {ids} above: the decision then rests on its measurement. {worker}"
    )


def best_fixed_caption(rec: Recommendation) -> str:
    """Under a decision that is a drafting policy: what the fixed-γ figures below are."""
    return (f"The decision is a drafting policy; below, the best fixed γ ({rec.draft_name} γ={rec.gamma}), its "
            "runner-up, and the figures the policy is compared against.")  # fmt: skip


def decision_banner(rec: Recommendation, escape: Callable[[Any], str]) -> str:
    """The decision in one markdown line; `escape` (the page's md_escape) is applied to every piece of text."""
    parts = decision_parts(rec)
    context = f"{rec.regime}, batch {rec.batch_size}, objective: {OBJECTIVE_LABELS[rec.objective].lower()}"
    if rec.objective == "latency_within_budget" and rec.budget is not None:
        context += f" (budget {pct(rec.budget)})"
    if rec.off:
        return f"**Speculation OFF** — serve the target alone ({escape(context)})."
    line = (
        f"**{escape(parts['draft'])}** with **γ = {rec.gamma}**: {rec.speedup_phrase('**')} · ops "
        f"multiplier **{parts['ops']}** · cost per token **{parts['cost']}** ({escape(context)})"
    )
    flag = check_predicted_speedup(rec.predicted_speedup, rec.gamma)  # checked again before it is shown
    return line if flag is None else f"{line} — ⚠ {escape(flag.message)}"


def decision_metrics(rec: Recommendation) -> list[tuple[str, str, str | None]]:
    """(label, value, help) of the five decision metrics."""
    parts = decision_parts(rec)
    speedup = (
        (
            "Measured speedup",
            parts["speedup"],
            "A measured run of this very configuration, over the whole run: "
            f"the prediction, {rec.predicted_speedup:.2f}×, disagrees with it beyond the noise.",
        )
        if rec.prefers_measurement
        else ("Predicted speedup", parts["speedup"], "Latency multiple against the target alone (never above γ+1).")
    )
    return [
        ("Draft", parts["draft"], None),
        ("γ", parts["gamma"], None),
        speedup,
        ("Ops multiplier", parts["ops"], "Theorem 3.11: (γĉ + γ + 1) / E[tokens per target call]."),
        ("Cost per token", parts["cost"], "Memory-bound: ×1/speedup (free). Compute-bound: ×ops multiplier."),
    ]


def money_metrics(rec: Recommendation, price_per_hour: float) -> tuple[list[tuple[str, str, str | None]], str]:
    """(label, value, delta) of money per million tokens before and after, and the caption explaining them.

    No metrics (only the caption) when no baseline tokens/s was stored.
    """
    if rec.cost_per_million_baseline is None:
        return [], "No baseline tokens/s is stored for these sessions, so money per million tokens is unknown."
    after = "$ per million tokens, " + ("off" if rec.off else "recommended")
    return (
        [
            ("$ per million tokens, target alone", money(rec.cost_per_million_baseline), None),
            (after, money(rec.cost_per_million), None if rec.off else pct(money_change(rec))),
        ],
        f"At ${price_per_hour:,.2f}/h, {rec.batch_size} stream(s) at the measured baseline tokens/s each; the "
        "speculative figure applies the cost-per-token multiplier of the regime.",
    )


def money_change(rec: Recommendation) -> float | None:
    """Fractional change of money per million tokens, when both sides are known."""
    before, after = rec.cost_per_million_baseline, rec.cost_per_million
    if before is None or after is None or before <= 0:
        return None
    return after / before - 1.0


# ----------------------------------------------------------------------------------------------------------------------
# regime


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


# ----------------------------------------------------------------------------------------------------------------------
# the γ curve (crossover table)


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
    return [m for m in measurements if m.method != "none"]


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
    source_text = {"exact": "the recorded pass, replayed step by step", "estimated": "the recorded pass, β per "
                   "position (expected values)"}.get(source, "per-position acceptance")  # fmt: skip
    c_fit = ""
    if summary.c_effective is not None and summary.calibration_flag is None:
        c_fit = f" (the model uses c {summary.c_effective:.3f}, fitted to the measured speedups)"
    headline = (
        f"α {m.alpha:.3f} (T = {m.temperature:g}), c {m.c:.3f}{c_fit}, ĉ {m.c_hat:.3f}; tokens per call from "
        f"{source_text} · crossover {'γ = ' + str(cross) if cross is not None else 'none up to γ = 32'} · "
        + ("speculation off: no γ pays" if highlight is None
           else f"{'recommended' if index == winner else 'best'} γ = {highlight}")
    )  # fmt: skip
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
        "curve": curve, "highlight": highlight, "cross": cross, "table": table, "headline": headline,
        "warning": warning, "recommended": index == winner and highlight is not None,
        "reference": reference_line(curve, m, highlight),
    }  # fmt: skip


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


def schedule_frame(
    schedule: Mapping[int, int] | None, batch_size: int, knee: int | None, measured: Sequence[int] = ()
) -> pd.DataFrame:
    """Batch size → γ (0 = off), with the serving batch, the knee and the batches read from a measured surface
    marked."""
    rows = []
    for b, g in sorted((schedule or {}).items()):
        note = []
        if int(b) == int(batch_size):
            note.append("serving batch")
        if int(b) in measured:
            note.append("measured (surface)")
        if knee is not None and int(b) == int(knee):
            note.append("knee")
        rows.append({"batch size": int(b), "γ": "off" if int(g) == 0 else str(int(g)), "note": ", ".join(note)})
    return pd.DataFrame(rows, columns=["batch size", "γ", "note"])


def schedule_text(rec: Recommendation) -> str:
    """What the schedule means, with where its knee came from (markdown, no user text)."""
    if rec.knee_batch is not None:
        return SCHEDULE_TEXT + f"Knee from the stored batch sweep: batch **{rec.knee_batch}**."
    return SCHEDULE_TEXT + f"No knee is used, so every batch is judged {rec.regime}."


# ----------------------------------------------------------------------------------------------------------------------
# the measured γ × concurrency surface (engine.service.surface)


SURFACE_TEXT = (
    "Measured, not predicted: each configuration at each concurrency level (requests in flight) against the target "
    "alone at the same level, measured side by side. A cell at or below 1.00× (red) is where speculation stops "
    "paying; ⚠ marks a speedup too noisy to tell (its per-prompt speedups straddle 1× or spread widely)."
)
NOISY_MARK = "⚠ noisy"
IMPOSSIBLE_MARK = "⚠ impossible"  # the run's stored bound verdict: a measurement error, never a result
IMPOSSIBLE_STYLE = "color: #888888; text-decoration: line-through"
LOSES = "background-color: rgba(214, 39, 40, 0.18)"
FLIP = "background-color: rgba(214, 39, 40, 0.35); font-weight: bold"


def level_column(level: int) -> str:
    return f"×{int(level)} in flight"


def gamma_text(gamma: int) -> str:
    """A fixed γ, or 'policy' for a run whose γ varies step by step (stored as γ 0)."""
    return str(int(gamma)) if gamma else "policy"


def surface_label(surface: Surface) -> str:
    """One session in the surface picker."""
    return f"#{surface.session_id} {surface.name} (concurrency {', '.join(map(str, surface.levels))})"


def surface_table(surface: Surface) -> pd.DataFrame:
    """One row per configuration and γ, one column per measured concurrency (the speedup, ⚠ when noisy), and
    where it stops paying."""
    stops = {(s.configuration, s.gamma): s for s in surface.stops}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for cell in surface.cells:
        row = rows.setdefault(
            (cell.configuration, cell.gamma), {"configuration": cell.configuration, "γ": gamma_text(cell.gamma)}
        )
        mark = f" {IMPOSSIBLE_MARK}" if cell.flag else f" {NOISY_MARK}" if cell.noisy else ""
        row[level_column(cell.concurrency)] = f"{cell.speedup:.2f}×{mark}"
    for key, row in rows.items():
        stop = stops[key]
        row["stops paying at"] = "pays at every level" if stop.at is None else f"concurrency {stop.at}"
    columns = ["configuration", "γ", *(level_column(n) for n in surface.levels), "stops paying at"]
    return pd.DataFrame(list(rows.values()), columns=columns)


def styled_surface(table: pd.DataFrame, surface: Surface) -> Any:
    """The surface table styled: cells that do not pay in red, the one where each row stops paying darker, an
    impossible one grey and struck through."""
    cells = {(c.configuration, gamma_text(c.gamma), level_column(c.concurrency)): c for c in surface.cells}
    flips = {(s.configuration, gamma_text(s.gamma)): s.at for s in surface.stops}

    def _style(row: Any) -> list[str]:
        key = (row["configuration"], row["γ"])
        out = []
        for column in row.index:
            cell = cells.get((*key, column))
            if cell is not None and cell.flag:
                out.append(IMPOSSIBLE_STYLE)
            elif cell is None or cell.pays:
                out.append("")
            else:
                out.append(FLIP if column == level_column(flips.get(key) or 0) else LOSES)
        return out

    return table.style.apply(_style, axis=1)


def surface_chart_frame(surface: Surface) -> pd.DataFrame:
    """Long form for app.charts.concurrency_surface (data.surface_frame of its cells)."""
    return data.surface_frame(surface.cells)


# ----------------------------------------------------------------------------------------------------------------------
# history


def fingerprint(inputs: Mapping[str, Any], spectune_text: str) -> str:
    """Same inputs and same result → same key (one stored recommendation however many files are saved)."""
    blob = json.dumps(inputs, sort_keys=True, default=str) + "\n" + spectune_text
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _payload(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """A stored recommendation's payload ({} where older code or the CLI left none)."""
    payload = saved.get("payload")
    return payload if isinstance(payload, Mapping) else {}


def saved_configuration(saved: Mapping[str, Any]) -> str:
    """What a stored recommendation configures: its draft and γ (or policy), or speculation off."""
    p = _payload(saved)
    record = p.get("record") if isinstance(p.get("record"), Mapping) else {}
    policy = record.get("policy") if isinstance(record.get("policy"), Mapping) else {}
    if p.get("speculation") == "off" or p.get("gamma") == 0:
        return "speculation OFF"
    if p.get("draft") is None:
        return "—"
    if policy.get("spec"):
        return f"{p.get('draft')} policy {policy['spec']}"
    return f"{p.get('draft')} γ={p.get('gamma')}"


def saved_sessions(saved: Mapping[str, Any]) -> str:
    """The sessions a stored recommendation was made from: 'session #3' or 'sessions #3, #4'."""
    ids = [f"#{s}" for s in saved.get("session_ids") or []]
    return f"session{'s' if len(ids) != 1 else ''} {', '.join(ids) or '—'}"


def history_label(saved: Mapping[str, Any]) -> str:
    """One stored recommendation in the re-download picker: its id, configuration, sessions and objective."""
    return f"#{saved.get('id')} · {saved_configuration(saved)} · {saved_sessions(saved)} · {saved.get('objective')}"


def history_download_label(format_label: str, saved: Mapping[str, Any]) -> str:
    """A saved file's download button: whose file it is, so it is never mistaken for the current export."""
    return f"⬇ {format_label} · saved #{saved.get('id')}: {saved_configuration(saved)}, {saved_sessions(saved)}"


def history_frame(recommendations: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Stored recommendations (newest first), tolerant of payloads written by older code or the CLI."""
    rows = []
    for r in recommendations:
        p = _payload(r)
        decision = saved_configuration(r)
        speedup = p.get("headline_speedup", p.get("predicted_speedup"))
        inputs = p.get("inputs") if isinstance(p.get("inputs"), Mapping) else {}
        rows.append(
            {
                "id": f"#{r.get('id')}",
                "created": r.get("created_at"),
                "sessions": ", ".join(f"#{s}" for s in r.get("session_ids") or []),
                "objective": r.get("objective"),
                "serving batch": inputs.get("batch_size", p.get("batch_size")),
                "regime": p.get("regime"),
                "decision": decision,
                "speedup": speedup,
                "speedup is": "measured" if p.get("headline_measured") else "predicted",
                "explanation": str(p.get("explanation") or ""),
            }
        )
    columns = ["id", "created", "sessions", "objective", "serving batch", "regime", "decision", "speedup",
               "speedup is", "explanation"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)
