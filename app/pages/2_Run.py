"""Run: queue a tuning session (quick, or the full target × drafts × γ × temperatures grid) and watch it live.

Never loads a model: "Start session" validates and queues (engine.service.jobs.submit_session) and starts the
worker; the live view polls a cheap version of the session and re-reads only what changed (run_view.LiveCache),
about once a second while prompts decode. The watched session lives in the URL (?session=N)."""

import copy
import time

import streamlit as st

from app import common, components, data
from app import run_budget as rb
from app import run_view as rv
from app.common import ACTIVE_STATUSES, fmt_num, md_escape
from engine.service.api import submit_session

common.page_setup("Run", keep=rv.FORM_KEYS)  # the form is as the user left it
rv.restore_form(st.session_state)  # and at least as last submitted, whatever Streamlit dropped meanwhile
rv.skip_gc_after_each_run()  # the live view reruns every second: a full GC after each run would cost most of it
st.title("Run a tuning session")
common.hardware_banner()
store = common.get_store()
WATCH = "run_watch_session"

prompt_sets = common.attempt(store.list_prompt_sets, action="list the prompt sets") or []
sets_by_id = {s["id"]: s for s in prompt_sets}
history = common.attempt(store.list_sessions, limit=100, action="read the sessions") or []

st.subheader("New session")
if not sets_by_id:
    st.info("There is no prompt set yet: import one on the Prompts page first.")
    st.page_link(common.PAGES["Prompts"], label="Go to Prompts", icon=common.ICONS["Prompts"])

