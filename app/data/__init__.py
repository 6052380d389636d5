"""Store dicts to tables for the pages, and the Run form's text parsing, one module per job. Pure functions, no
Streamlit: the form's text (parse), sessions (sessions), runs (runs), decoded outputs beside the target's
(outputs) and utilisation samples (utilisation). Kept apart from the pages so they can be tested directly and
reused by every page that shows a session, a run or a comparison."""

from __future__ import annotations

from app.data.outputs import VERDICT_LABELS, fidelity_frame, prompt_for, prompt_lookup, prompt_number, verdict_counts
from app.data.parse import parse_float_list, parse_int_list, parse_refs, parse_session_param
from app.data.runs import (
    RUN_COLUMNS,
    category_frame,
    comparison_frame,
    finished,
    most_drafted,
    noisy_verdict,
    positions_frame,
    runs_frame,
    speedup_long,
    surface_frame,
)
from app.data.sessions import best_speedup, prompt_set_label, queued_text, sessions_ahead, sessions_frame
from app.data.utilisation import UTILISATION_LABELS, utilisation_label, utilisation_long
from engine.service.api import BestSpeedup, cancelled_text, run_concurrency, run_label

__all__ = [
    "BestSpeedup", "run_label", "cancelled_text", "run_concurrency", "RUN_COLUMNS", "UTILISATION_LABELS",
    "VERDICT_LABELS", "best_speedup", "category_frame", "comparison_frame", "fidelity_frame", "finished",
    "most_drafted", "noisy_verdict", "parse_float_list", "parse_int_list", "parse_refs", "parse_session_param",
    "positions_frame", "prompt_for", "prompt_lookup", "prompt_number", "prompt_set_label", "queued_text",
    "runs_frame", "sessions_ahead", "sessions_frame", "speedup_long", "surface_frame", "utilisation_label",
    "utilisation_long", "verdict_counts",
]  # fmt: skip
