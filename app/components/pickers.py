"""The pickers that follow the address bar: one session, several sessions, the engine and the temperature."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from app import common, data
from app.components.tables import table
from engine.service.api import (
    RECOMMEND_ENGINES,
    StoredSession,
    choose_engine,
    engine_comparison,
    measured_temperatures,
)

SESSION_PARAM = "session"


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


def engine_picker(store: Any, sessions: Sequence[Mapping[str, Any]], help_text: str, numbers: Mapping[str, str]) -> str:
    """Whose measurements a recommendation rests on; with sessions of both engines, a choice and a side-by-side
    table (the same default as `python -m engine recommend`)."""
    ids = [int(s["id"]) for s in sessions]
    engine = choose_engine(store, ids, None)
    if len({StoredSession.of(s).engine for s in sessions}) > 1:
        engine = st.radio(
            "Recommend from the measurements of",
            RECOMMEND_ENGINES,
            horizontal=True,
            key="rec_engine",
            index=RECOMMEND_ENGINES.index(engine),
            help=help_text,
        )
        with st.expander("Engines side by side: α should agree; c and speed belong to the engine", expanded=True):
            table(pd.DataFrame(engine_comparison(store, ids)), numbers=numbers)
    return engine


def temperature_picker(store: Any, session_ids: list[int], where: Any, key: str) -> float | None:
    """The deployment temperature, asked only when the sessions measured more than one (None: their only one)."""
    temps = measured_temperatures(store, session_ids)
    if len(temps) <= 1:
        return None
    return where.selectbox(
        "Deployment temperature",
        temps,
        format_func=lambda t: f"T = {t:g}",
        key=key,
        help="The sessions measured several temperatures; acceptance, and so the answer, "
        "differs between them: choose the one you deploy at.",
    )
