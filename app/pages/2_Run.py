"""Run: queue a tuning session (target × drafts × γ × temperatures on a prompt set) and watch it live.

This page never loads a model: "Start session" validates and queues (engine.service.jobs.submit_session)
and makes sure the background worker is running; the live view is a fragment that re-reads the
store about once a second without rerunning the page. The watched session id lives in the URL
(?session=N), so a refresh picks up where it was and several tabs can watch different sessions.
"""

import streamlit as st

from app import charts, common, components, data
from app import run_view as rv
from app.common import ACTIVE_STATUSES, fmt_num, md_escape

common.page_setup("Run")
st.title("▶️ Run a tuning session")
common.hardware_banner()
store = common.get_store()
WATCH = "run_watch_session"

prompt_sets = common.attempt(store.list_prompt_sets, action="list the prompt sets") or []
sets_by_id = {s["id"]: s for s in prompt_sets}

st.subheader("New session")
if not sets_by_id:
    st.info("There is no prompt set yet: import one on the Prompts page first.")
    st.page_link(common.PAGES["Prompts"], label="Go to Prompts", icon="📝")

with st.container(border=True):
    col_t, col_x, col_dt, col_p = st.columns([3, 3, 2, 3])
    target_choice = col_t.selectbox(
        "Target model", rv.bundled_names(), index=rv.default_target_index(), format_func=rv.bundled_label,
        key="target_choice",
    )  # fmt: skip
    target_text = col_x.text_input(
        "…or another target", key="target_text",
        placeholder="local path, .gguf, cached model id, or tiny:SEED:VOCAB:LAYERS:HIDDEN",
        help="When filled in, this replaces the target chosen on the left.",
    )  # fmt: skip
    dtype = col_dt.selectbox(
        "dtype", rv.DTYPES, index=rv.DTYPES.index(rv.default_dtype(common.hardware().get("kind"))), key="dtype",
        help="The dtype the engine computes in; a GGUF's quantised weights are dequantised to it.",
    )  # fmt: skip
    prompt_set_id = col_p.selectbox(
        "Prompt set", list(sets_by_id), format_func=lambda i: data.prompt_set_label(sets_by_id[i]), key="prompt_set",
        on_change=lambda: st.session_state.pop("n_prompts", None),
    )  # fmt: skip
    target = rv.effective_target(target_choice, target_text)
    note = rv.target_note(target, dtype)
    with st.container():  # always there, so the form below keeps its place when the note comes and goes
        if note:
            st.caption(f"Target {md_escape(note)}.")

    with st.form("new_session", border=False):
        col_d, col_g = st.columns(2)
        draft_options = rv.draft_options(target)
        col_d.multiselect(
            "Draft candidates", draft_options, default=rv.default_drafts(draft_options), key="drafts_choice",
            help="'ngram' drafts by prompt lookup: no second model. The target itself is not offered.",
        )  # fmt: skip
        col_d.text_input(
            "…and other drafts (comma-separated)", key="drafts_text",
            placeholder="path, model id, tiny:1:48:2:64~0.15, ngram:3",
        )  # fmt: skip
        col_g.multiselect("γ values", rv.GAMMA_CHOICES, default=[1, 2, 4], key="gammas_choice")
        col_g.text_input("…or type γ values", key="gammas_text", placeholder="1,2,4,8 (replaces the selection)")
        col_a, col_b, col_n, col_e = st.columns(4)
        col_a.text_input("Temperatures", value="0", key="temps_text", help="0 = greedy; several: 0, 0.7")
        col_b.number_input("Max new tokens", min_value=1, max_value=4096, value=64, step=8, key="max_new")
        largest, default_count = rv.prompt_count_limits((sets_by_id.get(prompt_set_id) or {}).get("n_prompts"))
        col_n.number_input(
            "How many prompts", min_value=1, max_value=largest, value=default_count, key="n_prompts",
            help=f"At most the {largest} prompt(s) of the chosen set.",
        )  # fmt: skip
        name = col_e.text_input("Session name (optional)", key="session_name", max_chars=200)
        with st.expander("Advanced"):
            a1, a2, a3, a4 = st.columns(4)
            a1.number_input("top-k (0 = off)", min_value=0, max_value=100_000, value=0, key="top_k")
            a2.number_input("top-p", min_value=0.01, max_value=1.0, value=1.0, step=0.05, key="top_p")
            a3.number_input("seed", min_value=0, max_value=2**31 - 1, value=0, key="seed")
            a4.selectbox("device", ["auto", "cpu", "cuda"], key="device")
            b1, b2, b3, b4 = st.columns(4)
            b1.checkbox("chat template", value=True, key="chat_template")
            b2.checkbox("measure verify cost v(k)", value=True, key="measure_verify")
            b3.checkbox("detect regime afterwards", value=True, key="detect_regime")
            b4.number_input("serving batch size", min_value=1, max_value=1024, value=1, key="serving_batch")
        submitted = st.form_submit_button("Start session", type="primary", key="start_session")

