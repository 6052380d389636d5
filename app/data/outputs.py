"""Decoded outputs beside the target's: each output's prompt and its fidelity verdict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency
from engine.service.api import (
    run_label,
)

VERDICT_LABELS = {
    "identical": "identical",
    "near-tie": "numerical near-tie",
    "bug": "bug",
    "not-applicable": "not applicable (sampled)",
}


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
