"""Run: queue a tuning session (target × drafts × γ × temperatures on a prompt set) and watch it live.

This page never loads a model: "Start session" validates and queues (engine.service.jobs.submit_session)
and makes sure the background worker is running; the live view is a fragment that re-reads the
store about once a second without rerunning the page. The watched session id lives in the URL
(?session=N), so a refresh picks up where it was and several tabs can watch different sessions.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from typing import Any  # noqa: E402

import streamlit as st  # noqa: E402

from app import charts, common, data  # noqa: E402
from app.common import ACTIVE_STATUSES, fmt_num, md_escape  # noqa: E402
from engine.errors import SettingsError  # noqa: E402
from engine.models.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402
from engine.session.spec import SessionSpec  # noqa: E402

common.page_setup("Run")
st.title("▶️ Run a tuning session")
common.hardware_banner()
store = common.get_store()
hw = common.hardware()

GAMMA_CHOICES = list(range(1, 17))
DTYPES = ["float32", "bfloat16", "float16"]
WATCH = "run_watch_session"


def _bundled_label(name: str) -> str:
    model = BUNDLED.get(name)
    return f"{name} — {model.description}" if model else name


# ---------------------------------------------------------------------------------------------------------------------
# New session form

prompt_sets = common.attempt(store.list_prompt_sets, action="list the prompt sets") or []
sets_by_id = {s["id"]: s for s in prompt_sets}

st.subheader("New session")
if not sets_by_id:
    st.info("There is no prompt set yet: import one on the Prompts page first.")
    st.page_link(common.PAGES["Prompts"], label="Go to Prompts", icon="📝")

with st.form("new_session", border=True):
    col_t, col_d, col_g = st.columns(3)
    with col_t:
        bundled = list(BUNDLED)
        target_choice = st.selectbox(
            "Target model",
            bundled,
            index=bundled.index(DEFAULT_TARGET) if DEFAULT_TARGET in bundled else 0,
            format_func=_bundled_label,
            key="target_choice",
        )
        target_text = st.text_input(
            "…or another target",
            key="target_text",
            placeholder="local path, .gguf, cached model id, or tiny:SEED:VOCAB:LAYERS:HIDDEN",
            help="When filled in, this replaces the target chosen above.",
        )
    with col_d:
        draft_options = bundled + ["ngram"]
        drafts_choice = st.multiselect(
            "Draft candidates",
            draft_options,
            default=[DEFAULT_DRAFT] if DEFAULT_DRAFT in draft_options else [],
            key="drafts_choice",
            help="'ngram' drafts by prompt lookup: no second model.",
        )
        drafts_text = st.text_input(
            "…and other drafts (comma-separated)",
            key="drafts_text",
            placeholder="path, model id, tiny:1:48:2:64~0.15, ngram:3",
        )
    with col_g:
        gammas_choice = st.multiselect("γ values", GAMMA_CHOICES, default=[1, 2, 4], key="gammas_choice")
        gammas_text = st.text_input(
            "…or type γ values", key="gammas_text", placeholder="1,2,4,8 (replaces the selection)"
        )
    col_a, col_b, col_c, col_e = st.columns(4)
    with col_a:
        temps_text = st.text_input("Temperatures", value="0", key="temps_text", help="0 = greedy; several: 0, 0.7")
    with col_b:
        max_new = st.number_input("Max new tokens", min_value=1, max_value=4096, value=64, step=8, key="max_new")
    with col_c:
        default_dtype = "bfloat16" if hw.get("kind") == "cuda" else "float32"
        dtype = st.selectbox("dtype", DTYPES, index=DTYPES.index(default_dtype), key="dtype")
    with col_e:
        name = st.text_input("Session name (optional)", key="session_name", max_chars=200)
    col_p, col_n = st.columns([3, 1])
    with col_p:
        set_ids = list(sets_by_id)
        prompt_set_id = st.selectbox(
            "Prompt set",
            set_ids,
            format_func=lambda i: (
                f"#{i} {common.one_line(sets_by_id[i]['name'], 60)} ({sets_by_id[i].get('n_prompts') or 0} prompts)"
            ),
            key="prompt_set",
        )
    with col_n:
        n_prompts = st.number_input("How many prompts", min_value=1, max_value=100_000, value=8, key="n_prompts")
    with st.expander("Advanced"):
        a1, a2, a3, a4 = st.columns(4)
        top_k = a1.number_input("top-k (0 = off)", min_value=0, max_value=100_000, value=0, key="top_k")
        top_p = a2.number_input("top-p", min_value=0.01, max_value=1.0, value=1.0, step=0.05, key="top_p")
        seed = a3.number_input("seed", min_value=0, max_value=2**31 - 1, value=0, key="seed")
        device = a4.selectbox("device", ["auto", "cpu", "cuda"], key="device")
        b1, b2, b3, b4 = st.columns(4)
        chat_template = b1.checkbox("chat template", value=True, key="chat_template")
        measure_verify = b2.checkbox("measure verify cost v(k)", value=True, key="measure_verify")
        detect_regime = b3.checkbox("detect regime afterwards", value=True, key="detect_regime")
        serving_batch = b4.number_input("serving batch size", min_value=1, max_value=1024, value=1, key="serving_batch")
    submitted = st.form_submit_button("Start session", type="primary", key="start_session")


def _settings_from_form() -> tuple[SessionSpec, int, int]:
    """The form as SessionSpec; SettingsError naming the first problem."""
    if prompt_set_id is None:
        raise SettingsError("no prompt set chosen: import one on the Prompts page first")
    target = (target_text or "").strip() or target_choice
    drafts = list(dict.fromkeys(list(drafts_choice) + data.parse_refs(drafts_text)))
    if not drafts:
        raise SettingsError("no draft chosen: pick a draft model or 'ngram', or type one")
    gammas = data.parse_int_list(gammas_text, "γ") if (gammas_text or "").strip() else sorted(gammas_choice)
    if not gammas:
        raise SettingsError("no γ chosen: pick γ values or type them, e.g. 1,2,4,8")
    temps = data.parse_float_list(temps_text or "", "temperature")
    settings = SessionSpec(
        target=target,
        drafts=drafts,
        gammas=gammas,
        temperatures=temps,
        max_new_tokens=int(max_new),
        top_k=int(top_k),
        top_p=float(top_p),
        seed=int(seed),
        dtype=dtype,
        device=device,
        chat_template=bool(chat_template),
        measure_verify_cost=bool(measure_verify),
        detect_regime=bool(detect_regime),
        serving_batch=int(serving_batch),
    )
    return settings, int(prompt_set_id), int(n_prompts)


if submitted:
    try:
        from engine.service.jobs import submit_session

        settings, set_id, count = _settings_from_form()
        session_id = submit_session(store, settings, set_id, count, name or None)
    except Exception as exc:  # noqa: BLE001 - one line, nothing queued
        common.show_error(exc, "start the session")
    else:
        worker_line = common.attempt(common.start_worker, action="start the worker") or "worker not started"
        st.success(f"Session #{session_id} queued — {md_escape(worker_line)}.")
        st.query_params["session"] = str(session_id)
        st.session_state[WATCH] = session_id


# ---------------------------------------------------------------------------------------------------------------------
# Live view


def _latest_output(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    for run in reversed(runs):
        outputs = store.get_outputs(run["id"])
        if outputs:
            return run, outputs[-1]
    return None


def _live_numbers(run: dict[str, Any] | None, final: bool) -> dict[str, Any]:
    """A run's speed and acceptance: its final measured numbers when ``final``, else live totals from its
    logged steps (tokens/s over decode-step time only, so a live run is compared on the same basis)."""
    if run is None:
        return {}
    progress = store.run_progress(run["id"])
    numbers = {
        "tokens_per_s": progress["tokens_per_s"],
        "draft_acceptance_rate": progress["draft_acceptance_rate"],
        "mean_acceptance_length": progress["mean_acceptance_length"],
        "steps": progress["steps"],
    }
    if final:
        for key in ("tokens_per_s", "mean_acceptance_length"):
            if run.get(key) is not None:
                numbers[key] = run[key]
    return numbers


def render_session(session_id: int, live: bool, started_as: str | None = None) -> None:
    session = store.get_session(session_id)
    if session is None:
        st.warning(f"Session #{session_id} no longer exists.")
        return
    status = session["status"]
    if live and status != started_as:
        # queued → running refreshes the session picker; a final state redraws the page once, statically,
        # which also stops the polling (only active sessions get the live fragment)
        st.rerun()

    icon = common.STATUS_ICONS.get(status, "")
    st.markdown(
        f"**#{session['id']} {md_escape(common.one_line(session.get('name'), 80))}** — {icon} **{status}** · "
        f"target {md_escape(session['target'])} · drafts {md_escape(', '.join(session.get('drafts') or []))} · "
        f"γ {md_escape(', '.join(map(str, session.get('gammas') or [])))}"
    )
    done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
    fraction = min(1.0, done / total) if total else 0.0
    st.progress(fraction, text=f"Progress: {done} / {total} prompt decodes ({fraction:.0%}) — {status}")

    if status == "queued":
        pid, line = common.worker_status()
        if pid:
            st.info("Queued: the worker will pick it up after the sessions before it.")
        else:
            st.warning(f"Queued, but {md_escape(line)}.")
            if st.button("Start the worker", key=f"start_worker_{session_id}"):
                with common.guard("start the worker"):
                    st.success(md_escape(common.start_worker()))
    elif status == "failed":
        st.error(f"Session failed: {md_escape(session.get('error') or 'no error message was recorded')}")
    elif status == "cancelled":
        st.info(f"Cancelled. {md_escape(session.get('error') or '')}")
    elif status == "done":
        st.success("Done.")
        st.page_link(
            common.PAGES["Sessions"],
            label="Open the results in Sessions",
            icon="📊",
            query_params={"session": session_id},
        )

    if status in ACTIVE_STATUSES:
        if st.button("Cancel session", key=f"cancel_{session_id}"):
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
    current = next((r for r in reversed(runs) if r.get("status") == "running"), runs[-1])
    final = current.get("status") == "done"
    now, base = _live_numbers(current, final), _live_numbers(baseline, final)

    which = "Current run" if status in ACTIVE_STATUSES else "Last run"
    basis = "measured end to end" if final else "live, over decode-step time"
    st.caption(f"{which}: **{md_escape(data.run_label(current))}** ({current.get('status')}; tokens/s {basis})")
    m = st.columns(5)
    tps, base_tps = now.get("tokens_per_s"), base.get("tokens_per_s")
    delta = None
    if tps and base_tps and current is not baseline:
        delta = f"{tps / base_tps - 1:+.0%} vs baseline ({tps / base_tps:.2f}×)"
    m[0].metric("Tokens/s", fmt_num(tps, 1), delta=delta)
    m[1].metric("Baseline tokens/s", fmt_num(base_tps, 1))
    is_spec = current.get("kind") == "speculative"
    m[2].metric("Draft acceptance rate", fmt_num(now.get("draft_acceptance_rate"), 3) if is_spec else "—")
    m[3].metric("Mean acceptance length", fmt_num(now.get("mean_acceptance_length"), 2) if is_spec else "—")
    m[4].metric("Steps logged", now.get("steps") or 0)

    left, right = st.columns(2)
    with left:
        positions = data.positions_frame(store.per_position_acceptance(current["id"])) if is_spec else None
        if positions is not None and not positions.empty:
            st.altair_chart(charts.acceptance_by_position(positions), width="stretch")
        else:
            st.caption("Per-position acceptance appears once a speculative run logs steps.")
    with right:
        util = data.utilisation_long(store.utilisation_series(session_id, max_points=300))
        if not util.empty:
            st.altair_chart(charts.utilisation(util), width="stretch")
        else:
            st.caption("Utilisation appears once the worker samples the device.")

    latest = _latest_output(runs)
    if latest is not None:
        run, output = latest
        st.markdown(f"**Latest output** — {md_escape(data.run_label(run))}, prompt {output.get('prompt_index')}")
        common.show_output(session["target"], output)


@st.fragment(run_every=1.0)
def live_view(session_id: int, started_as: str) -> None:
    """Re-reads the store about once a second; only this fragment reruns, not the page."""
    with common.guard("refresh the live view"):
        render_session(session_id, live=True, started_as=started_as)


def _sync_watch_to_url() -> None:
    chosen = st.session_state.get(WATCH)
    if chosen is not None:
        st.query_params["session"] = str(chosen)


st.divider()
st.subheader("Live view")
pid, worker_line = common.worker_status()
st.caption(f"{'🟢' if pid else '⚪'} {md_escape(worker_line)}")

with common.guard("read the sessions"):
    sessions = store.list_sessions(limit=100)
    if not sessions:
        st.info("No sessions yet: fill in the form above and press “Start session”.")
    else:
        by_id = {s["id"]: s for s in sessions}
        wanted = common.query_int("session")
        if wanted is not None and wanted not in by_id and store.get_session(wanted) is not None:
            by_id[wanted] = store.get_session(wanted)  # an old session beyond the first 100
        if wanted is not None and wanted not in by_id:
            st.warning(f"Session #{wanted} (from the address bar) does not exist; showing another one.")
            wanted = None
        if wanted is not None:
            st.session_state[WATCH] = wanted
        elif st.session_state.get(WATCH) not in by_id:
            running = [s["id"] for s in sessions if s["status"] == "running"]
            queued = [s["id"] for s in sessions if s["status"] == "queued"]
            st.session_state[WATCH] = (running or queued or [sessions[0]["id"]])[0]
        watched = st.selectbox(
            "Session to watch",
            list(by_id),
            format_func=lambda i: common.session_label(by_id[i]),
            key=WATCH,
            on_change=_sync_watch_to_url,
        )
        if watched is not None:
            if common.query_int("session") != watched:
                st.query_params["session"] = str(watched)
            if by_id[watched]["status"] in ACTIVE_STATUSES:
                live_view(watched, by_id[watched]["status"])
            else:
                render_session(watched, live=False)