if submitted:
    try:
        from engine.service.jobs import submit_session

        spec, set_id, count = rv.session_spec(rv.RunForm.from_state(st.session_state))
        session_id = submit_session(store, spec, set_id, count, name or None)
    except Exception as exc:  # noqa: BLE001 - one line, nothing queued
        common.show_error(exc, "start the session")
    else:
        worker_line = common.attempt(common.start_worker, action="start the worker") or "worker not started"
        st.success(f"Session #{session_id} queued — {md_escape(worker_line)}.")
        st.query_params["session"] = str(session_id)
        st.session_state[WATCH] = session_id


def render_session(session_id: int, live: bool, started_as: str | None = None) -> None:
    session = store.get_session(session_id)
    if session is None:
        st.warning(f"Session #{session_id} no longer exists.")
        return
    status = session["status"]
    if live and status != started_as:
        st.rerun()  # a new state redraws the page; a final one statically, which also stops the polling

    icon = common.STATUS_ICONS.get(status, "")
    st.markdown(
        f"**#{session['id']} {md_escape(common.one_line(session.get('name'), 80))}** — {icon} **{status}** · "
        f"target {md_escape(session['target'])} · drafts {md_escape(', '.join(session.get('drafts') or []))} · "
        f"γ {md_escape(', '.join(map(str, session.get('gammas') or [])))}"
    )
    done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
    fraction = min(1.0, done / total) if total else 0.0
    st.progress(fraction, text=f"Progress: {done} / {total} prompt decodes ({fraction:.0%}) — {status}")
    components.status_banner(session, here="Run")
    if status in ACTIVE_STATUSES and st.button("Cancel session", key=f"cancel_{session_id}"):
        with common.guard("cancel the session"):
            if store.request_cancel(session_id):
                st.toast(f"Cancel requested for session #{session_id}")
            else:
                st.info("The session had already finished.")

    runs = store.list_runs(session_id)
    if not runs:
        if status == "running":
            st.caption("Loading models and measuring the verify cost…")
        return
    baseline = next((r for r in runs if r.get("kind") == "baseline"), None)
    current = rv.current_run(runs)
    final = current.get("status") == "done"
    now, base = rv.run_numbers(store, current, final), rv.run_numbers(store, baseline, final)

    which = "Current run" if status in ACTIVE_STATUSES else "Last run"
    basis = "measured end to end" if final else "live, over decode-step time"
    st.caption(f"{which}: **{md_escape(data.run_label(current))}** ({current.get('status')}; tokens/s {basis})")
    m = st.columns(5)
    tps, base_tps = now.get("tokens_per_s"), base.get("tokens_per_s")
    m[0].metric("Tokens/s", fmt_num(tps, 1), delta=rv.speed_delta(tps, base_tps) if current is not baseline else None)
    m[1].metric("Baseline tokens/s", fmt_num(base_tps, 1))
    is_spec = current.get("kind") == "speculative"
    m[2].metric("Draft acceptance rate", fmt_num(now.get("draft_acceptance_rate"), 3) if is_spec else "—")
    m[3].metric("Mean acceptance length", fmt_num(now.get("mean_acceptance_length"), 2) if is_spec else "—")
    m[4].metric("Steps logged", now.get("steps") or 0)

    left, right = st.columns(2)
    positions = data.positions_frame(store.per_position_acceptance(current["id"])) if is_spec else None
    if positions is not None and not positions.empty:
        left.altair_chart(charts.acceptance_by_position(positions), width="stretch")
    else:
        left.caption("Per-position acceptance appears once a speculative run logs steps.")
    util = data.utilisation_long(store.utilisation_series(session_id, max_points=300))
    if not util.empty:
        right.altair_chart(charts.utilisation(util), width="stretch")
    else:
        right.caption("Utilisation appears once the worker samples the device.")

    latest = rv.latest_output(store, runs)
    if latest is not None:
        run, output = latest
        st.markdown(f"**Latest output** — {md_escape(rv.output_title(run, output))}")
        common.show_output(session["target"], output)


@st.fragment(run_every=1.0)
def live_view(session_id: int, started_as: str) -> None:
    """Re-reads the store about once a second; only this fragment reruns, not the page."""
    with common.guard("refresh the live view"):
        render_session(session_id, live=True, started_as=started_as)


st.divider()
st.subheader("Live view")
pid, worker_line = common.worker_status()
st.caption(f"{'🟢' if pid else '⚪'} {md_escape(worker_line)}")

with common.guard("read the sessions"):
    sessions = store.list_sessions(limit=100)
    if not sessions:
        st.info("No sessions yet: fill in the form above and press “Start session”.")
    else:
        watched = components.session_picker(
            "Session to watch", sessions, WATCH, default=rv.session_to_watch(sessions), lookup=store.get_session
        )
        if watched is not None and watched["status"] in ACTIVE_STATUSES:
            live_view(watched["id"], watched["status"])
        elif watched is not None:
            render_session(watched["id"], live=False)
