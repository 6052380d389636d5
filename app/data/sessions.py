"""Sessions as tables and words: the sessions list, a session's best speedup, the queue ahead of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.service.api import (
    BestSpeedup,
    StoredSession,
    session_error,
)
from engine.service.api import best_speedup as best_of_runs
from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency


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


def sessions_frame(sessions: Sequence[Mapping[str, Any]], best: Mapping[int, BestSpeedup | None]) -> pd.DataFrame:
    rows = []
    for s in sessions:
        done, total = s.get("progress_done") or 0, s.get("progress_total") or 0
        rows.append(
            {
                "id": s["id"],
                "name": s.get("name") or "",
                "status": s.get("status"),
                "engine": StoredSession.of(s).engine,
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
