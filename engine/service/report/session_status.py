"""How a session that did not finish ended, in the words every page and the report use.

A cancelled session is no error: the user stopped it (its runs that had not finished have no figures); an
interrupted one lost its worker; a failed one ended with an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNFINISHED_RUNS = (
    "Runs that did not finish have no figures: their speedups were never summarised against the target alone nor "
    "checked against their bounds."
)


def cancelled_text(reason: str | None) -> str:
    """`Cancelled by the user.` (the worker's own reason), `Cancelled: <reason>.` for any other, else `Cancelled.`"""
    text = (reason or "").strip().rstrip(".")
    if not text:
        return "Cancelled."
    if text.lower().startswith("cancelled"):
        return f"{text[:1].upper()}{text[1:]}."
    return f"Cancelled: {text}."


def ending_note(session: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, text) of how a session ended when it did not finish: "info" for a cancelled one (not an error),
    "warning" for an interrupted one, "error" for a failure; None for a session that finished (or still runs)."""
    status, error = session.get("status"), session.get("error")
    if status == "cancelled":
        return "info", f"The session was stopped before it finished. {cancelled_text(error)} {UNFINISHED_RUNS}"
    if status == "interrupted":
        return "warning", f"The session was interrupted: {error or 'its worker stopped'}. {UNFINISHED_RUNS}"
    if error:
        return "error", f"The session ended with an error: {error}"
    return None


def session_error(session: Mapping[str, Any]) -> str:
    """The error a history row shows: none for a cancelled session (the user stopped it), else the stored one."""
    return "" if session.get("status") == "cancelled" else str(session.get("error") or "")
