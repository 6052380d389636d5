"""The Policies page's logic: frames, charts and words for the speculation-policy comparison (no Streamlit here).

The numbers come from engine.service.decide.policies.session_policies, the same replay `python -m engine policies`
prints: every policy of the grid replayed from the session's recorded draft trace, with what the session ran
live beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from engine.service.api import DraftPolicies, PolicyReport, export_best, export_formats
from engine.service.api import format_label as format_label

INTRO = (
    "A fixed γ drafts the same number of tokens every step. A **policy** decides per step: stop drafting when the "
    "draft is unsure (**confidence**, llama.cpp's p-min / transformers' threshold), grow γ after fully accepted "
    "drafts (**heuristic**, transformers), follow an average of accepted lengths (**adaptive**, SGLang), or change γ "
    "with the batch size (vLLM). Every policy is **replayed** from the session's one recorded draft pass: at "
    "temperature 0 the tokens per target call are exactly what the loop would do while its outputs stay the recorded "
    "ones (a near-tie may flip in bf16: a live run that delivered other figures says so in its row); speed and "
    "cost are predicted from the measured c and v(k). Points a session ran **live** are marked apart."
)
METRICS = {
    "tokens_per_call": "Tokens per target call",
    "predicted_speedup": "Predicted speedup (×)",
    "cost_multiplier": "Cost per token (× the target alone)",
}
LIVE_METRICS = {"tokens_per_call": "live_tokens_per_call", "predicted_speedup": "live_speedup"}
KIND_LABELS = {
    "fixed": "Fixed γ",
    "confidence": "Confidence stop (p-min)",
    "heuristic": "Heuristic schedule (start)",
    "adaptive": "Adaptive EMA",
    "batch": "γ by batch size",
}
X_TITLES = {"fixed": "γ", "confidence": "p-min", "heuristic": "start γ", "adaptive": "rule", "batch": "schedule"}
OBJECTIVE_LABELS = {"latency": "Latency", "cost": "Cost per token", "latency_within_budget": "Latency within budget"}
NO_SESSIONS = "No finished session yet: run one on the Run page; its draft pass is recorded for the replay."
PROVE_HELP = (
    "Queue a session that runs the best policies of different kinds and the best fixed γ for real, on the same "
    "prompts, so the replayed figures can be checked against live ones."
)


def draft_label(d: DraftPolicies) -> str:
    return f"{d.draft} at T={d.temperature:g}"


def x_value(row: dict[str, Any]) -> tuple[Any, str]:
    """(x position, series) of a row on its kind's chart."""
    spec = row["policy"].split(":")
    kind = row["kind"]
    if kind == "fixed":
        return int(spec[1]), "fixed γ"
    if kind == "confidence":
        series = f"n-max {spec[2]}" + (f", n-min {spec[3]}" if spec[3] != "0" else "")
        return float(spec[1]), series + (" (keep)" if len(spec) > 4 else "")
    if kind == "heuristic":
        return int(spec[1]), "heuristic" + (f", p={spec[2]}" if len(spec) > 2 else "")
    return row["setting"], kind


def table_frame(d: DraftPolicies, top: int | None = None) -> pd.DataFrame:
    """The replay table for one draft, best first (live rows and the best fixed γ always kept)."""
    rows = [r for r in d.rows() if top is None or r["rank"] <= top or r["live"] or r["best_fixed"]]
    return pd.DataFrame(
        {
            "#": [r["rank"] for r in rows],
            "policy": [r["policy"] for r in rows],
            "setting": [r["setting"] for r in rows],
            "tokens/call": [r["tokens_per_call"] for r in rows],
            "draft calls/step": [r["draft_calls_per_step"] for r in rows],
            "speedup": [r["predicted_speedup"] for r in rows],
            "cost ×": [r["cost_multiplier"] for r in rows],
            "basis": [r["basis"] for r in rows],
            "live tokens/call": [r["live_tokens_per_call"] for r in rows],
            "live speedup": [r["live_speedup"] for r in rows],
            "live check": [r["live_flag"] or "" for r in rows],  # a live speedup that breaks its bound says so here
            "may be recommended": ["yes" if r["feasible"] else r["why_not"] for r in rows],
        }
    )


def chart_frame(d: DraftPolicies, kind: str) -> pd.DataFrame:
    """One kind's rows as points: x (its setting), series, each metric, and the live figures where it ran."""
    records = []
    for r in d.rows():
        if r["kind"] != kind:
            continue
        x, series = x_value(r)
        records.append(
            {"x": x, "series": series, "policy": r["policy"], "source": "replayed", **{m: r[m] for m in METRICS}}
        )
        if r["live"]:
            records.append(
                {
                    "x": x,
                    "series": series,
                    "policy": r["policy"],
                    "source": "live",
                    **{m: r.get(LIVE_METRICS.get(m, ""), None) for m in METRICS},
                }
            )
    return pd.DataFrame.from_records(records, columns=["x", "series", "policy", "source", *METRICS])


def reference_value(d: DraftPolicies, metric: str) -> float:
    fixed = d.comparison.best_fixed
    return float(getattr(fixed, metric))


