"""The pages' answers about finished sessions are kept per process (app.memo): asked again, the same answer object
comes back without the one model running again; a session that is not done, or that finished again since, is
answered afresh."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st

from app import memo
from engine.service.decide import decisions, recommendations
from foundation.paths import default_database_url
from store import open_store
from tests.test_recommend_surface import store_vllm_session


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    st.cache_resource.clear()
    s = open_store(default_database_url())
    yield s
    s.close()
    st.cache_resource.clear()


def counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Count the calls memo makes to the service function `name` of `module` (the real one still runs)."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(memo, name, counted)
    return calls


def ask(store: object, sid: int) -> object:
    return memo.recommended(store, [sid], "latency", None, 1, None, None, "vllm", None, None)


def test_a_finished_sessions_answer_is_computed_once_and_shared(store, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch, recommendations, "recommend_and_export")
    sid = store_vllm_session(store)
    first, again = ask(store, sid), ask(store, sid)
    assert again is first and len(calls) == 1
    assert memo.recommended(store, [sid], "cost", None, 1, None, None, "vllm", None, None) is not first  # other args
    assert len(calls) == 2
    read = counting(monkeypatch, decisions, "decided")
    report = memo.policies(store, [sid], engine="vllm")
    assert memo.policies(store, [sid], engine="vllm") is report and len(read) == 1
    assert report == first.policies  # the one the decision was made from, read from the store


def test_a_session_that_is_not_done_or_finished_again_is_answered_afresh(store, monkeypatch) -> None:
    calls = counting(monkeypatch, recommendations, "recommend_and_export")
    sid = store_vllm_session(store)
    first = ask(store, sid)
    key = memo.finished_key(store, [sid])
    store.finish_session(sid, "interrupted")
    assert memo.finished_key(store, [sid]) is None
    assert store.requeue_session(sid)
    store.claim_next_session("test:2")
    store.finish_session(sid, "done", summary=store.get_session(sid)["summary"])
    assert memo.finished_key(store, [sid]) != key  # finished again: another answer may be due
    assert ask(store, sid) is not first and len(calls) == 2
