"""Runs as tables: the runs table, speedups per γ, the comparison across sessions, categories and positions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from app.data.outputs import prompt_for, prompt_lookup
from engine.service.api import (
    SurfaceCell,
    baseline_tps,
    compared_baseline,
    run_label,
    run_policy,
    run_speedups,
)
from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency


def most_drafted(run: Mapping[str, Any]) -> int:
    """The most tokens a run drafts in one step: its γ, or its policy's widest draft (0 for the baseline)."""
    from engine.service.api import parse_policy

    policy = run_policy(run)
    return parse_policy(policy).max_draft() if policy else int(run.get("gamma") or 0)


RUN_COLUMNS = [
    "draft",
    "γ",
    "policy",
    "T",
    "kind",
    "status",
    "α",
    "tokens per call",
    "c",
    "tokens/s",
    "baseline tokens/s",
    "speedup measured",
    "speedup predicted",
]


def runs_frame(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run; tokens per call: tokens emitted ÷ target calls (every call)."""
    rows = []
    for r in runs:
        policy = run_policy(r)
        measured, predicted = run_speedups(r)
        rows.append(
            {
                "draft": r.get("draft"),
                "γ": None if policy else r.get("gamma"),
                "policy": policy,
                "T": r.get("temperature"),
                "kind": r.get("kind"),
                "status": r.get("status"),
                "α": r.get("alpha"),
                "tokens per call": r.get("tokens_per_call"),
                "c": r.get("c"),
                "tokens/s": r.get("tokens_per_s"),
                "baseline tokens/s": r.get("baseline_tokens_per_s") or baseline_tps(runs, r),
                "speedup measured": measured,
                "speedup predicted": predicted,
            }
        )
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    frame["γ"] = frame["γ"].astype("Int64")  # whole numbers, a policy run's empty one included
    return frame


def speedup_long(runs: Sequence[Mapping[str, Any]], session_label: str | None = None) -> pd.DataFrame:
    """Measured and predicted speedup of each speculative run, long form for a grouped bar chart."""
    rows = []
    for r in runs:
        if r.get("kind") == "baseline":
            continue
        for which, value in zip(("measured", "predicted"), run_speedups(r), strict=True):
            if value is not None:
                row = {"config": run_label(r), "which": which, "speedup": float(value)}
                if session_label is not None:
                    row["session"] = session_label
                rows.append(row)
    return pd.DataFrame(rows, columns=["config", "which", "speedup"] + (["session"] if session_label else []))


def comparison_frame(sessions: Sequence[Mapping[str, Any]], runs_by_session: Mapping[int, Sequence[Mapping[str, Any]]]):
    """Every speculative run of several sessions in one table (session, target, config, α, c, speedups; `bound`
    marks a measured speedup that breaks its bound)."""
    from engine.service.api import stored_speedup_flag

    rows = []
    for s in sessions:
        runs = runs_by_session.get(s["id"], [])
        for r in runs:
            if r.get("kind") == "baseline":
                continue
            rows.append(
                {
                    "session": f"#{s['id']} {s.get('name') or ''}".strip(),
                    "target": s.get("target"),
                    "config": run_label(r),
                    "α": r.get("alpha"),
                    "c": r.get("c"),
                    "tokens/s": r.get("tokens_per_s"),
                    "baseline tokens/s": r.get("baseline_tokens_per_s") or baseline_tps(runs, r),
                    "speedup measured": run_speedups(r)[0],
                    "bound": "⚠ impossible" if stored_speedup_flag(r) else None,
                    "speedup predicted": r.get("speedup_predicted"),
                }
            )
    columns = ["session", "target", "config", "α", "c", "tokens/s", "baseline tokens/s", "speedup measured", "bound",
               "speedup predicted"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def finished(run: Mapping[str, Any]) -> bool:
    """Whether a run finished (a row without a status is taken as finished): only a finished run has figures."""
    return run.get("status", "done") == "done"


def category_frame(
    runs: Sequence[Mapping[str, Any]],
    outputs_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
    prompts: Sequence[Mapping[str, Any]],
) -> pd.DataFrame:
    """Per run × prompt category: tokens/s, speedup against the baseline on the same prompts, draft share."""
    by_id, ordered = prompt_lookup(prompts)

    def cat_of(o: Mapping[str, Any]) -> str | None:
        prompt = prompt_for(o, by_id, ordered)
        return (prompt or {}).get("category")

    by_baseline: dict[Any, dict[str, float]] = {}

    def rates(baseline: Mapping[str, Any] | None) -> dict[str, float]:
        """The baseline's tokens/s per category (each speculative run against the target alone it was compared
        with: the one at its temperature and concurrency, a confirmation's own)."""
        if baseline is None:
            return {}
        if baseline["id"] not in by_baseline:
            acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for o in outputs_by_run.get(baseline["id"], []):
                if cat := cat_of(o):
                    acc[cat][0] += len(o.get("token_ids") or [])
                    acc[cat][1] += float(o.get("wall_time_s") or 0.0)
            by_baseline[baseline["id"]] = {c: t / s for c, (t, s) in acc.items() if s > 0}
        return by_baseline[baseline["id"]]

    rows = []
    for r in runs:
        if r.get("kind") == "baseline" or not finished(r):
            continue
        groups: dict[str, dict[str, float]] = defaultdict(
            lambda: {"tokens": 0, "seconds": 0.0, "drafted": 0, "n": 0, "unknown": 0}
        )
        for o in outputs_by_run.get(r["id"], []):
            cat = cat_of(o)
            if not cat:
                continue
            g = groups[cat]
            g["tokens"] += len(o.get("token_ids") or [])
            g["seconds"] += float(o.get("wall_time_s") or 0.0)
            known = o.get("from_draft") or []  # empty: the engine (llama.cpp) does not say which came from the draft
            g["drafted"] += sum(bool(x) for x in known)
            g["unknown"] += 0 if known or not o.get("token_ids") else 1
            g["n"] += 1
        base = compared_baseline(runs, r)
        base_tps = rates(base if base is not None and finished(base) else None)
        for cat, g in sorted(groups.items()):
            tps = g["tokens"] / g["seconds"] if g["seconds"] > 0 else None
            rows.append(
                {
                    "run": run_label(r),
                    "category": cat,
                    "prompts": int(g["n"]),
                    "tokens/s": tps,
                    "speedup": tps / base_tps[cat] if tps and base_tps.get(cat) else None,
                    "draft share": g["drafted"] / g["tokens"] if g["tokens"] and not g["unknown"] else None,
                }
            )
    return pd.DataFrame(rows, columns=["run", "category", "prompts", "tokens/s", "speedup", "draft share"])


def positions_frame(positions: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [
        {
            "position": int(p["position"]) + 1,
            "rate": float(p["rate"]),
            "evaluated": int(p["evaluated"]) if p.get("evaluated") is not None else None,
        }
        for p in positions
    ]
    return pd.DataFrame(rows, columns=["position", "rate", "evaluated"])


def noisy_verdict(verdict: str | None, noisy: bool | None) -> str:
    """A spread's verdict with '(noisy)' after a direction it cannot claim ('faster (noisy)'), never after a verdict
    that already says it ('too noisy to tell')."""
    text = verdict or ""
    return f"{text} (noisy)" if noisy and text in ("faster", "slower") else text


def surface_frame(cells: Sequence[SurfaceCell]) -> pd.DataFrame:
    """engine.service.decide.surface's cells in long form for app.charts.concurrency_surface: configuration, γ,
    concurrency, speedup, verdict (an impossible speedup named so, a noisy one marked)."""
    rows = [
        {
            "configuration": c.configuration,
            "γ": c.gamma,
            "concurrency": c.concurrency,
            "speedup": c.speedup,
            "verdict": "impossible (a measurement error)" if c.flag else noisy_verdict(c.verdict, c.noisy),
        }
        for c in cells
    ]
    return pd.DataFrame(rows, columns=["configuration", "γ", "concurrency", "speedup", "verdict"])
