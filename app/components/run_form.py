"""The Run form's shared switches: the regime sweep, the full grid's confirmation, and the session's estimate."""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import common, run_view
from app.common import md_escape


def regime_switch(column: Any, engine: str, cost: str) -> None:
    """The "detect regime afterwards" switch and its cost, where the engine runs the batch sweep; elsewhere a
    switch that is off and cannot be turned on, and why (it was once ticked and then never ran)."""
    if run_view.sweeps_regime(engine):
        column.checkbox("detect regime afterwards", value=True, key="detect_regime")
        column.caption(md_escape(cost))
        return
    column.checkbox("detect regime afterwards", value=False, disabled=True, key="detect_regime_off")
    column.caption(md_escape(run_view.no_regime_note(engine)))


def full_grid_confirm(mode: str) -> None:
    """The full grid's "run the recommendation live" checkbox, only in full mode (a quick session always
    confirms)."""
    if mode == "full":
        st.checkbox(run_view.CONFIRM_LABEL, value=True, key="confirm", help=run_view.CONFIRM_HELP)


def estimate(store: Any, probe: bool) -> list[str] | None:
    """The form's session estimated (after a pace probe when `probe`, whose stage, tokens timed and seconds show
    while it runs), in one info line, its sentences returned; an invalid form or a failed probe is one error line
    (None)."""
    where = st.empty()

    def probing(progress: Any) -> None:
        where.caption(md_escape(run_view.probe_progress_text(progress)))

    with st.spinner("Timing the target alone…" if probe else "Estimating…"):
        lines = common.attempt(
            run_view.estimate_lines,
            store,
            st.session_state,
            probe,
            probing if probe else None,
            action="estimate the session",
        )
    where.empty()
    if lines:
        st.info(md_escape(" ".join(lines)))
    return lines
