"""Sessions: the history, one session's results (runs, fidelity, categories), comparisons, deletion.

Measured speedup sits next to the prediction from the measured α and c; the fidelity verdict says
per prompt whether the speculative output is the target's (identical), differs only at a numerical
near-tie, or differs by more than numerics allow (a bug). Opened session id: ?session=N.
"""

from functools import partial
from typing import Any

import streamlit as st

from app import charts, common, components, data
from app import sessions_view as sv
from app.common import ACTIVE_STATUSES, md_escape
from engine.service.api import report_filename, report_or_error, session_prompts

common.page_setup("Sessions")
st.title("Sessions")
common.hardware_banner()
store = common.get_store()
OPEN = "sessions_open"

sessions = common.attempt(store.list_sessions, action="list the sessions")
if not sessions:
    if sessions is not None:
        st.info("No sessions yet: start one on the Run page.")
        st.page_link(common.PAGES["Run"], label="Go to Run", icon=common.ICONS["Run"])
    st.stop()

by_id = {s["id"]: s for s in sessions}


@st.cache_data(show_spinner=False, ttl=2)
def _runs(session_id: int, status: str) -> list[dict[str, Any]]:  # status: part of the cache key
    return store.list_runs(session_id)


def _best(session: dict[str, Any]) -> data.BestSpeedup | None:
    best = data.best_speedup(session)
    if best is None and session["status"] != "queued":
        best = data.best_speedup(session, _runs(session["id"], session["status"]))
    return best


st.subheader("History")
with common.guard("build the history table"):
    history = data.sessions_frame(sessions, {s["id"]: _best(s) for s in sessions})
    components.table(history, numbers=sv.HISTORY_NUMBERS, dates=["created"], widths=sv.HISTORY_WIDTHS)


def show_fidelity(fidelity: Any) -> None:
    counts = data.verdict_counts(fidelity)
    for col, label in zip(st.columns(len(sv.VERDICTS)), sv.VERDICTS, strict=True):
        col.metric(label, counts.get(label, 0))
    message = sv.fidelity_message(counts)
    if message is not None:
        kind, text = message
        {"error": st.error, "info": st.info, "success": st.success}[kind](text)
    components.table(fidelity, numbers=sv.FIDELITY_NUMBERS)


def show_categories(runs: list[dict], outputs_by_run: dict[int, list], prompts: list[dict]) -> None:
    st.markdown("#### By category")
    cats = data.category_frame(runs, outputs_by_run, prompts)
    if cats.empty:
        st.caption(sv.category_empty_text(runs))
        return
    st.caption(sv.CATEGORY_BASIS)
    components.table(cats, numbers=sv.CATEGORY_NUMBERS)
    chart_frame = sv.category_chart_frame(cats)
    if not chart_frame.empty:
        st.markdown("**Speedup by prompt category** (against the baseline on the same prompts)")
        st.altair_chart(charts.speedup_grouped(chart_frame, "category"), width="stretch")


def show_outputs(session: dict[str, Any], runs: list[dict], outputs_by_run: dict[int, list], prompts: list) -> None:
    sid = session["id"]
    with_outputs = [r for r in runs if outputs_by_run.get(r["id"])]
    if not with_outputs:
        st.caption("No outputs stored yet.")
        return
    labels = {r["id"]: data.run_label(r) for r in with_outputs}
    run_id = st.selectbox("Run", list(labels), format_func=labels.get, key=f"outputs_run_{sid}")
    outs = outputs_by_run[run_id]
    number = st.number_input("Prompt", min_value=1, max_value=len(outs), value=1, key=f"outputs_idx_{sid}_{run_id}")
    output = outs[int(number) - 1]
    st.caption("Prompt")
    st.text(sv.output_prompt_text(output, prompts))
    st.caption("Output")
    common.show_output(session["target"], output)


