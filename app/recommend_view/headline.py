"""The Recommend page's headline without Streamlit: its inputs, the decision's banner and metrics, their words."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from app import data
from engine.service.api import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    VLLM_SCHEDULE_SINCE,
    Recommendation,
    check_predicted_speedup,
)

OBJECTIVE_LABELS = {
    "latency": "Latency (fastest decoding)",
    "cost": "Cost per token",
    "latency_within_budget": "Latency within a cost budget",
}

REGIME_CHOICES = ("auto", MEMORY_BOUND, COMPUTE_BOUND)

REGIME_LABELS = {"auto": "auto (measured)", MEMORY_BOUND: MEMORY_BOUND, COMPUTE_BOUND: COMPUTE_BOUND}

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


def regime_heading(regime: str, judged: str) -> str:
    """'Regime: memory-bound', or '… (assumed: the evidence says unknown)' when the evidence did not decide it."""
    if judged in (MEMORY_BOUND, COMPUTE_BOUND) or judged == regime:
        return f"Regime: {regime}"
    return f"Regime: {regime} (assumed: the evidence says {judged})"


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
    return (
        f"The decision is a drafting policy; below, the best fixed γ ({rec.draft_name} γ={rec.gamma}), its "
        "runner-up, and the figures the policy is compared against."
    )


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
