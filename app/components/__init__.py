"""Streamlit widgets the pages share, one module per job: tables, the session pickers, a session's progress and
status, the Run form's switches and estimate, the Recommend page's sections that read the store beyond the
recommendation (the policy, the surface, the history), and the stored decision's banner."""

from __future__ import annotations

from app.components.decision import decision_banner, query_decision, session_decision, stored_decision
from app.components.pickers import SESSION_PARAM, engine_picker, session_picker, sessions_picker, temperature_picker
from app.components.recommend import (
    NO_POLICY_TRACE,
    NOTHING_TO_REPLAY,
    policy_headline,
    policy_section,
    recommendation_history,
    surface_section,
)
from app.components.run_form import estimate, full_grid_confirm, regime_switch
from app.components.session import confirm_delete, measurement_notes, session_progress, status_banner
from app.components.tables import MISSING, reference_table, table

__all__ = [
    "MISSING", "NOTHING_TO_REPLAY", "NO_POLICY_TRACE", "SESSION_PARAM", "confirm_delete", "decision_banner",
    "engine_picker", "estimate", "full_grid_confirm", "measurement_notes", "policy_headline", "policy_section",
    "query_decision", "recommendation_history", "reference_table", "regime_switch", "session_decision",
    "session_picker", "session_progress", "sessions_picker", "status_banner", "stored_decision", "surface_section",
    "table", "temperature_picker",
]  # fmt: skip