def show_session(session: dict[str, Any]) -> None:
    sid, status = session["id"], session["status"]
    icon = common.STATUS_ICONS.get(status, "")
    st.markdown(f"### #{sid} {md_escape(common.one_line(session.get('name'), 100))} — {icon} {status}")
    components.status_banner(session, here="Sessions")
    for note in (sv.machine_note(session), sv.noisy_note(session)):
        if note:
            st.warning(md_escape(note), icon=common.ICONS["warning"])
    components.session_decision(store, session)
    components.measurement_notes(session)
    st.markdown(" · ".join(f"**{label}** {md_escape(value)}" for label, value in sv.facts(session)))
    if suffix_note := sv.suffix_cache_note(session):
        st.caption(md_escape(suffix_note))
    created = common.fmt_time(session.get("created_at"))
    st.caption(f"Hardware: {md_escape(sv.hardware_label(session))} · created {created}")
    st.download_button("⬇ Report (one HTML file)", data=partial(report_or_error, store, sid), key=f"report_{sid}",
                       file_name=report_filename(sid), mime="text/html", on_click="ignore",
                       help="Settings, runs, charts, the recommendation and its exports, to share")  # fmt: skip

    regime = sv.regime_details(session.get("regime"))
    if regime is not None:
        label, evidence, _ = regime
        with st.expander(f"Regime: {md_escape(label)}", expanded=False):
            if evidence:
                st.markdown("\n".join(f"- {md_escape(line)}" for line in evidence))
            st.page_link(common.PAGES["Recommend"], label="Batch sweep, v(k) and roofline charts: Recommend")

    runs = store.list_runs(sid)
    if not runs:
        st.caption("No runs yet.")
    else:
        st.markdown("#### Runs")
        components.table(
            sv.runs_table(runs), numbers=sv.RUN_NUMBERS, helps=sv.RUN_HELPS, labels=sv.RUN_LABELS, widths=sv.RUN_WIDTHS
        )
        if unfinished := sv.unfinished_note(session, runs):
            st.caption(unfinished)
        if impossible := sv.impossible_note(runs):
            st.warning("**Impossible speedups, not results:**\n" + "\n".join(f"- {md_escape(x)}" for x in impossible))
        speed = sv.speedup_frame(runs)
        if not speed.empty:
            st.markdown(
                "**Speedup: measured over the whole run (the bar spans the lowest to the highest prompt), and "
                "predicted from the measured α, c and verify cost**"
            )
            st.altair_chart(charts.speedup_grouped(speed, "which"), width="stretch")
        surface = sv.concurrency_surface(runs)
        if not surface.empty:
            st.markdown("**Speedup surface: γ × concurrency** (each against the target alone at the same level, "
                        "measured side by side)")  # fmt: skip
            st.altair_chart(charts.concurrency_surface(surface), width="stretch")
            st.markdown("\n".join(f"- {md_escape(line)}" for line in sv.stops_paying(runs)))

        outputs_by_run = {r["id"]: store.get_outputs(r["id"]) for r in runs}
        set_id = session.get("prompt_set_id")
        prompts = session_prompts(store.get_prompts, session) if set_id else []
        st.markdown("#### Fidelity: is the speculative output the target's?")
        fidelity = data.fidelity_frame(runs, outputs_by_run, prompts)
        if fidelity.empty:
            st.caption("No speculative outputs yet.")
        else:
            show_fidelity(fidelity)
        if any(p.get("category") for p in prompts):
            show_categories(runs, outputs_by_run, prompts)
        with st.expander("Outputs"):
            show_outputs(session, runs, outputs_by_run, prompts)

    st.markdown("#### Delete")
    if status in ACTIVE_STATUSES:
        st.caption("A queued or running session must be cancelled (Run page) before it can be deleted.")
    components.confirm_delete(
        f"session #{sid}",
        lambda: store.delete_session(sid),
        confirm=f"Yes, delete session #{sid} with all its runs, steps and outputs",
        keys=(f"confirm_del_session_{sid}", f"delete_session_{sid}"),
        button="Delete session",
        forget=[OPEN],
        forget_url=True,
    )


st.subheader("Open a session")
opened = components.session_picker("Session", sessions, OPEN, default=sessions[0]["id"])
if opened is not None:
    with common.guard(f"show session #{opened['id']}"):
        show_session(store.get_session(opened["id"]) or dict(opened))

st.divider()
st.subheader("Compare sessions")
chosen = st.multiselect(
    "Sessions to compare", list(by_id), format_func=lambda i: common.session_label(by_id[i]), key="compare_sessions"
)
if chosen:
    with common.guard("compare the sessions"):
        table = data.comparison_frame([by_id[i] for i in chosen], {i: store.list_runs(i) for i in chosen})
        if table.empty:
            st.info("The chosen sessions have no speculative runs yet.")
        else:
            components.table(table, numbers=sv.RUN_NUMBERS)
            frame = sv.comparison_chart_frame(table)
            if not frame.empty:
                st.markdown("**Measured speedup by configuration and session**")
                st.altair_chart(charts.speedup_grouped(frame, "session"), width="stretch")
else:
    st.caption("Pick two or more sessions to see their runs side by side.")
