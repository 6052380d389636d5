"""Sessions: the history, one session's results (runs, fidelity, categories), comparisons, deletion.

Measured speedup sits next to the prediction from the measured α and c; the fidelity verdict says
per prompt whether the speculative output is the target's (identical), differs only at a numerical
near-tie, or differs by more than numerics allow (a bug). Opened session id: ?session=N.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from typing import Any  # noqa: E402

import streamlit as st  # noqa: E402

from app import charts, common, data  # noqa: E402
from app.common import ACTIVE_STATUSES, md_escape  # noqa: E402

common.page_setup("Sessions")
st.title("📊 Sessions")
common.hardware_banner()
store = common.get_store()
OPEN = "sessions_open"

NUMBER = st.column_config.NumberColumn
RUN_COLUMN_CONFIG = {
    "α": NUMBER(format="%.3f"),
    "mean acceptance length": NUMBER(format="%.2f", help="tokens per target call (accepted + 1)"),
    "c": NUMBER(format="%.3f"),
    "tokens/s": NUMBER(format="%.1f"),
    "baseline tokens/s": NUMBER(format="%.1f"),
    "speedup measured": NUMBER(format="%.2f×"),
    "speedup predicted": NUMBER(format="%.2f×"),
}

sessions = common.attempt(store.list_sessions, action="list the sessions")
if not sessions:
    if sessions is not None:
        st.info("No sessions yet: start one on the Run page.")
        st.page_link(common.PAGES["Run"], label="Go to Run", icon="▶️")
    st.stop()

by_id = {s["id"]: s for s in sessions}


@st.cache_data(show_spinner=False, ttl=2)
def _runs(session_id: int, status: str) -> list[dict[str, Any]]:  # status: part of the cache key
    return store.list_runs(session_id)


def _best(session: dict[str, Any]) -> float | None:
    best = data.best_speedup(session)
    if best is None and session["status"] != "queued":
        best = data.best_speedup(session, _runs(session["id"], session["status"]))
    return best


# ---------------------------------------------------------------------------------------------------------------------
# History

st.subheader("History")
with common.guard("build the history table"):
    history = data.sessions_frame(sessions, {s["id"]: _best(s) for s in sessions})
    st.dataframe(
        history,
        hide_index=True,
        width="stretch",
        column_config={
            "best speedup": NUMBER(format="%.2f×"),
            "created": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
        },
    )


# ---------------------------------------------------------------------------------------------------------------------
# One session


def _sync_open_to_url() -> None:
    chosen = st.session_state.get(OPEN)
    if chosen is not None:
        st.query_params["session"] = str(chosen)


def show_session(session: dict[str, Any]) -> None:
    sid = session["id"]
    status = session["status"]
    icon = common.STATUS_ICONS.get(status, "")
    st.markdown(f"### #{sid} {md_escape(common.one_line(session.get('name'), 100))} — {icon} {status}")
    if status == "failed":
        st.error(f"This session failed: {md_escape(session.get('error') or 'no error message was recorded')}")
    elif status == "cancelled":
        st.info(f"Cancelled. {md_escape(session.get('error') or '')}")
    elif status in ACTIVE_STATUSES:
        done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
        st.info(f"This session is {status} ({done}/{total}); results fill in as runs finish.")
        st.page_link(common.PAGES["Run"], label="Watch it live", icon="▶️", query_params={"session": sid})

    summary = session.get("summary") or {}
    hw_label = (summary.get("hardware") or {}).get("label") if isinstance(summary.get("hardware"), dict) else None
    hw_label = hw_label or session.get("hardware") or "not recorded yet"
    temps = ", ".join(f"{float(t):g}" for t in session.get("temperatures") or [])
    st.markdown(
        f"**Target** {md_escape(session['target'])} · **drafts** {md_escape(', '.join(session.get('drafts') or []))} · "
        f"**γ** {md_escape(', '.join(map(str, session.get('gammas') or [])))} · **T** {md_escape(temps)} · "
        f"**max new tokens** {session.get('max_new_tokens')} · **dtype** {md_escape(session.get('dtype') or '—')} · "
        f"**prompts** {session.get('n_prompts') or '—'} (set #{session.get('prompt_set_id') or '—'})"
    )
    st.caption(f"Hardware: {md_escape(hw_label)} · created {common.fmt_time(session.get('created_at'))}")

    regime = session.get("regime")
    if isinstance(regime, dict) and regime.get("label"):
        with st.expander(f"Regime: {md_escape(regime['label'])}", expanded=False):
            evidence = regime.get("evidence")
            if isinstance(evidence, list | tuple):
                for line in evidence:
                    st.markdown(f"- {md_escape(line)}")
            elif evidence:
                st.text(str(evidence))
            st.json({k: v for k, v in regime.items() if k != "evidence"}, expanded=False)

    runs = store.list_runs(sid)
    if not runs:
        st.caption("No runs yet.")
        return

    st.markdown("#### Runs")
    runs_table = data.runs_frame(runs)
    if (runs_table["status"] == "done").all():
        runs_table = runs_table.drop(columns=["status"])
    st.dataframe(runs_table, hide_index=True, width="stretch", column_config=RUN_COLUMN_CONFIG)
    speed = data.speedup_long(runs)
    if not speed.empty:
        st.markdown("**Speedup: measured, and predicted from the measured α, c and verify cost**")
        st.altair_chart(charts.speedup_grouped(speed, "which"), width="stretch")

    outputs_by_run = {r["id"]: store.get_outputs(r["id"]) for r in runs}
    prompts: list[dict[str, Any]] = []
    if session.get("prompt_set_id"):
        prompts = store.get_prompts(session["prompt_set_id"], limit=session.get("n_prompts"))

    st.markdown("#### Fidelity: is the speculative output the target's?")
    fidelity = data.fidelity_frame(runs, outputs_by_run, prompts)
    if fidelity.empty:
        st.caption("No speculative outputs yet.")
    else:
        counts = data.verdict_counts(fidelity)
        cols = st.columns(4)
        for col, label in zip(
            cols, ["identical", "numerical near-tie", "bug", "not applicable (sampled)"], strict=True
        ):
            col.metric(label, counts.get(label, 0))
        if counts.get("bug"):
            st.error(
                f"{counts['bug']} output(s) differ from the target alone by more than numerical noise allows: "
                "that is a bug in the decoding, not rounding."
            )
        elif counts.get("numerical near-tie"):
            st.info(
                "Some outputs differ at a greedy near-tie: the target's top two logits were within the dtype's "
                "rounding noise, so a batched verify forward may pick the other one. That is within hardware numerics."
            )
        elif counts.get("identical"):
            st.success("Every greedy speculative output is identical to the target's own.")
        st.dataframe(
            fidelity,
            hide_index=True,
            width="stretch",
            column_config={"logit margin": NUMBER(format="%.4f"), "tolerance": NUMBER(format="%.4f")},
        )

    if any(p.get("category") for p in prompts):
        st.markdown("#### By category")
        cats = data.category_frame(runs, outputs_by_run, prompts)
        if cats.empty:
            st.caption("No outputs with a category yet.")
        else:
            st.dataframe(
                cats,
                hide_index=True,
                width="stretch",
                column_config={
                    "tokens/s": NUMBER(format="%.1f"),
                    "speedup": NUMBER(format="%.2f×"),
                    "draft share": NUMBER(format="%.2f"),
                },
            )
            chart_frame = cats.dropna(subset=["speedup"]).rename(columns={"run": "config"})
            if not chart_frame.empty:
                st.markdown("**Speedup by prompt category** (against the baseline on the same prompts)")
                st.altair_chart(charts.speedup_grouped(chart_frame, "category"), width="stretch")

    with st.expander("Outputs"):
        with_outputs = [r for r in runs if outputs_by_run.get(r["id"])]
        if not with_outputs:
            st.caption("No outputs stored yet.")
        else:
            run_id = st.selectbox(
                "Run",
                [r["id"] for r in with_outputs],
                format_func=lambda i: data.run_label(next(r for r in runs if r["id"] == i)),
                key=f"outputs_run_{sid}",
            )
            outs = outputs_by_run[run_id]
            index = st.number_input(
                "Prompt index", min_value=0, max_value=len(outs) - 1, value=0, key=f"outputs_idx_{sid}_{run_id}"
            )
            output = outs[int(index)]
            prompt = None
            if prompts:
                by_pid = {str(p["id"]): p for p in prompts}
                prompt = by_pid.get(str(output.get("prompt_id")))
                if prompt is None and 0 <= output.get("prompt_index", -1) < len(prompts):
                    prompt = prompts[output["prompt_index"]]
            st.caption("Prompt")
            st.text(prompt["text"] if prompt else f"(prompt {output.get('prompt_id')} no longer stored)")
            st.caption("Output")
            common.show_output(session["target"], output)

    st.markdown("#### Delete")
    if status in ACTIVE_STATUSES:
        st.caption("A queued or running session must be cancelled (Run page) before it can be deleted.")
    confirm = st.checkbox(
        f"Yes, delete session #{sid} with all its runs, steps and outputs", key=f"confirm_del_session_{sid}"
    )
    if st.button("Delete session", disabled=not confirm, key=f"delete_session_{sid}"):
        try:
            deleted = store.delete_session(sid)
        except Exception as exc:  # noqa: BLE001
            common.show_error(exc, f"delete session #{sid}")
        else:
            if deleted:
                st.session_state.pop(OPEN, None)
                st.query_params.pop("session", None)
                st.toast(f"Deleted session #{sid}")
                st.rerun()
            else:
                st.warning(f"Session #{sid} was already gone.")


st.subheader("Open a session")
wanted = common.query_int("session")
if wanted is not None and wanted not in by_id:
    st.warning(f"Session #{wanted} (from the address bar) does not exist.")
    wanted = None
if wanted is not None:
    st.session_state[OPEN] = wanted
elif st.session_state.get(OPEN) not in by_id:
    st.session_state[OPEN] = sessions[0]["id"]
opened = st.selectbox(
    "Session",
    list(by_id),
    format_func=lambda i: common.session_label(by_id[i]),
    key=OPEN,
    on_change=_sync_open_to_url,
)
if opened is not None:
    with common.guard(f"show session #{opened}"):
        show_session(store.get_session(opened) or by_id[opened])


# ---------------------------------------------------------------------------------------------------------------------
# Compare

st.divider()
st.subheader("Compare sessions")
chosen = st.multiselect(
    "Sessions to compare",
    list(by_id),
    format_func=lambda i: common.session_label(by_id[i]),
    key="compare_sessions",
)
if chosen:
    with common.guard("compare the sessions"):
        picked = [by_id[i] for i in chosen]
        runs_by_session = {i: store.list_runs(i) for i in chosen}
        table = data.comparison_frame(picked, runs_by_session)
        if table.empty:
            st.info("The chosen sessions have no speculative runs yet.")
        else:
            st.dataframe(table, hide_index=True, width="stretch", column_config=RUN_COLUMN_CONFIG)
            frame = table.dropna(subset=["speedup measured"]).rename(columns={"speedup measured": "speedup"})
            if not frame.empty:
                st.markdown("**Measured speedup by configuration and session**")
                st.altair_chart(
                    charts.speedup_grouped(frame[["config", "session", "speedup"]], "session"), width="stretch"
                )
else:
    st.caption("Pick two or more sessions to see their runs side by side.")
