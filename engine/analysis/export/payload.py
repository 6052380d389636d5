"""What the store keeps of a recommendation: the inputs it was computed from, the decision, spectune's record."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.analysis.export.files import clean
from engine.analysis.export.spectune import record
from engine.analysis.export.versions import VLLM_VERSION
from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport


def payload_inputs(
    session_ids: Sequence[int],
    objective: str,
    budget: float | None,
    batch_size: int,
    price_per_hour: float | None,
    regime_override: str | None,
    vllm_version: str | None = None,
) -> dict[str, Any]:
    """The inputs a stored recommendation was computed from (the CLI and the page build them alike); the vLLM
    version the vLLM file was written for only when the user named another than VLLM_VERSION."""
    version = str(vllm_version or "").strip()
    named = {"vllm_version": version} if version and version != VLLM_VERSION else {}
    return {
        "session_ids": [int(x) for x in session_ids],
        "objective": objective,
        "budget": budget,
        "batch_size": int(batch_size),
        "price_per_hour": price_per_hour,
        "regime_override": regime_override,
        **named,
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def recommendation_payload(
    rec: Recommendation,
    inputs: Mapping[str, Any],
    regime: RegimeReport | None = None,
    spectune_text: str | None = None,
) -> dict[str, Any]:
    """What store.save_recommendation keeps: the inputs, the decision, and spectune's own full record.

    The one payload builder: `python -m engine recommend` and the Recommend page both store this.
    `spectune_text` is the spectune export when already made (it is read back), else the record is made
    here from `regime`.
    """
    if spectune_text is None:
        stored: Any = clean(record(rec, regime, rec.schedule))
    else:
        try:
            stored = json.loads(spectune_text)
        except ValueError:
            stored = None
    return {
        "inputs": dict(inputs),
        "speculation": "off" if rec.off else rec.method,
        "draft": rec.draft_name,
        "gamma": int(rec.gamma),
        "predicted_speedup": _finite(rec.predicted_speedup),
        # what the headline showed: the prediction, or a measured run of the configuration that disagreed with it
        "headline_speedup": _finite(rec.headline_speedup),
        "headline_measured": rec.prefers_measurement,
        "ops_multiplier": _finite(rec.ops_multiplier),
        "cost_change": _finite(rec.cost_change),
        "regime": rec.regime,
        "batch_size": int(rec.batch_size),
        "explanation": rec.explanation,
        "notes": list(rec.notes),
        "record": stored,
    }