with st.container(border=True):
    rb.top(st.session_state, common.hardware())  # the time budget; the sized values and default engine set
    col_t, col_x, col_dt, col_p = st.columns([3, 3, 2, 3])
    target_choice = col_t.selectbox("Target model", rv.bundled_names(), index=rv.default_target_index(),
                                    format_func=rv.bundled_label, key="target_choice")  # fmt: skip
    target_text = col_x.text_input("…or another target", key="target_text", placeholder=rv.TARGET_PLACEHOLDER,
                                   help="When filled in, this replaces the target chosen on the left.")  # fmt: skip
    dtype = col_dt.selectbox(
        "dtype", rv.DTYPES, index=rv.DTYPES.index(rv.default_dtype(common.hardware())), key="dtype",
        help="Default: bfloat16 on a GPU or a CPU with bf16 instructions, else float32. GGUF weights dequantise to it.",
    )  # fmt: skip
    prompt_set_id = col_p.selectbox(
        "Prompt set", list(sets_by_id), format_func=lambda i: data.prompt_set_label(sets_by_id[i]), key="prompt_set",
        on_change=lambda: [st.session_state.pop(k, None) for k in ("n_prompts", "stratified")],
    )  # fmt: skip
    categories = common.attempt(store.prompt_categories, prompt_set_id) if prompt_set_id is not None else None
    engine = st.radio("Engine", list(rv.ENGINE_LABELS), format_func=rv.ENGINE_LABELS.get, horizontal=True, key="engine")
    target = rv.effective_target(target_choice, target_text)
    usable, engine_line = rb.engine_note(engine, target, common.hardware())
    (st.caption if usable else st.error)(md_escape(engine_line))
    note = rv.target_note(target, dtype, engine)
    with st.container():  # always there, so the form below keeps its place when the note comes and goes
        if note:
            st.caption(f"Target {md_escape(note)}.")
    st.radio("Session", list(rv.MODE_LABELS), format_func=rv.MODE_LABELS.get, key="mode", help=rv.MODE_HELP)

    with st.form("new_session", border=False, enter_to_submit=False):  # Enter in a field never starts a session
        components.full_grid_confirm(st.session_state.get("mode", "quick"))
        col_d, col_g = st.columns(2)
        draft_options = rv.draft_options(target, engine)
        col_d.multiselect("Draft candidates", draft_options, default=rv.default_drafts(draft_options),
                          key="drafts_choice", help=rv.drafts_help())  # fmt: skip
        col_d.text_input("…and other drafts (comma-separated)", key="drafts_text", placeholder=rv.DRAFTS_PLACEHOLDER)
        col_g.multiselect("γ values", rv.GAMMA_CHOICES, default=[1, 2, 4], key="gammas_choice")
        col_g.text_input("…or type γ values", key="gammas_text", placeholder="1,2,4,8 (replaces the selection)")
        col_g.text_input("Drafting policies to run live (optional)", key="policies_text", help=rv.policy_help(),
                         placeholder="confidence:0.6:16:2 heuristic:4 adaptive")  # fmt: skip
        col_a, col_b, col_n, col_e = st.columns(4)
        col_a.text_input("Temperatures", value="0", key="temps_text", help="0 = greedy; several: 0, 0.7")
        col_b.number_input("Max new tokens", min_value=1, max_value=4096, value=64, step=8, key="max_new")
        largest, default_count = rv.prompt_count_limits((sets_by_id.get(prompt_set_id) or {}).get("n_prompts"))
        col_n.number_input(
            "How many prompts", min_value=1, max_value=largest, value=default_count, key="n_prompts",
            help=f"At most the {largest} prompt(s) of the chosen set.",
        )  # fmt: skip
        col_n.checkbox("stratified by category", key="stratified", **rv.sample_option(categories))
        name = col_e.text_input("Session name (optional)", key="session_name", max_chars=200)
        with st.expander("Advanced"):
            a1, a2, a3, a4 = st.columns(4)
            a1.number_input("top-k (0 = off)", min_value=0, max_value=100_000, value=0, key="top_k")
            a2.number_input("top-p", min_value=0.01, max_value=1.0, value=1.0, step=0.05, key="top_p")
            a3.number_input("seed", min_value=0, max_value=2**31 - 1, value=0, key="seed")
            a4.selectbox("device", ["auto", "cpu", "cuda"], key="device")
            b1, b2, b3, b4 = st.columns(4)
            b1.checkbox("chat template", value=True, key="chat_template")
            verify_cost, regime_cost = rv.cost_captions(history, target, dtype, st.session_state)
            b2.checkbox("measure verify cost v(k)", value=True, key="measure_verify")
            b2.caption(md_escape(verify_cost))
            components.regime_switch(b3, engine, regime_cost)
            b4.number_input("serving batch size", min_value=1, max_value=1024, value=1, key="serving_batch")
            st.text_input("Concurrency levels (engines that batch: vLLM)", key="concurrency_text",
                          **rv.CONCURRENCY_INPUT)  # fmt: skip
            c1, c2 = st.columns(2)
            c1.selectbox("Loop (spectune's engine)", rv.LOOP_CHOICES, key="loop", help=rv.LOOP_HELP)
            c2.number_input("Threads (0: the cores free at start)", 0, 1024, 0, key="threads", help=rv.THREADS_HELP)
        submitted = st.form_submit_button("Start session", type="primary", key="start_session")
        estimate = st.form_submit_button("Estimate time and memory", key="estimate_session", help=rv.ESTIMATE_HELP)
        probe = st.form_submit_button("Probe the pace, then estimate", key="probe_pace", help=rv.PROBE_HELP)
        fit = st.form_submit_button("Fit to the budget", key="fit_budget", help=rb.BUDGET_HELP)

rb.after_buttons(store, st.session_state, {"start": submitted, "estimate": estimate, "probe": probe, "fit": fit})

if submitted:
    try:
        spec, set_id, count = rb.start_spec(store, st.session_state)  # over its budget: said before, never after
        session_id = submit_session(store, spec, set_id, count, name or None)
    except Exception as exc:  # noqa: BLE001 - one line, nothing queued
        common.show_error(exc, "start the session")
    else:
        worker_line = common.attempt(common.start_worker, action="start the worker") or "worker not started"
        st.success(f"Session #{session_id} queued — {md_escape(worker_line)}.")
        st.query_params["session"] = str(session_id)
        st.session_state[WATCH] = session_id