def policy_chart(frame: pd.DataFrame, kind: str, metric: str, reference: float, reference_label: str) -> alt.Chart:
    """Replayed points as lines per series, live points as black diamonds, the best fixed γ as a dashed rule."""
    nominal = kind in ("adaptive", "batch")
    x = alt.X(
        "x:N" if nominal else "x:Q",
        title=X_TITLES.get(kind, "setting"),
        axis=alt.Axis(labelAngle=-30, labelLimit=220) if nominal else alt.Axis(),
    )
    y = alt.Y(f"{metric}:Q", title=METRICS[metric], scale=alt.Scale(zero=False))
    tooltip = ["policy", "series", "source", alt.Tooltip(f"{metric}:Q", format=".3f")]
    replayed = frame[frame["source"] == "replayed"]
    live = frame[(frame["source"] == "live") & frame[metric].notna()]
    base = alt.Chart(replayed, height=280).encode(
        x=x, y=y, color=alt.Color("series:N", title="series"), tooltip=tooltip
    )
    layers = [base.mark_point(filled=True, size=50) if nominal else base.mark_line(point=True)]
    if not live.empty:
        layers.append(
            alt.Chart(live)
            .mark_point(shape="diamond", size=160, filled=True, color="black")
            .encode(x=x, y=y, tooltip=tooltip)
        )
    rule = pd.DataFrame({"y": [reference], "label": [reference_label]})
    layers.append(alt.Chart(rule).mark_rule(strokeDash=[6, 4], color="gray").encode(y="y:Q", tooltip=["label"]))
    return alt.layer(*layers).properties(
        title=alt.Title(
            KIND_LABELS.get(kind, kind),
            subtitle=("lines: replayed · black diamonds: run live · dashed: the best fixed γ"),
        )
    )


def kinds_of(d: DraftPolicies) -> list[str]:
    present = {r.kind for r in d.comparison.results}
    return [k for k in KIND_LABELS if k in present]


def best_metrics(report: PolicyReport) -> list[tuple[str, str, str]]:
    """The recommended policy's figures as big metrics; none when no policy may be recommended (off is off)."""
    best, fixed = report.best, report.best_fixed
    if best is None or fixed is None or not best.feasible:
        return []
    return [
        ("Best policy", best.policy, best.setting),
        (
            "Tokens per call",
            f"{best.tokens_per_call:.2f}",
            f"{_basis_of(report, best.policy)} (best fixed: {fixed.tokens_per_call:.2f})",
        ),
        (
            "Predicted speedup",
            f"{best.predicted_speedup:.2f}×",
            f"best fixed {fixed.policy}: {fixed.predicted_speedup:.2f}×",
        ),
        ("Gain over fixed γ", f"{report.chosen.comparison.gain * 100:+.1f}%", f"objective: {report.objective}"),
    ]


def _basis_of(report: PolicyReport, policy: str) -> str:
    """The basis a policy's row shows (engine.service.decide.policies.shown_basis: not "exact" where its live run
    differed)."""
    rows = report.chosen.rows() if report.chosen is not None else []
    return next((r["basis"] for r in rows if r["policy"] == policy), "")


def live_frame(d: DraftPolicies) -> pd.DataFrame:
    """Replayed beside live for every policy the session ran, with their difference in tokens per call."""
    rows = [r for r in d.rows() if r["live"]]
    return pd.DataFrame(
        {
            "policy": [r["policy"] for r in rows],
            "tokens/call replayed": [r["tokens_per_call"] for r in rows],
            "tokens/call live": [r["live_tokens_per_call"] for r in rows],
            "difference": [_diff(r["tokens_per_call"], r["live_tokens_per_call"]) for r in rows],
            "speedup predicted": [r["predicted_speedup"] for r in rows],
            "speedup live": [r["live_speedup"] for r in rows],
            "check": [r["live_flag"] or "" for r in rows],
            "basis": [r["basis"] for r in rows],
        }
    )


def _diff(replayed: float | None, live: float | None) -> str:
    if replayed is None or not live:
        return "—"
    return f"{(replayed / live - 1) * 100:+.1f}%"


def exports(report: PolicyReport) -> dict[str, Any]:
    """fmt -> PolicyExport of the recommended policy (or the exception that stopped it)."""
    out: dict[str, Any] = {}
    for fmt in (f.name for f in export_formats()):
        try:
            out[fmt] = export_best(report, fmt)
        except Exception as exc:  # noqa: BLE001 - shown per format, never a traceback
            out[fmt] = exc
    return out


def export_caption(fmt: str, exported: Any) -> str:
    """What the export gives `fmt`'s engine, as a sentence: `vLLM runs this policy as it is: speculation off.`"""
    engine = format_label(fmt)
    if isinstance(exported, Exception):
        return f"{engine}: no file for this policy ({str(exported).rstrip('.')})."
    if exported.exact:
        return f"{engine} runs this policy as it is: {exported.runs}."
    return f"{engine} cannot run this policy; the closest it runs is {exported.runs}, and that loses: " + (
        "; ".join(exported.lost) + "."
    )


def support_lines() -> Sequence[str]:
    return [f"{fmt.label}: {fmt.policy_support}" for fmt in export_formats()]
