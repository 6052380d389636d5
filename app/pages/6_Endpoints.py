"""Endpoints: tune a running deployment (vLLM, SGLang, llama.cpp or any OpenAI-compatible server).

Define an endpoint session (URL, model, the *name* of the API-key variable, engine, concurrency levels and
caps), queue it for the worker, and read its results: throughput and latency against concurrency, goodput
under your latency target, acceptance from the server's counters, and, with a baseline endpoint, the
concurrency where speculation stops paying, measured. Requests go only to the URLs entered here.
"""

import streamlit as st

from app import charts, common, components, data
from app import endpoints_view as ev
from app.common import ACTIVE_STATUSES, md_escape
from engine.service.api import check_endpoint

common.page_setup("Endpoints")
st.title("Tune a running deployment")
store = common.get_store()

prompt_sets = common.attempt(store.list_prompt_sets, action="list the prompt sets") or []
sets_by_id = {s["id"]: s for s in prompt_sets}

st.subheader("New endpoint session")
st.caption(
    "spectune replays your prompts through the endpoint's streaming API at each concurrency level and scrapes "
    "its /metrics before and after. The API key stays in an environment variable of the worker's process: "
    "give its name, never the key."
)
with st.container(border=True):
    c1, c2, c3 = st.columns([4, 3, 2])
    url = c1.text_input("Endpoint URL", key="ep_url", placeholder="http://gpu-host:8000  (or …/v1)")
    model = c2.text_input("Model", key="ep_model", placeholder="served model name (blank: the first listed)")
    key_env = c3.text_input("API key variable", key="ep_key_env", placeholder="e.g. VLLM_API_KEY",
                            help="The NAME of an environment variable holding the key; blank for no key.")  # fmt: skip
    c4, c5, c6 = st.columns([2, 2, 5])
    kind = c4.selectbox("Engine", ev.KINDS, format_func=ev.KIND_LABELS.get, key="ep_kind")
    api = c5.selectbox("API", ev.API_CHOICES, key="ep_api", help="/v1/completions or /v1/chat/completions")
    baseline = c6.text_input(
        "Baseline URL (optional)", key="ep_baseline", placeholder="the same model served without speculation",
        help="With a baseline, both are driven at every level: speedup and the flip are measured side by side.",
    )  # fmt: skip
    c7, c8, c9, c10, c11 = st.columns(5)
    levels = c7.text_input("Concurrency levels", "1,2,4,8", key="ep_levels", help=ev.MAX_LEVELS_HELP)
    max_requests = c8.number_input("Requests per level (cap)", 1, 5000, 32, key="ep_max_requests")
    max_duration = c9.number_input("Seconds per level (cap)", 1.0, 1800.0, 120.0, key="ep_max_duration")
    timeout = c10.number_input("Request timeout s", 1.0, 600.0, 60.0, key="ep_timeout")
    max_new = c11.number_input("Max new tokens", 1, 32768, 64, key="ep_max_new")
    c12, c13, c14, c15 = st.columns([2, 2, 2, 4])
    ttft_slo = c12.number_input("Target TTFT s (0 = none)", 0.0, 3600.0, 0.0, key="ep_ttft_slo",
                                help="Goodput counts requests meeting the latency target.")  # fmt: skip
    tpot_slo = c13.number_input("Target time/token s (0 = none)", 0.0, 3600.0, 0.0, key="ep_tpot_slo")
    ignore_eos = c14.checkbox("Exactly max new tokens", key="ep_ignore_eos",
                              help="ignore_eos (vLLM, SGLang, llama.cpp)")  # fmt: skip
    prompt_set_id = c15.selectbox(
        "Prompt set", list(sets_by_id), format_func=lambda i: data.prompt_set_label(sets_by_id[i]), key="ep_set"
    )  # fmt: skip
    c16, c17 = st.columns([2, 6])
    available = int((sets_by_id.get(prompt_set_id) or {}).get("n_prompts") or 1)
    n_prompts = c16.number_input("Prompts", 1, max(available, 1), min(available, 16), key="ep_n_prompts")
    name = c17.text_input("Session name (optional)", key="ep_name")
    b1, b2, _ = st.columns([2, 2, 6])
    check = b1.button("Check endpoint", key="ep_check", disabled=not url.strip())
    queue = b2.button("Queue session", type="primary", key="ep_queue", disabled=not sets_by_id)
    if not sets_by_id:
        st.info("There is no prompt set yet: import one on the Prompts page first.")
    if check:
        with common.guard("check the endpoint"):
            found = check_endpoint(url, key_env, kind)
            (st.success if found.speculation_counters else st.info)(md_escape(ev.check_headline(found)))
            st.markdown("\n".join(f"- **{what}:** {md_escape(value)}" for what, value in ev.check_facts(found)))
            with st.expander("Raw answer", expanded=False):
                st.json(found.to_dict())
    if queue:
        with common.guard("queue the endpoint session"):
            settings = ev.endpoint_settings(url, model, key_env, kind, api, baseline, levels, max_requests,
                                            max_duration, timeout, ignore_eos, ttft_slo, tpot_slo)  # fmt: skip
            sid = ev.submit(store, settings, prompt_set_id, int(n_prompts), int(max_new), name)
            st.success(f"Queued as session #{sid}. {md_escape(common.start_worker())}")
            st.query_params["session"] = str(sid)

