"""The recommendation part of the shareable report: the decision, the regime it was judged in, the drafts, the γ
curve, the drafting policy and the exported configuration files, from one engine.service.decide.recommendations result.

Nothing is recomputed: the decision, the curve, the exports and the policy are the objects the Recommend page and
`python -m engine recommend` show. When speculation is off no γ is offered as the recommendation anywhere.
"""

from __future__ import annotations

import math

from engine.analysis.bounds import check_predicted_speedup
from engine.analysis.recommend import DraftMeasurement, GammaPoint, Recommendation, crossover_from_curve, gamma_curve
from engine.analysis.theory import REGIMES
from engine.drafts.kinds import kind_of_method
from engine.service.decide.policies import PolicyReport
from engine.service.decide.recommendations import Recommended, format_label
from engine.service.report.html import Html, bullets, facts, note, number, table, tag
from engine.service.report.svg import Series, line_chart

OBJECTIVE_LABELS = {
    "latency": "latency (fastest decoding)",
    "cost": "cost per token",
    "latency_within_budget": "latency within a cost budget",
}
OFF_TEXT = "Speculation OFF"


def pct(change: float | None) -> str:
    """+0.40 → '+40%'."""
    if change is None or not math.isfinite(change):
        return "—"
    return f"{change * 100:+.0f}%"


def context(rec: Recommendation) -> str:
    line = f"{rec.regime}, batch {rec.batch_size}, objective: {OBJECTIVE_LABELS.get(rec.objective, rec.objective)}"
    if rec.objective == "latency_within_budget" and rec.budget is not None:
        line += f" (budget {pct(rec.budget)})"
    return line


def decision(result: Recommended) -> list[Html]:
    """The banner and the decision's figures; off: the target alone, and no γ."""
    rec = result.recommendation
    if rec.off:
        banner = tag("div", [tag("strong", OFF_TEXT), f" — serve the target alone ({context(rec)})."], "banner off")
        rows = [("Draft", "none (target alone)"), ("Speculation", "off"), ("Predicted speedup", "1.00×")]
    else:
        flag = check_predicted_speedup(rec.predicted_speedup, rec.gamma)
        banner = tag(
            "div",
            [
                tag("strong", str(rec.draft_name)),
                " with ",
                tag("strong", f"γ = {rec.gamma}"),
                f": {rec.speedup_phrase()} · ops multiplier "
                f"{rec.ops_multiplier:.2f}× · cost per token {pct(rec.cost_change)} ({context(rec)})",
                *([tag("span", f" — ⚠ {flag.message}", "flag")] if flag else []),
            ],
            "banner on",
        )
        rows = [
            ("Draft", f"{rec.draft_name} ({rec.method})"),
            ("Recommended γ", str(rec.gamma)),
            ("Measured speedup" if rec.prefers_measurement else "Predicted speedup", f"{rec.headline_speedup:.2f}×"),
            ("Ops multiplier", f"{rec.ops_multiplier:.2f}×"),
            ("Cost per token", pct(rec.cost_change)),
        ]
    rows += [
        ("Temperature", f"{rec.temperature:g}"),
        ("Engine measured with", result.engine),
        ("Sessions", ", ".join(f"#{i}" for i in result.evidence.session_ids)),
    ]
    if rec.cost_per_million_baseline is not None and rec.cost_per_million is not None:
        rows += [
            ("$ per million tokens, target alone", f"${rec.cost_per_million_baseline:,.4f}"),
            ("$ per million tokens, " + ("off" if rec.off else "recommended"), f"${rec.cost_per_million:,.4f}"),
        ]
    measured = (
        [tag("p", sentence, "flag" if rec.prefers_measurement else "")] if (sentence := rec.measured_sentence()) else []
    )
    if result.decision is not None:  # the one answer every page gives, above the fixed γ's figures
        measured.insert(
            0,
            tag(
                "p",
                [tag("strong", "Decision: "), result.decision.headline()],
                "flag" if result.decision.measured is None and not result.decision.off else "",
            ),
        )
    return [banner, *measured, facts(rows), tag("p", rec.explanation), bullets(rec.notes)]


