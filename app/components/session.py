"""A session's progress, its status banner, how it measured, and confirm-then-delete."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import streamlit as st

from app import common, data, run_view
from app.common import ACTIVE_STATUSES, md_escape
from app.components.pickers import SESSION_PARAM


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
    elif status == "interrupted":  # its worker stopped or died, or its database was replaced: the way on is in it
        st.warning(f"Session interrupted: {md_escape(error or 'its worker stopped before it ended')}")
    elif status == "queued":
        _queued(session)
    elif status == "running" and here != "Run":
        done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
        st.info(f"Running ({done}/{total} prompt decodes); results fill in as runs finish.")
    elif status == "done" and here != "Sessions":
        st.success("Done.")
    if status in ACTIVE_STATUSES and here != "Run":
        st.page_link(
            common.PAGES["Run"], label="Watch it live", icon=common.ICONS["Run"], query_params={SESSION_PARAM: sid}
        )
    if status == "done" and here != "Sessions":
        st.page_link(
            common.PAGES["Sessions"],
            label="Open the results in Sessions",
            icon=common.ICONS["Sessions"],
            query_params={SESSION_PARAM: sid},
        )


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
