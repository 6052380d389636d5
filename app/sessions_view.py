"""The Sessions page's logic without Streamlit: a session's facts, the fidelity verdict, the outputs to show.

Strings here may carry user input (names, model references); the page escapes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from app import data

RUN_NUMBERS = {
    "α": "%.3f",
    "mean acceptance length": "%.2f",
    "c": "%.3f",
    "tokens/s": "%.1f",
    "baseline tokens/s": "%.1f",
    "speedup measured": "%.2f×",
    "speedup predicted": "%.2f×",
}
RUN_HELPS = {"mean acceptance length": "tokens per target call (accepted + 1)"}
HISTORY_NUMBERS = {"best speedup": "%.2f×"}
FIDELITY_NUMBERS = {"logit margin": "%.4f", "tolerance": "%.4f"}
CATEGORY_NUMBERS = {"tokens/s": "%.1f", "speedup": "%.2f×", "draft share": "%.2f"}
VERDICTS = ["identical", "numerical near-tie", "bug", "not applicable (sampled)"]


def facts(session: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs for the line under a session's title; missing values are "—"."""
    temps = ", ".join(f"{float(t):g}" for t in session.get("temperatures") or [])
    return [
        ("Target", str(session.get("target") or "—")),
        ("drafts", ", ".join(map(str, session.get("drafts") or [])) or "—"),
        ("γ", ", ".join(map(str, session.get("gammas") or [])) or "—"),
        ("T", temps or "—"),
        ("max new tokens", _or_dash(session.get("max_new_tokens"))),
        ("dtype", str(session.get("dtype") or "—")),
        ("prompts", f"{_or_dash(session.get('n_prompts'))} (set #{_or_dash(session.get('prompt_set_id'))})"),
    ]


def _or_dash(value: Any) -> str:
    return "—" if value is None or value == "" else str(value)


def hardware_label(session: Mapping[str, Any]) -> str:
    """Where the session ran: its summary's hardware, else the session's own note."""
    hardware = (session.get("summary") or {}).get("hardware")
    label = hardware.get("label") if isinstance(hardware, Mapping) else None
    return str(label or session.get("hardware") or "not recorded yet")


def regime_details(regime: Any) -> tuple[str, list[str], dict[str, Any]] | None:
    """(label, evidence lines, the other fields) of a stored regime, or None when none was detected."""
    if not isinstance(regime, Mapping) or not regime.get("label"):
        return None
    evidence = regime.get("evidence")
    if isinstance(evidence, list | tuple):
        lines = [str(line) for line in evidence]
    else:
        lines = [str(evidence)] if evidence else []
    return str(regime["label"]), lines, {k: v for k, v in regime.items() if k != "evidence"}


def runs_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The runs table; the status column only while some run is not done."""
    table = data.runs_frame(runs)
    return table.drop(columns=["status"]) if (table["status"] == "done").all() else table


def fidelity_message(counts: Mapping[str, int]) -> tuple[str, str] | None:
    """(kind, text) summing up the fidelity verdicts: kind is "error", "info" or "success"."""
    if counts.get("bug"):
        return "error", (
            f"{counts['bug']} output(s) differ from the target alone by more than numerical noise allows: "
            "that is a bug in the decoding, not rounding."
        )
    if counts.get("numerical near-tie"):
        return "info", (
            "Some outputs differ at a greedy near-tie: the target's top two logits were within the dtype's "
            "rounding noise, so a batched verify forward may pick the other one. That is within hardware numerics."
        )
    if counts.get("identical"):
        return "success", "Every greedy speculative output is identical to the target's own."
    return None


def category_chart_frame(categories: pd.DataFrame) -> pd.DataFrame:
    return categories.dropna(subset=["speedup"]).rename(columns={"run": "config"})


def comparison_chart_frame(table: pd.DataFrame) -> pd.DataFrame:
    frame = table.dropna(subset=["speedup measured"]).rename(columns={"speedup measured": "speedup"})
    return frame[["config", "session", "speedup"]]


def output_prompt_text(output: Mapping[str, Any], prompts: Sequence[Mapping[str, Any]]) -> str:
    """The prompt an output answers, or a line saying it is no longer stored."""
    by_id, ordered = data.prompt_lookup(prompts)
    prompt = data.prompt_for(output, by_id, ordered)
    return prompt["text"] if prompt else f"(prompt {output.get('prompt_id')} no longer stored)"
