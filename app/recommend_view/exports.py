"""The Recommend page's exports without Streamlit: their caption, and the saved recommendations' history."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.service.api import (
    Recommendation,
)


def export_caption(rec: Recommendation) -> str:
    off = " — speculation off is exported too, as an explained absence, so nobody re-enables it by accident"
    return (
        f"Paste-ready configuration for each server{off if rec.off else ''}. Downloading a file also keeps it in the "
        "history below."
    )


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