def render_session(session_id: int, live: bool, started_as: str | None = None, interval: float = 0.0) -> None:
    """One refresh; ``live``: in the polling fragment, which reruns the page when state or pace change."""
    frame = rv.live_cache(st.session_state, session_id).refresh(store, time.monotonic())
    session = frame.session
    if session is None:
        st.warning(f"Session #{session_id} no longer exists.")
        return
    status = session["status"]
    if live and (status != started_as or rv.poll_interval(status, session.get("phase")) != interval):
        st.rerun()  # a new state redraws the page (a final one statically, which stops the polling)

    components.session_progress(session)
    components.status_banner(session, here="Run")
    if busy := rv.busy_note(session, frame.other_cpu_pct):
        st.warning(md_escape(busy), icon=common.ICONS["warning"])
    components.measurement_notes(session)
    if status in ACTIVE_STATUSES and st.button("Cancel session", key=f"cancel_{session_id}"):
        with common.guard("cancel the session"):
            if store.request_cancel(session_id):
                st.toast(f"Cancel requested for session #{session_id}")
            else:
                st.info("The session had already finished.")

    if status == "done" and (lines := rb.done_lines(store, session, frame.runs)):  # its answer, its budget kept
        st.caption("  \n".join(md_escape(line) for line in lines))
    current = frame.current
    if current is None:
        if status == "running":
            st.caption(md_escape(rv.waiting_text(session)))
        return
    st.caption(rv.run_caption(current, session))
    m, now = st.columns(5), frame.now
    check = rv.speed_check(current, now, frame.base, final=current.get("status") == "done")
    m[0].metric("Tokens/s", fmt_num(now.get("tokens_per_s"), 1), delta=check.delta, delta_color=check.colour,
                delta_arrow=check.arrow)  # fmt: skip
    m[1].metric("Baseline tokens/s", fmt_num(frame.base.get("tokens_per_s"), 1))
    is_spec = current.get("kind") == "speculative"
    m[2].metric("Draft acceptance rate", fmt_num(now.get("draft_acceptance_rate"), 3) if is_spec else "—")
    m[3].metric("Tokens per call", fmt_num(now.get("tokens_per_call"), 2) if is_spec else "—")
    m[4].metric("Steps logged", now.get("steps") or 0)
    if check.flag:
        st.warning(md_escape(check.flag), icon=common.ICONS["warning"])

    for col, spec, empty in zip(st.columns(2), (frame.positions_spec, frame.util_spec), rv.NO_CHART, strict=True):
        if spec is not None:  # cached specs: sent again as they are when nothing new arrived
            col.vega_lite_chart(spec=copy.deepcopy(spec), width="stretch")
        else:
            col.caption(empty)

    if frame.latest is not None:
        run, output = frame.latest
        st.markdown(f"**Latest output** — {md_escape(rv.output_title(run, output))}")
        common.show_output(session["target"], output)


def live_view(session_id: int, started_as: str, interval: float) -> None:
    """Polls the store every ``interval`` seconds; only this fragment reruns, not the page."""
    with common.guard("refresh the live view"):
        render_session(session_id, live=True, started_as=started_as, interval=interval)


st.divider()
st.subheader("Live view")
pid, worker_line = common.worker_status()
st.caption(f"{common.WORKER_DOT[bool(pid)]} {md_escape(worker_line)}")

with common.guard("read the sessions"):
    sessions = store.list_sessions(limit=100)
    if not sessions:
        st.info("No sessions yet: fill in the form above and press “Start session”.")
    else:
        watched = components.session_picker(
            "Session to watch", sessions, WATCH, default=rv.session_to_watch(sessions), lookup=store.get_session
        )
        if watched is not None and watched["status"] in ACTIVE_STATUSES:
            every = rv.poll_interval(watched["status"], watched.get("phase"))
            st.fragment(live_view, run_every=every)(watched["id"], watched["status"], every)
        elif watched is not None:
            render_session(watched["id"], live=False)
