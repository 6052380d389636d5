"""Store dicts → tables for the pages, and the Run form's text parsing. Pure functions, no Streamlit.

Kept apart from the pages so they can be tested directly and reused by every page that shows a
session, a run or a comparison.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from engine.errors import SettingsError
from engine.service.api import (
    BestSpeedup,
    StoredSession,
    SurfaceCell,
    baseline_tps,
    compared_baseline,
    run_label,
    run_policy,
    run_speedups,
    session_engine,
    session_error,
)
from engine.service.api import best_speedup as best_of_runs
from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency

VERDICT_LABELS = {
    "identical": "identical",
    "near-tie": "numerical near-tie",
    "bug": "bug",
    "not-applicable": "not applicable (sampled)",
}
_SPLIT = re.compile(r"[,;\s]+")


# ----------------------------------------------------------------------------------------------------------------------
# Run form parsing


def parse_int_list(text: str, what: str = "γ") -> list[int]:
    """'1, 2 4;8' → [1, 2, 4, 8]; 'a-b' ranges allowed ('1-4'). Raises SettingsError naming the bad item."""
    values: list[int] = []
    for item in (x for x in _SPLIT.split(text.strip()) if x):
        bounds = item.split("-")
        try:
            if len(bounds) == 2 and bounds[0] and bounds[1]:
                lo, hi = int(bounds[0]), int(bounds[1])
                if hi < lo:
                    raise SettingsError(f"{what} range '{item}' runs backwards")
                if hi - lo > 256:
                    raise SettingsError(f"{what} range '{item}' is too long")
                values.extend(range(lo, hi + 1))
            else:
                values.append(int(item))
        except ValueError:
            raise SettingsError(f"{what} list: '{item}' is not a whole number (write e.g. 1,2,4,8)") from None
    if not values:
        raise SettingsError(f"no {what} given (write e.g. 1,2,4,8)")
    return sorted(set(values))


def parse_float_list(text: str, what: str = "temperature") -> list[float]:
    """'0, 0.7' → [0.0, 0.7]; raises SettingsError naming the bad item."""
    values: list[float] = []
    for item in (x for x in _SPLIT.split(text.strip()) if x):
        try:
            value = float(item)
        except ValueError:
            raise SettingsError(f"{what} list: '{item}' is not a number (write e.g. 0, 0.7)") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise SettingsError(f"{what} list: '{item}' is not a finite number")
        values.append(value)
    if not values:
        raise SettingsError(f"no {what} given (write e.g. 0 for greedy)")
    return list(dict.fromkeys(values))


def parse_refs(text: str) -> list[str]:
    """Free-text model references, separated by commas or new lines (paths may contain spaces)."""
    return [x.strip() for x in re.split(r"[,\n]+", text or "") if x.strip()]


# ----------------------------------------------------------------------------------------------------------------------
# prompt sets, runs and sessions


def prompt_set_label(prompt_set: Mapping[str, Any]) -> str:
    """'#3 name (12 prompts)' for selectboxes."""
    name = " ".join(str(prompt_set.get("name") or "").split())
    name = name if len(name) <= 60 else name[:59] + "…"
    return f"#{prompt_set['id']} {name} ({prompt_set.get('n_prompts') or 0} prompts)"


def _num(x: Any) -> str:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f"{value:g}"


def best_speedup(session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]] | None = None) -> BestSpeedup | None:
    """The best measured speedup of a session (engine.session.summarise.best_speedup: standing, clear of noise
    unless none is): from its runs when given, else from its summary."""
    if runs is None:
        runs = StoredSession.of(session).runs
    return best_of_runs(runs)


def most_drafted(run: Mapping[str, Any]) -> int:
    """The most tokens a run drafts in one step: its γ, or its policy's widest draft (0 for the baseline)."""
    from engine.service.api import parse_policy

    policy = run_policy(run)
    return parse_policy(policy).max_draft() if policy else int(run.get("gamma") or 0)