st.subheader("Results")
sessions = ev.endpoint_sessions(common.attempt(store.list_sessions, action="read the sessions") or [])
if not sessions:
    st.info("No endpoint sessions yet: define one above.")
    st.stop()
session = components.session_picker("Endpoint session", sessions, "ep_session", lookup=store.get_session)
if session is None:
    st.stop()


@st.fragment(run_every=2.0 if session["status"] in ACTIVE_STATUSES else None)
def results(session_id: int, started_as: str) -> None:
    current = common.attempt(store.get_session, session_id, action="read the session") or session
    status = current["status"]
    if status != started_as:
        st.rerun()  # the picker's label, the Cancel button and the polling pace follow the new status
    requests = common.attempt(store.list_endpoint_requests, session_id, action="read the requests") or []
    if status == "failed":
        st.error(f"Stopped: {md_escape(current.get('error') or 'no message')} — what was measured is kept below.")
    elif status in ACTIVE_STATUSES:
        phase = (current.get("phase") or {}).get("name") or status
        st.info(f"{md_escape(phase[:1].upper() + phase[1:])} — {len(requests)} requests so far.")
    elif status == "cancelled":
        st.info("Cancelled; what was measured is kept below.")
    for line in ev.warnings_of(current):
        st.warning(md_escape(line))
    servers = ev.servers_of(current)
    if servers:
        components.table(servers)
    entries = ev.level_entries(current, requests)
    if not entries:
        st.caption("No request has finished yet.")
        return
    components.table(ev.levels_frame(entries), numbers=ev.LEVEL_NUMBERS, helps=ev.LEVEL_HELPS)
    st.caption(md_escape(ev.LATENCY_NOTE))
    comp = ev.comparison(current, entries)
    for pair in (ev.CHARTS[:2], ev.CHARTS[2:]):
        for column, (fields, y_title, title) in zip(st.columns(2), pair, strict=True):
            frame = ev.metric_long(entries, fields)
            if frame.empty:
                column.caption(f"{title}: no successful request yet.")
            else:
                column.altair_chart(charts.versus_concurrency(frame, y_title, title), width="stretch")
    if comp is not None:
        st.markdown(f"**{md_escape(comp['verdict'])}**")
        st.altair_chart(charts.versus_concurrency(ev.speedup_long(comp), "speedup (×)",
                        "Speculative ÷ baseline tokens/s: measured (filled) vs predicted (hollow, dashed)", rule_at=1.0,
                        flip=comp.get("flip_concurrency")), width="stretch")  # fmt: skip
    else:
        st.caption("Give a baseline endpoint (the same model without speculation) to measure the speedup and the flip.")
    with st.expander(f"Requests ({len(requests)})"):
        components.table(ev.requests_frame(requests), numbers=ev.REQUEST_NUMBERS, helps=ev.REQUEST_HELPS)


results(session["id"], session["status"])
if session["status"] in ACTIVE_STATUSES and st.button("Cancel this session", key="ep_cancel"):
    with common.guard("cancel the session"):
        store.request_cancel(session["id"])
        st.rerun()
