"""The Watch page's pure parts: a stored window's headline, the timeline's frame and the windows' table.

A window row is what the store keeps (store.watch): `ended_at`, `seconds`, `verdict` (a verdict, or the state that
kept the window from having one) and `figures` (the window's counters, the predicted speedup, α, batch, regime, what
to do and why). Nothing here predicts or judges again: the verdicts are the watcher's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from app.common import md_escape
from engine.service.api import WATCH_STATES, WATCH_VERDICTS

PAYING, COSTING, COLLAPSED, DRIFTED, BELOW = WATCH_VERDICTS
TONES = {PAYING: "success", COSTING: "error", COLLAPSED: "error", DRIFTED: "warning", BELOW: "warning"}
START_COMMAND = (
    "python -m engine watch --metrics-url http://HOST:PORT --session N --gamma G --window 15s --deployment NAME"
)
INTRO = (
    "A session answers *which draft and γ* once. `watch` keeps asking a running deployment whether that answer "
    "still pays: window by window it reads the engine's speculation counters (from its `/metrics` or from the "
    "Prometheus that scrapes it), predicts the gain of the deployed configuration at the acceptance and load it "
    "observes, with the stored session's c, v(k) and regime by batch, and says so. Every window is stored "
    "here; `watch --serve-metrics PORT` serves the verdicts to your Prometheus and Alertmanager."
)
NONE_YET = (
    "No deployment has been watched yet. Start a watch against a stored session on the machine that reaches "
    "the server (it runs until stopped and stores every window here):"
)
TIMELINE_FIELDS = ("predicted_speedup", "mean_acceptance_length", "draft_acceptance_rate", "requests_running")


def offer_text(offered: Any) -> str:
    """What the file a verdict offers does, for the page (an ActionFile)."""
    return f"**{md_escape(offered.verdict)}** — this file: {md_escape(offered.says)}."


def check_text(offered: Any) -> str:
    """How to measure the offered file before deploying it."""
    return (
        f"Measure it before deploying: `python -m engine check-export {offered.filename} --session "
        f"{offered.session_id}` runs it beside the target alone at the session's concurrency levels."
    )


def tone(verdict: str) -> str:
    """How a verdict or a state is shown: success, error, warning or info (a state: reset, idle, down, malformed)."""
    if verdict in TONES:
        return TONES[verdict]
    return "warning" if verdict in WATCH_STATES and verdict not in ("ok", "idle") else "info"


def headline(row: Mapping[str, Any]) -> str:
    """One window in a sentence: its verdict or state, why, and what to do."""
    figures = row.get("figures") or {}
    verdict = str(row.get("verdict") or "?")
    why = figures.get("why") or figures.get("message") or ""
    action = figures.get("action") or ""
    text = f"**{md_escape(verdict)}**" + (f": {md_escape(why)}" if why else "")
    return text + (f". What to do: {md_escape(action)}." if action else ".")


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def timeline(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per window: its end, verdict and the figures the timeline charts (None where the window had none)."""
    records = []
    for row in rows:
        figures = row.get("figures") or {}
        records.append(
            {
                "ended": pd.to_datetime(row["ended_at"]),
                "verdict": str(row.get("verdict") or ""),
                **{name: _number(figures.get(name)) for name in TIMELINE_FIELDS},
            }
        )
    columns = ["ended", "verdict", *TIMELINE_FIELDS]
    return pd.DataFrame.from_records(records, columns=columns)


def windows_table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The windows, newest first, as the page lists them."""
    out = []
    for row in reversed(rows):
        f = row.get("figures") or {}
        out.append(
            {
                "ended": pd.to_datetime(row["ended_at"]).strftime("%Y-%m-%d %H:%M:%S"),
                "verdict": row.get("verdict"),
                "predicted": _rounded(f.get("predicted_speedup"), 2, "×"),
                "mean acceptance length": _rounded(f.get("mean_acceptance_length"), 2),
                "draft acceptance rate": _rounded(f.get("draft_acceptance_rate"), 2),
                "α": _rounded(f.get("alpha"), 2),
                "requests running": _rounded(f.get("requests_running"), 1),
                "requests waiting": _rounded(f.get("requests_waiting"), 1),
                "time per output token": _milliseconds(f.get("time_per_output_token_s")),
                "batch": _whole(f.get("batch")),
                "regime": f.get("regime") or "",
                "why": f.get("why") or f.get("message") or "",
            }
        )
    return pd.DataFrame(out)


def number_text(value: Any, digits: int, unit: str = "", missing: str = "—") -> str:
    """A figure rounded for the page, or `missing` where the window had none."""
    number = _number(value)
    return missing if number is None else f"{number:.{digits}f}{unit}"


def _milliseconds(seconds: Any) -> str:
    number = _number(seconds)
    return "" if number is None else f"{number * 1000:.1f} ms"


def _whole(value: Any) -> str:
    number = _number(value)
    return "" if number is None else f"{number:.0f}"


def _rounded(value: Any, digits: int, unit: str = "") -> str:
    return number_text(value, digits, unit, missing="")


def last_judged(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest window with a verdict (the figures the page shows when the newest had only a state)."""
    return next((row for row in reversed(rows) if row.get("verdict") in TONES), None)


def verdict_counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many windows had each verdict or state, in the order first seen."""
    counts: dict[str, int] = {}
    for row in rows:
        verdict = str(row.get("verdict") or "")
        counts[verdict] = counts.get(verdict, 0) + 1
    return counts
