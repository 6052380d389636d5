"""The Recommend page's sections that read the store beyond the recommendation: the policy, the surface and the
history of saved recommendations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from app import charts, common
from app import policies_view as pv
from app import recommend_view as rv
from app.common import md_escape
from app.components.pickers import SESSION_PARAM
from app.components.tables import table
from engine.service.api import (
    format_label,
    policy_verdict,
    surfaces,
)

NO_POLICY_TRACE = "These sessions recorded no draft trace to replay policies from (sessions from before policies)."

NOTHING_TO_REPLAY = (
    "No draft of these sessions has a policy to replay (why, per draft, above): the Recommend page's "
    "fixed γ is the policy they support."
)


def policy_section(report: Any, session_ids: list[int]) -> None:
    """The Recommend page's drafting-policy section: the best policy for the objective (what `recommend` prints),
    from the policy report the page's decision was made from."""
    st.subheader("Drafting policy: beyond a fixed γ")
    if not report.drafts:
        st.caption(md_escape("; ".join(report.notes) or NO_POLICY_TRACE))
        return
    policy_headline(report, session_ids)
    for note in report.notes:  # drafts without a replay (llama.cpp's n-gram lookup, sessions from before policies)
        st.caption(f"{common.ICONS['info']} {md_escape(note)}")


def policy_headline(report: Any, session_ids: Sequence[int] | None = None) -> None:
    """The speculation policy recommended for the objective and its gain over the best fixed γ (a PolicyReport
    from engine.service.decide.policies.session_policies); with ``session_ids``, a link to the whole comparison."""
    text, wins = policy_verdict(report, md_escape)
    (st.success if wins else st.info)(text, icon=common.ICONS["Policies"] if wins else common.ICONS["measure"])
    for col, (label, value, helptext) in zip(st.columns(4), pv.best_metrics(report), strict=False):
        col.metric(label, value, help=helptext)
    st.caption(md_escape(report.to_dict()["exact"]))
    if session_ids:
        st.page_link(
            common.PAGES["Policies"],
            label="Compare every policy, prove them live, export the policy",
            icon=common.ICONS["Policies"],
            query_params={SESSION_PARAM: ",".join(str(i) for i in session_ids)},
        )


def surface_section(store: Any, session_ids: Sequence[int]) -> None:
    """The measured γ × concurrency surface (engine.service.decide.surface) of a chosen session measured at several
    concurrency levels (vLLM); nothing when none was. Draws its own divider."""
    found = {s.session_id: s for s in surfaces(store, session_ids)}
    if not found:
        return
    st.subheader("Measured speedup: γ × concurrency")
    st.caption(rv.SURFACE_TEXT)
    sid = next(iter(found))
    if len(found) > 1:
        sid = st.selectbox(
            "Session", list(found), format_func=lambda i: rv.surface_label(found[i]), key="rec_surface_session"
        )
    surface = found[sid]
    table(rv.styled_surface(rv.surface_table(surface), surface))
    st.altair_chart(charts.concurrency_surface(rv.surface_chart_frame(surface)), width="stretch")
    st.markdown("\n".join(f"- {md_escape(stop.line())}" for stop in surface.stops))
    st.divider()


def recommendation_history(store: Any) -> None:
    """The saved recommendations, and their files to download again."""
    st.subheader("Previous recommendations")
    recs = common.attempt(store.list_recommendations, action="list the saved recommendations")
    if not recs:
        st.caption("None saved yet: download an export or press “Save to history”." if recs is not None else "")
        return
    st.caption("Every saved recommendation, from any sessions: not only the ones chosen above.")
    table(rv.history_frame(recs), numbers={"speedup": "%.2f×"}, dates=["created"])
    by_rec = {r["id"]: r for r in recs}
    chosen = st.selectbox(
        "Download a saved recommendation's files again",
        list(by_rec),
        key="rec_history_pick",
        format_func=lambda i: rv.history_label(by_rec[i]),
    )
    exports = common.attempt(store.list_exports, chosen, action=f"list the files of recommendation #{chosen}")
    if exports == []:
        st.caption("No files were saved with this recommendation.")
    for col, item in zip(st.columns(len(exports or []) or 1), exports or [], strict=False):
        label = rv.history_download_label(format_label(item["format"]), by_rec[chosen])
        col.download_button(
            label,
            data=item["content"] or "",
            file_name=item["filename"] or "export.txt",
            key=f"rec_hist_dl_{item['id']}",
            on_click="ignore",
            width="stretch",
            help=item["filename"],
        )
