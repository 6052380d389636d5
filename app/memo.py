"""The one model's answers about finished sessions, kept per dashboard process.

A recommendation (with its exports) and a policy report are functions of stored rows that no longer change once
their sessions are done, so a second visit to a page, or another page asking the same question, reuses the answer
instead of replaying every policy again. The key is every argument, the database and each session's id and
finish time; a question about a session that is not done (running, queued, re-queued) is answered afresh each
time. The objects are shared, not copied: the pages only read them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from engine.errors import SpectuneError
from engine.service.api import (
    Decision,
    DecisionQuery,
    PolicyReport,
    Recommended,
    StoredSession,
    decided,
    decision_for,
    recommend_and_export,
)
from foundation.paths import default_database_url

MAX_ANSWERS = 64


def finished_key(store: Any, session_ids: Sequence[int]) -> tuple[Any, ...] | None:
    """(database, (id, finished_at) per session) while every session is done; None otherwise."""
    rows = [store.get_session(int(sid)) for sid in session_ids]
    if not rows or any(row is None or row.get("status") != "done" for row in rows):
        return None
    return default_database_url(), tuple((int(row["id"]), str(row.get("finished_at"))) for row in rows)


def _recommend(key: tuple[Any, ...] | None, args: tuple[Any, ...], _store: Any) -> Recommended:
    ids, objective, budget, batch, price, override, engine, temperature, vllm_version = args
    return recommend_and_export(
        _store,
        list(ids),
        objective,
        budget,
        batch,
        price,
        override,
        engine,
        temperature=temperature,
        vllm_version=vllm_version,
    )


_kept_recommendation = st.cache_resource(show_spinner=False, max_entries=MAX_ANSWERS)(_recommend)


def recommended(
    store: Any,
    session_ids: Sequence[int],
    objective: str,
    budget: float | None,
    batch_size: int,
    price_per_hour: float | None,
    regime_override: str | None,
    engine: str | None,
    temperature: float | None,
    vllm_version: str | None,
) -> Recommended:
    """engine.service.decide.recommendations.recommend_and_export (every format, not saved), kept while the sessions
    stay finished."""
    args = (
        tuple(int(i) for i in session_ids),
        objective,
        budget,
        int(batch_size),
        price_per_hour,
        regime_override,
        engine,
        temperature,
        vllm_version,
    )
    key = finished_key(store, session_ids)
    return _recommend(key, args, store) if key is None else _kept_recommendation(key, args, store)


def _replay(key: tuple[Any, ...] | None, args: tuple[Any, ...], _store: Any) -> PolicyReport:
    ids, objective, budget, batch, override, engine, temperature = args
    query = DecisionQuery(objective, batch, temperature, budget, None, override, engine)
    return decided(_store, list(ids), query)[1].policies


_kept_policies = st.cache_resource(show_spinner=False, max_entries=MAX_ANSWERS)(_replay)


def policies(
    store: Any,
    session_ids: Sequence[int],
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    regime_override: str | None = None,
    engine: str | None = None,
    temperature: float | None = None,
) -> PolicyReport:
    """The policy report the stored decision for these inputs was made from (engine.service.decide.decisions.decided),
    kept while the sessions stay finished."""
    args = (
        tuple(int(i) for i in session_ids),
        objective,
        budget,
        int(batch_size),
        regime_override,
        engine,
        temperature,
    )
    key = finished_key(store, session_ids)
    return _replay(key, args, store) if key is None else _kept_policies(key, args, store)


def session_decisions(store: Any, session: Mapping[str, Any]) -> dict[float, Decision | None]:
    """The stored decision (engine.service.decide.decisions: made once when the session ended) at each temperature the
    session measured, for its serving batch and the default objective; None where there is nothing to decide."""
    batch = StoredSession.of(session).serving_batch
    out: dict[float, Decision | None] = {}
    for temperature in session.get("temperatures") or [0.0]:
        try:
            query = DecisionQuery.of_session(batch, temperature)
            out[float(temperature)] = decision_for(store, [int(session["id"])], query)
        except SpectuneError:
            out[float(temperature)] = None
    return out
