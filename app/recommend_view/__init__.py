"""The Recommend page's logic without Streamlit, one module per job: the headline and its inputs (headline), the
evidence under it: the γ curve and the draft comparison (evidence), the γ schedule (schedule), the concurrency
surface (surface), and the exports with their history (exports).

Everything here reads a Recommendation, the Evidence it rests on or the RegimeReport judged for it, and returns
DataFrames, Stylers or strings, so the page stays layout only and the numbers can be tested without a browser.
Domain decisions (the regime, the knee, the payload) are made in the engine, not here. Text that may carry user
input (draft and session names) is escaped by the page, except where a function says it returns markdown."""

from __future__ import annotations

from app.recommend_view.evidence import (
    BEYOND_DEPTH_MARK,
    COMPARISON_COLUMNS,
    COMPARISON_FORMATS,
    COMPARISON_HELP,
    CROSSOVER_MARK,
    CURVE_CAPTION,
    CURVE_COLUMNS,
    CURVE_FORMATS,
    ENGINE_NUMBERS,
    EXTRAPOLATED_MARK,
    HIGHLIGHT,
    MEASUREMENT_ERROR_MARK,
    NOISY_MEASURED_MARK,
    NVML_NOTE,
    RECOMMENDED_MARK,
    SWEEP_CAPTION,
    candidate_label,
    candidate_labels,
    candidates,
    comparison_check,
    comparison_frame,
    curve_chart_frames,
    curve_frame,
    curve_picker_key,
    curve_view,
    default_candidate,
    reference_line,
    styled_comparison,
    styled_curve,
    sweep_frame,
    verify_frame,
    winner_index,
)
from app.recommend_view.exports import (
    export_caption,
    fingerprint,
    history_download_label,
    history_frame,
    history_label,
    saved_configuration,
    saved_sessions,
)
from app.recommend_view.headline import (
    HELP,
    INTRO,
    NOT_MEASURED,
    OBJECTIVE_LABELS,
    REGIME_CHOICES,
    REGIME_LABELS,
    best_fixed_caption,
    budget_fraction,
    confirm_queued_text,
    decision_banner,
    decision_metrics,
    decision_parts,
    mixed_targets,
    money,
    money_change,
    money_metrics,
    no_sessions_text,
    override_or_none,
    pct,
    preselection_problems,
    price_or_none,
    regime_heading,
    split_preselection,
)
from app.recommend_view.schedule import SCHEDULE_TEXT, schedule_frame, schedule_text
from app.recommend_view.surface import (
    FLIP,
    IMPOSSIBLE_MARK,
    IMPOSSIBLE_STYLE,
    LOSES,
    NOISY_MARK,
    SURFACE_TEXT,
    gamma_text,
    level_column,
    styled_surface,
    surface_chart_frame,
    surface_label,
    surface_table,
)

__all__ = [
    "BEYOND_DEPTH_MARK", "COMPARISON_COLUMNS", "COMPARISON_FORMATS", "COMPARISON_HELP", "CROSSOVER_MARK",
    "CURVE_CAPTION", "CURVE_COLUMNS", "CURVE_FORMATS", "ENGINE_NUMBERS", "EXTRAPOLATED_MARK", "FLIP", "HELP",
    "HIGHLIGHT", "IMPOSSIBLE_MARK", "IMPOSSIBLE_STYLE", "INTRO", "LOSES", "MEASUREMENT_ERROR_MARK", "NOISY_MARK",
    "NOISY_MEASURED_MARK", "NOT_MEASURED", "NVML_NOTE", "OBJECTIVE_LABELS", "RECOMMENDED_MARK", "REGIME_CHOICES",
    "REGIME_LABELS", "SCHEDULE_TEXT", "SURFACE_TEXT", "SWEEP_CAPTION", "best_fixed_caption", "budget_fraction",
    "candidate_label", "candidate_labels", "candidates", "comparison_check", "comparison_frame",
    "confirm_queued_text", "curve_chart_frames", "curve_frame", "curve_picker_key", "curve_view", "decision_banner",
    "decision_metrics", "decision_parts", "default_candidate", "export_caption", "fingerprint", "gamma_text",
    "history_download_label", "history_frame", "history_label", "level_column", "mixed_targets", "money",
    "money_change", "money_metrics", "no_sessions_text", "override_or_none", "pct", "preselection_problems",
    "price_or_none", "reference_line", "regime_heading", "saved_configuration", "saved_sessions", "schedule_frame",
    "schedule_text", "split_preselection", "styled_comparison", "styled_curve", "styled_surface",
    "surface_chart_frame", "surface_label", "surface_table", "sweep_frame", "verify_frame", "winner_index",
]  # fmt: skip