def sessions_frame(sessions: Sequence[Mapping[str, Any]], best: Mapping[int, BestSpeedup | None]) -> pd.DataFrame:
    rows = []
    for s in sessions:
        done, total = s.get("progress_done") or 0, s.get("progress_total") or 0
        rows.append(
            {
                "id": s["id"],
                "name": s.get("name") or "",
                "status": s.get("status"),
                "engine": session_engine(s),
                "progress": f"{done}/{total}" if total else "—",
                "target": s.get("target"),
                "drafts": ", ".join(map(str, s.get("drafts") or [])),
                "γs": ", ".join(map(str, s.get("gammas") or [])),
                "T": ", ".join(_num(t) for t in s.get("temperatures") or []),
                "created": s.get("created_at"),
                "best speedup": best[s["id"]].text() if best.get(s["id"]) else None,
                "error": session_error(s),
            }
        )
    # the best speedup early, in view on a 1400 px screen; the error, the widest text, last
    columns = ["id", "name", "status", "engine", "best speedup", "target", "drafts", "γs", "T", "progress", "created",
               "error"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


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


# ----------------------------------------------------------------------------------------------------------------------
# outputs: fidelity and categories


def prompt_lookup(prompts: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Prompts by store id (the worker's prompt_id) and in session order (prompt_index)."""
    return {str(p["id"]): p for p in prompts}, list(prompts)


def prompt_for(output: Mapping[str, Any], by_id: Mapping[str, Mapping[str, Any]], ordered: Sequence[Mapping]) -> Any:
    """The stored prompt an output answers: by its prompt id, else by its position in the session."""
    found = by_id.get(str(output.get("prompt_id")))
    if found is None:
        index = output.get("prompt_index")
        if isinstance(index, int) and 0 <= index < len(ordered):
            found = ordered[index]
    return found


def prompt_number(output: Mapping[str, Any]) -> int | None:
    """The prompt an output answers, numbered from 1 as on the Prompts page."""
    index = output.get("prompt_index")
    return int(index) + 1 if isinstance(index, int) else None


def fidelity_frame(
    runs: Sequence[Mapping[str, Any]],
    outputs_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
    prompts: Sequence[Mapping[str, Any]] = (),
) -> pd.DataFrame:
    """One row per (speculative run, prompt): the divergence verdict against the baseline."""
    by_id, ordered = prompt_lookup(prompts)
    rows = []
    for r in runs:
        if r.get("kind") == "baseline":
            continue
        for o in outputs_by_run.get(r["id"], []):
            div = o.get("divergence") or {}
            verdict = div.get("verdict") or ("identical" if div.get("identical") else "unknown")
            prompt = prompt_for(o, by_id, ordered)
            rows.append(
                {
                    "run": run_label(r),
                    "prompt": prompt_number(o),
                    "category": (prompt or {}).get("category") or "",
                    "verdict": VERDICT_LABELS.get(verdict, verdict),
                    "first divergence at": div.get("position"),
                    "logit margin": div.get("margin"),
                    "tolerance": div.get("tolerance"),
                    "prompt text": (prompt or {}).get("text", "")[:120],
                }
            )
    columns = ["run", "prompt", "category", "verdict", "first divergence at", "logit margin", "tolerance",
               "prompt text"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def verdict_counts(fidelity: pd.DataFrame) -> dict[str, int]:
    return dict(Counter(fidelity["verdict"])) if not fidelity.empty else {}


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


# ----------------------------------------------------------------------------------------------------------------------
# live view series


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


UTILISATION_LABELS = {  # the sampler's metric names (engine.measure.telemetry_*) as a chart legend says them
    "cpu_util_pct": "CPU (all)",
    "other_cpu_pct": "other processes",
    "process_cpu_pct": "this session",
    "sys_mem_used_pct": "memory used",
    "gpu_util_pct": "GPU busy",
    "mem_ctrl_util_pct": "GPU memory controller busy",
    "dram_bw_util_pct": "GPU memory bandwidth",
    "sm_occupancy_pct": "GPU SM occupancy",
    "tensor_util_pct": "GPU tensor cores busy",
}


def utilisation_label(name: str) -> str:
    """A sampler metric's legend label; an unknown one is spelled out from its name (`xyz_util_pct` → `xyz util`)."""
    return UTILISATION_LABELS.get(name) or name.removesuffix("_pct").replace("_", " ")


def utilisation_long(samples: Sequence[Mapping[str, Any]], percent_only: bool = True) -> pd.DataFrame:
    """Samples → (seconds since the first sample, metric label, value); by default only the *_pct metrics."""
    if not samples:
        return pd.DataFrame(columns=["seconds", "metric", "value", "source"])
    t0 = min(float(s["t"]) for s in samples)
    rows = []
    for s in samples:
        for name, value in (s.get("metrics") or {}).items():
            if percent_only and not str(name).endswith("_pct"):
                continue
            rows.append({"seconds": float(s["t"]) - t0, "metric": utilisation_label(str(name)), "value": float(value),
                         "source": s.get("source")})  # fmt: skip
    return pd.DataFrame(rows, columns=["seconds", "metric", "value", "source"])


def sessions_ahead(session: Mapping[str, Any], queued: Sequence[Mapping[str, Any]]) -> int:
    """How many queued sessions the worker takes before ``session``: it claims the oldest first (by creation
    time, then id)."""
    others = [s for s in queued if s["id"] != session["id"]]
    try:
        return sum(1 for s in others if (s["created_at"], s["id"]) < (session["created_at"], session["id"]))
    except (KeyError, TypeError):  # no creation time to order by: ids are handed out in order
        return sum(1 for s in others if s["id"] < session["id"])


def queued_text(ahead: int) -> str:
    if ahead == 0:
        return "Queued: it is next; the worker starts it as soon as it is free."
    return f"Queued: {ahead} session{'s' if ahead != 1 else ''} ahead of it; the worker takes them in order."


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


def noisy_verdict(verdict: str | None, noisy: bool | None) -> str:
    """A spread's verdict with '(noisy)' after a direction it cannot claim ('faster (noisy)'), never after a verdict
    that already says it ('too noisy to tell')."""
    text = verdict or ""
    return f"{text} (noisy)" if noisy and text in ("faster", "slower") else text


def surface_frame(cells: Sequence[SurfaceCell]) -> pd.DataFrame:
    """engine.service.surface's cells in long form for app.charts.concurrency_surface: configuration, γ,
    concurrency, speedup, verdict (an impossible speedup named so, a noisy one marked)."""
    rows = [{"configuration": c.configuration, "γ": c.gamma, "concurrency": c.concurrency, "speedup": c.speedup,
             "verdict": "impossible (a measurement error)" if c.flag else noisy_verdict(c.verdict, c.noisy)}
            for c in cells]  # fmt: skip
    return pd.DataFrame(rows, columns=["configuration", "γ", "concurrency", "speedup", "verdict"])
