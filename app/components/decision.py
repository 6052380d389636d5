"""The stored decision's banner and the button that queues its confirmation, wherever a page shows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from app import common, memo
from app import recommend_view as rv
from app.common import md_escape
from engine.errors import SpectuneError
from engine.service.api import (
    DecisionQuery,
    decision_for,
    queue_confirmation,
)


def decision_banner(decision: Any) -> None:
    """The stored decision's one sentence (Decision.headline), as every page shows it."""
    banner = st.warning if decision.off else st.success
    banner(f"**Decision:** {md_escape(decision.headline())}", icon=common.ICONS["off" if decision.off else "on"])


def session_decision(store: Any, session: Mapping[str, Any]) -> None:
    """A finished session's stored decision at each temperature it measured (its serving batch, the default
    objective): the answer the Run and Recommend pages, the CLI and the report give."""
    if session.get("status") != "done":
        return
    for decision in memo.session_decisions(store, session).values():
        if decision is not None:
            decision_banner(decision)


def stored_decision(store: Any, session_ids: Sequence[int], rec: Any, *query: Any) -> None:
    """The stored decision (engine.service.decide.decisions; `query`: DecisionQuery's fields in order) as the Recommend
    page's banner, what it rests on said beside it, then the fixed γ's banner: the decision's own where it is a
    fixed γ, its runner-up's where it is a policy."""
    decision = decision_for(store, session_ids, DecisionQuery(*query))
    decision_banner(decision)
    if not decision.off and decision.measured is None:
        st.warning(md_escape(rv.NOT_MEASURED), icon=common.ICONS["info"])
        if st.button(f"▶ Confirm it: queue a run of {decision.configuration}", key="rec_confirm"):
            with common.guard("queue the confirmation"):
                new_id = queue_confirmation(store, session_ids, decision)
                st.success(md_escape(rv.confirm_queued_text(new_id, session_ids, common.start_worker())))
    if decision.floor and not decision.floor["holds"]:
        st.warning(md_escape(decision.floor["sentence"]), icon=common.ICONS["info"])
    if decision.policy:
        st.caption(md_escape(rv.best_fixed_caption(rec)))
    fixed = st.info if decision.policy else st.warning if rec.off else st.success  # its figures, or its runner-up's
    fixed(rv.decision_banner(rec, md_escape), icon=common.ICONS["off" if rec.off else "on"])


def query_decision(store: Any, session_ids: Sequence[int], *query: Any) -> None:
    """The stored decision for a page's query (DecisionQuery's fields in order) as its banner; nothing where the
    sessions give nothing to decide from (the page says why in its own words)."""
    try:
        decision = decision_for(store, session_ids, DecisionQuery(*query))
    except SpectuneError:
        return
    decision_banner(decision)
