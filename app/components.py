"""Streamlit widgets the pages share: tables, the session picker, the status banner, confirm-then-delete, and the
Recommend page's sections that read the store beyond the recommendation (the policy, the surface, the history)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pandas as pd
import streamlit as st

from app import charts, common, data, memo, run_view
from app import policies_view as pv
from app import recommend_view as rv
from app.common import ACTIVE_STATUSES, md_escape
from engine.errors import SpectuneError
from engine.service.api import (
    RECOMMEND_ENGINES,
    DecisionQuery,
    choose_engine,
    decision_for,
    engine_comparison,
    format_label,
    measured_temperatures,
    policy_verdict,
    queue_confirmation,
    session_engine,
    surfaces,
)

SESSION_PARAM = "session"
NO_POLICY_TRACE = "These sessions recorded no draft trace to replay policies from (sessions from before policies)."
NOTHING_TO_REPLAY = ("No draft of these sessions has a policy to replay (why, per draft, above): the Recommend page's "
                     "fixed γ is the policy they support.")  # fmt: skip
MISSING = "—"


# ----------------------------------------------------------------------------------------------------------------------
# tables


def table(
    frame: Any,
    *,
    numbers: Mapping[str, str] | None = None,
    dates: Sequence[str] = (),
    helps: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    widths: Mapping[str, Literal["small", "medium", "large"] | int] | None = None,
    **kwargs: Any,
) -> None:
    """A table without the index, full width, missing values shown as "—" (never a literal None).

    ``numbers`` maps columns to a printf format ("%.2f×"), ``dates`` lists datetime columns and
    ``helps`` gives column tooltips; ``labels`` shows a column under a shorter header than its name and
    ``widths`` caps a column's width (a long text column would push the others out of view).
    """
    helps, labels, widths = helps or {}, labels or {}, widths or {}
    config: dict[str, Any] = {}
    for column, fmt in (numbers or {}).items():
        config[column] = st.column_config.NumberColumn(labels.get(column), format=fmt, help=helps.get(column),
                                                       width=widths.get(column))  # fmt: skip
    for column in dates:
        config[column] = st.column_config.DatetimeColumn(labels.get(column), format="YYYY-MM-DD HH:mm",
                                                         help=helps.get(column), width=widths.get(column))  # fmt: skip
    for column in {**helps, **labels, **widths}:
        config.setdefault(column, st.column_config.Column(labels.get(column), help=helps.get(column),
                                                          width=widths.get(column)))  # fmt: skip
    st.dataframe(frame, hide_index=True, width="stretch", placeholder=MISSING, column_config=config or None, **kwargs)


def reference_table(frame: Any) -> None:
    """A small table that never changes shape (the paper's tables on the Theory page) as static text: no grid to
    draw, sort or scroll."""
    st.table(frame.astype(str), hide_index=True)


# ----------------------------------------------------------------------------------------------------------------------
# session pickers, kept in step with ?session= in the address bar


def _url_follows(key: str, applied: str | None = None) -> None:
    """on_change of a picker: the address bar shows what was picked (one id, or several comma-separated);
    ``applied`` remembers that value as already applied, so it is not preselected again."""
    chosen = st.session_state.get(key)
    ids = chosen if isinstance(chosen, list) else [] if chosen is None else [chosen]
    value = ",".join(str(i) for i in ids)
    if applied is not None:
        st.session_state[applied] = value
    if value:
        st.query_params[SESSION_PARAM] = value
    else:
        st.query_params.pop(SESSION_PARAM, None)


def session_picker(
    label: str,
    sessions: Sequence[Mapping[str, Any]],
    key: str,
    *,
    default: int | None = None,
    lookup: Callable[[int], Mapping[str, Any] | None] | None = None,
) -> Mapping[str, Any] | None:
    """Pick one session; ?session=N preselects it (``lookup`` finds one beyond ``sessions``) and follows the pick."""
    by_id = {s["id"]: s for s in sessions}
    wanted = common.query_int(SESSION_PARAM)
    if wanted is not None and wanted not in by_id and lookup is not None:
        found = lookup(wanted)
        if found is not None:
            by_id[wanted] = found
    if wanted is not None and wanted not in by_id:
        st.warning(f"Session #{wanted} (from the address bar) does not exist; showing another one.")
        wanted = None
    if wanted is not None:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in by_id:
        st.session_state[key] = default if default in by_id else next(iter(by_id), None)
    chosen = st.selectbox(
        label,
        list(by_id),
        format_func=lambda i: common.session_label(by_id[i]),
        key=key,
        on_change=_url_follows,
        args=(key,),
    )
    if chosen is None:
        return None
    if common.query_int(SESSION_PARAM) != chosen:
        st.query_params[SESSION_PARAM] = str(chosen)
    return by_id[chosen]


def sessions_picker(
    label: str,
    sessions: Sequence[Mapping[str, Any]],
    key: str,
    *,
    default: Sequence[int] = (),
    help: str | None = None,
) -> list[int]:
    """Pick several sessions; a new ?session=N,M preselects them once, and the address bar follows the pick."""
    by_id = {s["id"]: s for s in sessions}
    raw = st.query_params.get(SESSION_PARAM)
    applied = f"{key}_from_url"
    if raw is not None and st.session_state.get(applied) != str(raw):
        st.session_state[applied] = str(raw)
        st.session_state[key] = [i for i in data.parse_session_param(raw) if i in by_id]
    if key not in st.session_state:
        st.session_state[key] = [i for i in default if i in by_id]
    st.session_state[key] = [i for i in st.session_state[key] if i in by_id]
    return st.multiselect(
        label,
        list(by_id),
        format_func=lambda i: common.session_label(by_id[i]),
        key=key,
        on_change=_url_follows,
        args=(key, applied),
        help=help,
    )


# ----------------------------------------------------------------------------------------------------------------------
# status banner


def session_progress(session: Mapping[str, Any]) -> None:
    """A watched session's line (name, status, target, drafts, γs), its progress bar over prompt decodes and its
    phase: a second bar only for a phase with a count of its own (decoding counts the first bar's decodes)."""
    status, phase = session["status"], session.get("phase")
    st.markdown(
        f"**#{session['id']} {md_escape(common.one_line(session.get('name'), 80))}** — "
        f"{common.STATUS_ICONS.get(status, '')} **{status}** · target {md_escape(session['target'])} · drafts "
        f"{md_escape(', '.join(session.get('drafts') or []))} · γ "
        f"{md_escape(', '.join(map(str, session.get('gammas') or [])))}{md_escape(run_view.policies_suffix(session))}"
    )
    st.progress(*run_view.progress_bar(session))
    if status == "stalled":  # its end waits for room on the disk: the cause, not a phase that no longer moves
        st.caption(md_escape(f"Stalled: {session.get('error') or 'its end could not be written'}"))
        return
    if not (line := run_view.phase_text(phase, status)) or status == "queued":
        return
    if run_view.is_decoding(phase) or status != "running":  # an ended session's phase is where it stopped
        st.caption(md_escape(line))
    else:
        st.progress(run_view.phase_fraction(phase), text=md_escape(line))


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
        lines = common.attempt(run_view.estimate_lines, store, st.session_state, probe, probing if probe else None,
                               action="estimate the session")  # fmt: skip
    where.empty()
    if lines:
        st.info(md_escape(" ".join(lines)))
    return lines


def status_banner(session: Mapping[str, Any], here: str) -> None:
    """One line on where a session stands, with the way on: start the worker, watch it live, open its results.

    ``here`` is the page showing it ("Run" or "Sessions"); a link to that same page is left out.
    """
    sid, status = session["id"], session.get("status")
    error = session.get("error")
    if status == "failed":
        st.error(f"Session failed: {md_escape(error or 'no error message was recorded')}")
    elif status == "cancelled":
        st.info(md_escape(data.cancelled_text(error)))
    elif status == "queued":
        _queued(session)
    elif status == "running" and here != "Run":
        done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
        st.info(f"Running ({done}/{total} prompt decodes); results fill in as runs finish.")
    elif status == "done" and here != "Sessions":
        st.success("Done.")
    if status in ACTIVE_STATUSES and here != "Run":
        st.page_link(common.PAGES["Run"], label="Watch it live", icon=common.ICONS["Run"],
                     query_params={SESSION_PARAM: sid})  # fmt: skip
    if status == "done" and here != "Sessions":
        st.page_link(common.PAGES["Sessions"], label="Open the results in Sessions", icon=common.ICONS["Sessions"],
                     query_params={SESSION_PARAM: sid})  # fmt: skip


def measurement_notes(session: Mapping[str, Any]) -> None:
    """How the session measured: a warning when its measurement floor marks every speedup too noisy to tell, then
    captions for a floor that holds, the loop and the threads."""
    from app import sessions_view

    if floor := sessions_view.floor_warning(session):
        st.warning(md_escape(floor), icon=common.ICONS["warning"])
    for caption in sessions_view.measurement_captions(session):
        st.caption(md_escape(caption))


def _queued(session: Mapping[str, Any]) -> None:
    session_id = session["id"]
    pid, line = common.worker_status()
    if pid:
        queued = common.attempt(common.get_store().list_sessions, "queued", action="read the queue") or []
        st.info(md_escape(data.queued_text(data.sessions_ahead(session, queued))))
        return
    st.warning(f"Queued, but {md_escape(line)}.")
    if st.button("Start the worker", key=f"start_worker_{session_id}"):
        with common.guard("start the worker"):
            st.success(md_escape(common.start_worker()))


# ----------------------------------------------------------------------------------------------------------------------
# confirm, then delete


def confirm_delete(
    what: str,
    delete: Callable[[], bool],
    *,
    confirm: str,
    keys: tuple[str, str],
    button: str = "Delete",
    forget: Sequence[str] = (),
    forget_url: bool = False,
) -> None:
    """A checkbox that arms a delete button; the store call's error shows as one line, success reruns the page.

    ``what`` names the thing ("session #3"), ``delete`` returns False when it was already gone, ``keys`` are
    the (checkbox, button) widget keys, ``forget`` session-state keys and ``forget_url`` ?session= to drop.
    """
    checkbox_key, button_key = keys
    armed = st.checkbox(confirm, key=checkbox_key)
    if not st.button(button, disabled=not armed, key=button_key):
        return
    try:
        deleted = delete()
    except Exception as exc:  # noqa: BLE001 - one line, nothing else changes
        common.show_error(exc, f"delete {what}")
        return
    if not deleted:
        st.warning(f"{what[:1].upper()}{what[1:]} was already gone.")
        return
    for key in forget:
        st.session_state.pop(key, None)
    if forget_url:
        st.query_params.pop(SESSION_PARAM, None)
    st.toast(f"Deleted {what}")
    st.rerun()


def engine_picker(store: Any, sessions: Sequence[Mapping[str, Any]], help_text: str, numbers: Mapping[str, str]) -> str:
    """Whose measurements a recommendation rests on; with sessions of both engines, a choice and a side-by-side
    table (the same default as `python -m engine recommend`)."""
    ids = [int(s["id"]) for s in sessions]
    engine = choose_engine(store, ids, None)
    if len({session_engine(s) for s in sessions}) > 1:
        engine = st.radio("Recommend from the measurements of", RECOMMEND_ENGINES, horizontal=True,
                          key="rec_engine", index=RECOMMEND_ENGINES.index(engine), help=help_text)  # fmt: skip
        with st.expander("Engines side by side: α should agree; c and speed belong to the engine", expanded=True):
            table(pd.DataFrame(engine_comparison(store, ids)), numbers=numbers)
    return engine


def temperature_picker(store: Any, session_ids: list[int], where: Any, key: str) -> float | None:
    """The deployment temperature, asked only when the sessions measured more than one (None: their only one)."""
    temps = measured_temperatures(store, session_ids)
    if len(temps) <= 1:
        return None
    return where.selectbox("Deployment temperature", temps, format_func=lambda t: f"T = {t:g}", key=key,
                           help="The sessions measured several temperatures; acceptance, and so the answer, "
                           "differs between them: choose the one you deploy at.")  # fmt: skip


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
    from engine.service.policies.session_policies); with ``session_ids``, a link to the whole comparison."""
    text, wins = policy_verdict(report, md_escape)
    (st.success if wins else st.info)(text, icon=common.ICONS["Policies"] if wins else common.ICONS["measure"])
    for col, (label, value, helptext) in zip(st.columns(4), pv.best_metrics(report), strict=False):
        col.metric(label, value, help=helptext)
    st.caption(md_escape(report.to_dict()["exact"]))
    if session_ids:
        st.page_link(common.PAGES["Policies"], label="Compare every policy, prove them live, export the policy",
                     icon=common.ICONS["Policies"],
                     query_params={SESSION_PARAM: ",".join(str(i) for i in session_ids)})  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# the Recommend page's sections that read the store beyond the recommendation


def surface_section(store: Any, session_ids: Sequence[int]) -> None:
    """The measured γ × concurrency surface (engine.service.surface) of a chosen session measured at several
    concurrency levels (vLLM); nothing when none was. Draws its own divider."""
    found = {s.session_id: s for s in surfaces(store, session_ids)}
    if not found:
        return
    st.subheader("Measured speedup: γ × concurrency")
    st.caption(rv.SURFACE_TEXT)
    sid = next(iter(found))
    if len(found) > 1:
        sid = st.selectbox("Session", list(found), format_func=lambda i: rv.surface_label(found[i]),
                           key="rec_surface_session")  # fmt: skip
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
    chosen = st.selectbox("Download a saved recommendation's files again", list(by_rec), key="rec_history_pick",
                          format_func=lambda i: rv.history_label(by_rec[i]))  # fmt: skip
    exports = common.attempt(store.list_exports, chosen, action=f"list the files of recommendation #{chosen}")
    if exports == []:
        st.caption("No files were saved with this recommendation.")
    for col, item in zip(st.columns(len(exports or []) or 1), exports or [], strict=False):
        label = rv.history_download_label(format_label(item["format"]), by_rec[chosen])
        col.download_button(label, data=item["content"] or "", file_name=item["filename"] or "export.txt",
                            key=f"rec_hist_dl_{item['id']}", on_click="ignore", width="stretch",
                            help=item["filename"])  # fmt: skip


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
    """The stored decision (engine.service.decisions; `query`: DecisionQuery's fields in order) as the Recommend
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
