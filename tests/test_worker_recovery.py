"""A worker that died, or could not write: its session is found, ended with its true cause, and can be re-queued.

Real SQLite files; a dead worker is a reaped process's pid (or a real worker SIGKILLed, tests/test_worker.py), a
full disk an injected SQLITE_FULL.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store
from store.errors import translated
from tests.test_worker import open_db, queue

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    """The store in `home`, closed after the test."""
    opened = open_db(home)
    yield opened
    opened.close()


def _dead_worker_id() -> str:
    """A `host:pid` worker id whose process has exited and been reaped."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    return f"{socket.gethostname()}:{dead.pid}"


def _orphan(store: Store) -> tuple[int, int]:
    """A session claimed by a worker that then died, with one run left 'running'; (session id, run id)."""
    sid = queue(store, prompts=1)
    assert store.claim_next_session(_dead_worker_id())["id"] == sid
    return sid, store.create_run(sid, "ngram", 1, 0.0, "speculative")


def test_listing_sessions_marks_a_dead_workers_session_interrupted(store: Store) -> None:
    sid, run = _orphan(store)
    listed = {s["id"]: s for s in store.list_sessions()}
    assert listed[sid]["status"] == "interrupted"
    assert listed[sid]["error"].startswith("worker died (no heartbeat since ")
    assert f"requeue --session {sid}" in listed[sid]["error"]
    assert store.get_run(run)["status"] == "cancelled"


def test_cancel_on_a_session_whose_worker_is_gone_cancels_it_at_once(store: Store) -> None:
    sid, run = _orphan(store)
    assert store.request_cancel(sid)
    assert store.get_session(sid)["status"] == "cancelled"
    assert store.get_run(run)["status"] == "cancelled"


@pytest.mark.parametrize("ended", ["interrupted", "failed by an older worker"])
def test_requeue_takes_a_session_whose_worker_died(store: Store, ended: str) -> None:
    sid, _ = _orphan(store)
    if ended != "interrupted":
        store.finish_session(sid, "failed", error="worker died (no heartbeat since it started)")
    assert store.requeue_session(sid)
    assert store.get_session(sid)["status"] == "queued"


def test_requeue_refuses_a_session_that_failed_for_its_own_reason(store: Store) -> None:
    sid, _ = _orphan(store)
    store.finish_session(sid, "failed", error="internal error (ValueError: no)")
    assert not store.requeue_session(sid)


def _disk_full(*args: Any, **kwargs: Any) -> None:
    """What every write does on a full disk: SQLITE_FULL, as the store reports it."""
    with translated("spectune.db"):
        raise sqlite3.OperationalError("database or disk is full")