def regime(result: Recommended) -> list[Html]:
    """The regime the decision was judged in, the evidence behind it and the measured v(k)."""
    report, ev = result.regime, result.evidence
    judged, label = result.recommendation.regime, report.label
    heading = (
        f"Regime: {judged}" if label in (judged, *REGIMES) else f"Regime: {judged} (assumed: the evidence says {label})"
    )
    parts = [tag("h3", heading), tag("p", report.source, "muted"), bullets(report.evidence or ["none stored"])]
    parts += [note(f"regime evidence: {flag}", "error") for flag in report.flags]
    if report.sweep is not None:
        rows = [(b, f"{t * 1e3:.3f}") for b, t in zip(report.sweep.batch_sizes, report.sweep.step_times_s, strict=True)]
        parts.append(table(["batch", "decode step (ms)"], rows, numeric=["batch", "decode step (ms)"]))
    verify = sorted(ev.verify_cost.items())
    if verify:
        parts.append(
            table(
                ["k", "v(k): a k-token forward ÷ a 1-token one"],
                [(k, f"{v:.3f}") for k, v in verify],
                numeric=["k", "v(k): a k-token forward ÷ a 1-token one"],
            )
        )
    else:
        parts.append(tag("p", "No v(k) measured: only v(1) = 1 is known, so verification is assumed free.", "muted"))
    return parts


def candidates(result: Recommended) -> list[DraftMeasurement]:
    """The measurements the recommender compared, index-aligned with its comparison rows."""
    return [m for m in result.evidence.measurements if kind_of_method(m.method).speculates]


def drafts(result: Recommended) -> list[Html]:
    """The per-draft comparison: α, c, each draft's own best γ and speedups, and whether it pays."""
    rec = result.recommendation
    rows = []
    for m, s in zip(candidates(result), rec.comparison, strict=True):
        possible = {g: v for g, v in s.measured_speedup.items() if int(g) not in s.measured_flags}
        best = max(possible.items(), key=lambda kv: (kv[1], -int(kv[0]))) if possible else None
        chosen = not rec.off and rec.measurement is m
        verdict = "recommended" if chosen else "pays, not the best" if s.pays else "does not pay"
        flagged = ", ".join(str(g) for g in sorted(int(g) for g in s.measured_flags))
        rows.append(
            (
                s.name,
                f"{m.temperature:g}",
                number(s.alpha, "%.3f"),
                number(s.c, "%.3f"),
                s.best_gamma,
                number(s.best_speedup, "%.2f×"),
                "—" if best is None else f"{best[1]:.2f}× at γ={best[0]}",
                number(s.ops_multiplier, "%.2f×"),
                pct(s.cost_change),
                "none ≤ 32" if s.crossover_gamma is None else s.crossover_gamma,
                verdict,
                tag("span", f"measurement error at γ = {flagged}", "flag") if flagged else "",
            )
        )
    headers = [
        "draft",
        "T",
        "α",
        "c",
        "its best γ",
        "predicted speedup",
        "measured (best possible)",
        "ops multiplier",
        "cost / token",
        "crossover γ",
        "decision",
        "check",
    ]
    return [tag("h3", "Draft comparison"), table(headers, rows, numeric=headers[2:8])]


def curve_of(result: Recommended) -> tuple[str, list[GammaPoint]] | None:
    """(draft, curve): the recommended draft's curve, or (off) the best candidate's, for reference."""
    rec, cands = result.recommendation, candidates(result)
    if not rec.off and rec.measurement is not None and rec.curve:
        return str(rec.draft_name), rec.curve
    if not cands:
        return None
    index = max(range(len(cands)), key=lambda i: rec.comparison[i].best_speedup)
    return cands[index].name, rec.comparison[index].curve or gamma_curve(cands[index])


def curve(result: Recommended) -> list[Html]:
    """Predicted speedup and ops multiplier against γ, the measured speedups on it, and the table beside it."""
    found, rec = curve_of(result), result.recommendation
    if found is None:
        return []
    name, points = found
    measured = [(p.gamma, p.measured_speedup) for p in points if p.measured_speedup is not None and not p.measured_flag]
    impossible = [(p.gamma, p.measured_speedup) for p in points if p.measured_speedup is not None and p.measured_flag]
    chart = line_chart(
        [
            Series("predicted speedup", [(p.gamma, p.speedup_predicted) for p in points]),
            Series("ops multiplier", [(p.gamma, p.ops_multiplier) for p in points], dashed=True),
            Series("measured speedup", measured, points_only=True, colour="#2ca02c"),
            Series("measurement error (impossible)", impossible, points_only=True, colour="#d62728"),
        ],
        f"Predicted speedup vs γ — {name}",
        "γ (draft tokens per step)",
        "× the target alone",
        mark_x=None if rec.off else rec.gamma,
        mark_label="" if rec.off else f"recommended γ = {rec.gamma}",
        y_unit="×",
    )
    cross = crossover_from_curve(points)
    caption = (
        f"{OFF_TEXT}: shown for the best candidate, {name}, for reference only; no γ of it pays."
        if rec.off
        else f"The recommended draft, {name}."
    )
    crossing = f"γ = {cross}" if cross else "none up to γ = 32"
    caption += f" Crossover (ops multiplier above the speedup): {crossing}."
    rows = [
        (
            p.gamma,
            number(p.expected_tokens, "%.2f"),
            number(p.speedup_predicted, "%.2f×"),
            number(p.ops_multiplier, "%.2f×"),
            number(p.measured_speedup, "%.2f×"),
            " · ".join([*(["measurement error"] if p.measured_flag else []), *p.flags]),
        )
        for p in points
    ]
    headers = ["γ", "tokens per call", "predicted speedup", "ops multiplier", "measured speedup", "check"]
    details = Html(f"<details><summary>The curve as a table</summary>{table(headers, rows, headers[:5])}</details>")
    return [tag("h3", "Speedup against γ"), Html(chart), tag("p", caption, "muted"), details]


