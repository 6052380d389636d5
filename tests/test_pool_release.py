"""The worker's model pool holds only what the next session loads (issue #21, defect 7).

Seen: the worker stayed at ~10 GB RSS holding the float32 models of a cancelled PyTorch session while it ran a
llama.cpp session. Tiny in-process models here, the real worker loop, a real SQLite file in tmp_path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.models.pool import ModelPool
from engine.service.worker.loop import keep_for, run_session, serve
from engine.session.spec import SessionSpec
from store import Store
from tests.test_worker import DRAFT, DTYPE, TARGET, open_db, queue

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OTHER = "tiny:2:48:2:64"  # another target: nothing of the first session's is used by it


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    s = open_db(tmp_path)
    yield s
    s.close()


def pooled_after_each_session(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, str, str]]]:
    import engine.service.worker.loop

    seen: list[list[tuple[str, str, str]]] = []
    real = engine.service.worker.loop.run_session

    def recording(store_: Any, session: dict, pool: ModelPool, worker_id: str) -> str:
        state = real(store_, session, pool, worker_id)
        seen.append(pool.keys())
        return state

    monkeypatch.setattr(engine.service.worker.loop, "run_session", recording)
    return seen


def test_a_session_with_model_b_leaves_only_model_b_in_the_pool(store: Store, monkeypatch: pytest.MonkeyPatch):
    seen = pooled_after_each_session(monkeypatch)
    first = queue(store, prompts=1, drafts=("ngram",), max_new_tokens=8, target=TARGET)
    second = queue(store, prompts=1, drafts=("ngram",), max_new_tokens=8, target=OTHER)
    assert serve(store, once=True) == 2
    assert store.get_session(first)["status"] == store.get_session(second)["status"] == "done"
    assert seen == [[(TARGET, DTYPE, "auto")], [(OTHER, DTYPE, "auto")]]


def test_a_cancelled_session_leaves_nothing_in_the_pool(store: Store) -> None:
    # the models load, then the user's cancel stops the sweep: its models are not held afterwards
    sid = queue(store, prompts=2, drafts=(DRAFT,), max_new_tokens=8)
    session = store.claim_next_session("w1")
    assert store.request_cancel(sid)
    pool = ModelPool()
    assert run_session(store, session, pool, "w1") == "cancelled"
    assert store.get_session(sid)["status"] == "cancelled"
    assert pool.keys() == []


def test_models_of_an_engine_that_loads_none_are_all_released() -> None:
    pool = ModelPool()
    pool.get(TARGET, DTYPE)
    pool.get(OTHER, DTYPE)
    same = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[1], dtype=DTYPE)
    assert keep_for(pool, same) == [(OTHER, DTYPE, "auto")] and pool.keys() == [(TARGET, DTYPE, "auto")]
    other_dtype = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[1], dtype="bfloat16")
    assert keep_for(pool, other_dtype) == [(TARGET, DTYPE, "auto")] and pool.keys() == []
    pool.get(TARGET, DTYPE)
    llamacpp = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[1], dtype=DTYPE, engine="llama.cpp")
    assert keep_for(pool, llamacpp) == [(TARGET, DTYPE, "auto")] and pool.keys() == []