def test_a_session_whose_end_could_not_be_written_ends_disk_full_once_writes_work(
    home: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.service.worker.loop import serve

    sid = queue(store, prompts=2)
    monkeypatch.setattr(Store, "add_output", _disk_full)  # the first output fills the disk ...
    monkeypatch.setattr(Store, "finish_session", _disk_full)  # ... and the session's end cannot be written
    monkeypatch.setattr(Store, "update_run", _disk_full)
    assert serve(store, once=True) == 1  # the worker survives
    assert store._get_session(sid)["status"] == "running"  # not written: the disk is still full
    monkeypatch.undo()

    later = open_db(home)  # another process, once there is room again: it reads the end left beside the database
    try:
        ended = later.get_session(sid)
        assert ended["status"] == "failed", ended
        assert ended["error"].startswith("disk full: ") and "database or disk is full" in ended["error"]
        assert "worker died" not in ended["error"]
        assert {r["status"] for r in later.list_runs(sid)} <= {"failed", "done"}
        assert not (home / "spectune.db-endings").exists() or not list((home / "spectune.db-endings").iterdir())
    finally:
        later.close()


def test_the_worker_writes_its_pending_end_when_the_disk_has_room(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.service.worker.loop import serve

    sid = queue(store, prompts=1)
    monkeypatch.setattr(Store, "add_output", _disk_full)
    monkeypatch.setattr(Store, "finish_session", _disk_full)
    assert serve(store, once=True) == 1
    monkeypatch.undo()
    assert serve(store, once=True) == 0  # a worker starting: the pending end is written first
    ended = store._get_session(sid)
    assert ended["status"] == "failed" and ended["error"].startswith("disk full: "), ended
    assert "running" not in [r["status"] for r in store.list_runs(sid)]


# --- a real worker SIGKILLed mid-session, then resumed ---------------------------------------------------


def _outputs(store: Store, session_id: int) -> list[tuple[int, int]]:
    """(run id, prompt index) of every stored output of the session."""
    return [(r["id"], o["prompt_index"]) for r in store.list_runs(session_id) for o in store.get_outputs(r["id"])]


def _step_keys(store: Store, session_id: int) -> list[tuple[int, int, int]]:
    """(run id, prompt index, step index) of every stored step of the session."""
    return [(r["id"], s["prompt_index"], s["step_index"]) for r in store.list_runs(session_id)
            for s in store.run_steps(r["id"])]  # fmt: skip


def test_a_killed_session_resumes_where_it_stopped(home: Path, store: Store) -> None:
    import os
    import signal

    from tests.test_worker import DRAFT, engine_cli, start_worker, wait_for, worker_log

    sid = queue(store, prompts=4, drafts=(DRAFT,), gammas=(1,), max_new_tokens=160, name="resumed")
    clean = queue(store, prompts=4, drafts=(DRAFT,), gammas=(1,), max_new_tokens=160, name="clean")
    proc = start_worker(home)
    try:
        wait_for(lambda: len(_outputs(store, sid)) >= 4 or proc.poll() is not None, 120, "some prompts finished")
        assert proc.poll() is None, worker_log(home)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed = store.get_session(sid)
    assert killed["status"] == "interrupted", killed
    kept_outputs = set(_outputs(store, sid))
    assert 0 < len(kept_outputs) < 8  # killed mid-session: the target alone and the draft, 4 prompts each
    kept_steps = {k for k in _step_keys(store, sid) if (k[0], k[1]) in kept_outputs}
    runs_before = {r["id"] for r in store.list_runs(sid)}

    assert engine_cli(home, "requeue", "--session", str(sid)).returncode == 0
    second = start_worker(home, "--once", log_name="worker2.out")
    assert second.wait(300) == 0, worker_log(home)

    resumed, reference = store.get_session(sid), store.get_session(clean)
    assert resumed["status"] == "done" and reference["status"] == "done", (resumed["error"], reference["error"])
    assert {r["id"] for r in store.list_runs(sid)} == runs_before  # the earlier runs reopened, none added
    outputs, steps = _outputs(store, sid), _step_keys(store, sid)
    assert len(outputs) == len(set(outputs)) == 4 * len(runs_before)  # each prompt once in each run
    assert len(steps) == len(set(steps))  # no measured step decoded twice
    assert kept_steps <= set(steps) and kept_outputs <= set(outputs)  # what the killed worker measured is kept
    assert set(resumed["summary"]) == set(reference["summary"])
    assert [set(r) for r in resumed["summary"]["runs"]] == [set(r) for r in reference["summary"]["runs"]]
    assert all(r["status"] == "done" for r in store.list_runs(sid))
    assert "running" not in {s["status"] for s in store.list_sessions()}


def test_a_stopped_quick_session_resumes_its_probe_and_confirms(store: Store) -> None:
    import threading

    from engine.service.jobs import submit_session
    from engine.service.worker.loop import serve
    from engine.service.worker.store_hooks import TERMINATING
    from engine.session.spec import SessionSpec
    from tests.test_worker import DRAFT, DTYPE, TARGET, prompt_set, wait_for

    spec = SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[1, 2], max_new_tokens=120, dtype=DTYPE,
                       detect_regime=False, mode="quick")  # fmt: skip
    sid = submit_session(store, spec, prompt_set(store, 4), 4, "quick")
    worker = threading.Thread(target=serve, args=(store,), kwargs={"once": True})
    worker.start()
    try:
        wait_for(lambda: len(_outputs(store, sid)) >= 3, 120, "some prompts finished")
    finally:
        TERMINATING.set()  # what the worker's SIGTERM handler does
        worker.join(120)
    assert store.get_session(sid)["status"] == "interrupted"
    kept = set(_outputs(store, sid))
    assert store.requeue_session(sid)
    assert serve(store, once=True) == 1
    ended = store.get_session(sid)
    assert ended["status"] == "done", ended["error"]
    outputs, steps = _outputs(store, sid), _step_keys(store, sid)
    assert len(outputs) == len(set(outputs)) and len(steps) == len(set(steps))  # nothing decoded twice
    assert kept <= set(outputs)
    assert all(r["status"] == "done" for r in store.list_runs(sid))