def schedule(rec: Recommendation) -> list[Html]:
    if rec.off or not rec.schedule:
        return []

    def source(b: int) -> str:
        return "headline" if b == rec.batch_size else "measured" if b in rec.schedule_measured else "predicted"

    rows = [(b, g if g else "off", source(b)) for b, g in sorted(rec.schedule.items())]
    return [tag("h3", "γ by serving batch size"), table(["batch size", "γ", "from"], rows, numeric=["batch size", "γ"])]


def policy(report: PolicyReport | None, why_not: str | None, off: bool) -> list[Html]:
    """The drafting policy recommended for the objective (engine.service.decide.policies.session_policies)."""
    head = tag("h3", "Drafting policy")
    best, fixed = (report.best, report.best_fixed) if report is not None else (None, None)
    if best is None or fixed is None or report is None or report.chosen is None:
        return [head, tag("p", why_not or "No replayable draft trace in these sessions.", "muted")]
    if not best.feasible:
        return [head, tag("p", f"No drafting policy pays for {report.chosen.draft} either: serve the target alone.")]
    gain = report.chosen.comparison.gain
    if best.kind == "fixed":
        line = (
            f"A fixed γ is already as good for {report.chosen.draft}: {best.policy} predicts "
            f"{best.predicted_speedup:.2f}×; no policy beats it by more than 1%."
        )
    else:
        line = (
            f"{best.policy} ({best.setting}) for {report.chosen.draft}: {best.tokens_per_call:.2f} tokens per "
            f"call, {best.predicted_speedup:.2f}× predicted, {gain * 100:+.1f}% over the best fixed {fixed.policy} "
            f"({fixed.predicted_speedup:.2f}×)."
        )
    parts = [head, tag("p", line), tag("p", report.to_dict()["exact"], "muted")]
    if off:
        parts.append(
            note(
                f"The fixed-γ recommendation above is {OFF_TEXT}; this policy is what the policy replay "
                "judged on its own."
            )
        )
    return parts


def exports(result: Recommended) -> list[Html]:
    """Every exported configuration file, byte for byte what the Recommend page offers for download."""
    parts = [tag("h3", "Exported configuration")]
    if result.recommendation.off:
        parts.append(
            tag(
                "p",
                f"{OFF_TEXT} is exported too, as an explained absence, so nobody re-enables it by accident.",
                "muted",
            )
        )
    for fmt, exc in result.failed.items():
        parts.append(note(f"{format_label(fmt)}: the export failed: {exc}", "error"))
    for fmt, (filename, text) in result.files.items():
        parts.append(tag("h4", f"{format_label(fmt)} — {filename}"))
        parts.append(tag("pre", text, **{"data-format": fmt}))
    return parts


def recommendation_parts(result: Recommended, policies: PolicyReport | None, why_no_policy: str | None) -> list[Html]:
    rec = result.recommendation
    return [
        *decision(result),
        *regime(result),
        *drafts(result),
        *curve(result),
        *schedule(rec),
        *policy(policies, why_no_policy, rec.off),
        *exports(result),
    ]


def flagged_measurements(result: Recommended) -> dict[tuple[str, float, int], str]:
    """(draft, temperature, γ) → why the recommender did not calibrate to that measured speedup (a broken bound)."""
    out: dict[tuple[str, float, int], str] = {}
    for m, s in zip(candidates(result), result.recommendation.comparison, strict=True):
        for gamma, message in s.measured_flags.items():
            out[(m.name, float(m.temperature), int(gamma))] = message
    return out
