"""The live view's phases and polling: the progress bar, phase text and ETA, and the poll interval."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

POLL_S = 1.0  # while prompts decode: the page follows the store within about a second

LONG_PHASE_POLL_S = 3.0  # loading models, v(k), warm-up, agreement pass, batch sweep, queued: nothing to chart


def skip_gc_after_each_run() -> None:
    """Turn off Streamlit's full gc.collect() after every script run (runner.postScriptGC), fragment reruns
    included. In the dashboard's process, which has torch and transformers imported (the hardware banner, the
    token view), one full collection costs about 250 ms of CPU: three quarters of a live view's refresh.
    Python's own generational collector still runs. Process-wide, set once."""
    from streamlit import config

    if config.get_option("runner.postScriptGC"):
        config.set_option("runner.postScriptGC", False)


def progress_bar(session: Mapping[str, Any]) -> tuple[float, str]:
    """The session's overall progress bar: (fraction, 'Progress: 3 / 12 prompt decodes (25%) — running')."""
    done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
    fraction = min(1.0, done / total) if total else 0.0
    return fraction, f"Progress: {done} / {total} prompt decodes ({fraction:.0%}) — {session.get('status')}"


def is_decoding(phase: Mapping[str, Any] | None) -> bool:
    return bool(phase) and str(phase.get("name", "")).startswith("decoding")


def poll_interval(status: str | None, phase: Mapping[str, Any] | None) -> float:
    """How often the live fragment reruns: every second while prompts decode, every few seconds in a long
    phase that logs no steps (or while the session waits for a worker)."""
    return POLL_S if status == "running" and (phase is None or is_decoding(phase)) else LONG_PHASE_POLL_S


def fmt_eta(seconds: float | None) -> str | None:
    """'about 40 s', 'about 3 min', 'about 1 h 5 min'; None when unknown."""
    if seconds is None:
        return None
    seconds = max(0.0, float(seconds))
    if seconds < 5:
        return "a few seconds"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 3600:
        return f"about {seconds / 60:.0f} min"
    return f"about {int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def phase_text(phase: Mapping[str, Any] | None, status: str | None = None, now: float | None = None) -> str | None:
    """'Phase: decoding prompt 3 of 8 — 17 / 40 (42%), about 1 min left' (at Unix time `now`, by default the
    clock's: phase_eta); for a session that has ended, the phase it stopped in ('Stopped during: …'), or None when it
    finished (its banner says so) or there is no phase."""
    if not phase or not phase.get("name"):
        return None
    name = str(phase["name"])
    if status not in (None, "queued", "running"):
        return None if name == "done" else f"Stopped during: {name}"
    done, total = int(phase.get("done") or 0), int(phase.get("total") or 0)
    parts = [f"Phase: {name}"]
    if total > 1 and name != "done" and not is_decoding(phase):  # decoding counts the progress bar's prompt decodes
        parts.append(f"{done} / {total} ({min(1.0, done / total):.0%})")
    eta = phase_eta(phase, now) if status in (None, "running") and name != "done" else None
    text = " — ".join(parts)
    return f"{text}, {eta}" if eta else text


def phase_eta(phase: Mapping[str, Any], now: float | None = None) -> str | None:
    """The phase's time left, counted down from when the worker estimated it (its `at`, Unix seconds) to `now`:
    'about 90 s left'; once that time has passed, 'taking longer than estimated (about 2 min)', never the stale
    figure. None when there is no estimate."""
    eta = phase.get("eta_s")
    if eta is None or float(eta) <= 0:
        return None
    at = phase.get("at")
    if at is None:
        return f"{fmt_eta(eta)} left"
    passed = max(0.0, (time.time() if now is None else now) - float(at))
    if passed < float(eta):
        return f"{fmt_eta(float(eta) - passed)} left"
    return f"taking longer than estimated ({fmt_eta(eta)})"


def phase_fraction(phase: Mapping[str, Any] | None) -> float:
    if not phase:
        return 0.0
    done, total = int(phase.get("done") or 0), int(phase.get("total") or 0)
    return 1.0 if phase.get("name") == "done" else (min(1.0, done / total) if total else 0.0)
