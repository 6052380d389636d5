"""Session queue, prompt sets, cascades and recommendations, on real databases (no mocks).

Every test runs twice, on a fresh SQLite file and on a fresh PostgreSQL database: the `store` and `store_url`
fixtures in tests/conftest.py.
"""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the project is not installed; let `pytest tests/...` import it from any cwd
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from engine.core.records import PromptOutput, StepRecord  # noqa: E402
from store import Store, StoreError, open_store  # noqa: E402
from store.coltypes import utcnow  # noqa: E402
from store.workers import make_worker_id  # noqa: E402

SETTINGS = {"target": "tiny", "drafts": ["ngram", "none"], "gammas": [2, 4], "temperatures": [0.0], "max_new_tokens": 8}


def step(i: int, accepted: int = 1, gamma: int = 2) -> StepRecord:
    mask = [True] * accepted + ([False] if accepted < gamma else [])
    return StepRecord(0, i, gamma, accepted, mask, [0.5] * len(mask), 0.001, 0.002, gamma, accepted + 1)


def count(store: Store, table: str, where: str = "1=1") -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one())


# --- sessions -------------------------------------------------------------------------------------


def test_create_and_read_session(store: Store) -> None:
    sid = store.create_session(**SETTINGS, seed=3, hardware="cpu: test", top_p=0.9, notes="first")
    session = store.get_session(sid)
    assert session is not None
    assert session["status"] == "queued" and session["cancel_requested"] is False
    assert session["drafts"] == ["ngram", "none"] and session["gammas"] == [2, 4]
    assert session["created_at"].tzinfo is not None and session["name"].startswith("tiny ")
    assert [s["id"] for s in store.list_sessions()] == [sid]
    assert store.list_sessions(status="running") == []
    with pytest.raises(TypeError, match="unknown settings"):
        store.create_session(**SETTINGS, status="done")
    with pytest.raises(TypeError, match="missing settings"):
        store.create_session(target="tiny")


def test_claim_lifecycle(store: Store) -> None:
    first = store.create_session(**SETTINGS)
    second = store.create_session(**SETTINGS)
    claimed = store.claim_next_session("host:1")
    assert claimed is not None and claimed["id"] == first  # oldest first
    assert claimed["status"] == "running" and claimed["worker_id"] == "host:1" and claimed["started_at"]
    assert claimed["started_at"].tzinfo is not None
    assert store.heartbeat(first, "host:1") is True
    assert store.heartbeat(first, "host:2") is False  # not its session
    store.set_progress(first, 3, 10)
    assert (store.get_session(first) or {})["progress_done"] == 3
    store.set_regime(first, {"regime": "memory-bound"})
    store.finish_session(first, "done", summary={"best": {"gamma": 4}})
    done = store.get_session(first) or {}
    assert done["status"] == "done" and done["summary"] == {"best": {"gamma": 4}} and done["finished_at"]
    assert done["finished_at"] >= done["started_at"] >= done["created_at"]
    assert done["regime"] == {"regime": "memory-bound"} and done["progress_done"] == 3
    assert store.heartbeat(first, "host:1") is False  # finished: the worker no longer owns it
    with pytest.raises(ValueError):
        store.finish_session(second, "running")
    assert store.request_cancel(second) is True and store.claim_next_session("host:1") is None
    assert [s["id"] for s in store.list_sessions()] == [second, first]  # newest first
    assert [s["id"] for s in store.list_sessions(status="done")] == [first]
    with pytest.raises(StoreError, match="does not exist"):
        store.set_progress(999, 1, 2)


def test_cancel_queued_and_running(store: Store) -> None:
    queued = store.create_session(**SETTINGS)
    running = store.create_session(**SETTINGS)
    later = store.create_session(**SETTINGS)
    assert store.request_cancel(queued) is True
    assert (store.get_session(queued) or {})["status"] == "cancelled"
    claimed = store.claim_next_session("w:1")
    assert claimed is not None and claimed["id"] == running  # the cancelled one is skipped
    assert store.is_cancel_requested(running) is False
    assert store.request_cancel(running) is True
    assert store.is_cancel_requested(running) is True
    assert (store.get_session(running) or {})["status"] == "running"  # the worker finishes it
    assert store.is_cancel_requested(12345) is True  # deleted / unknown: stop
    assert store.is_cancel_requested(later) is False


def _claim_all(url: str, worker: str, barrier: threading.Barrier | None = None) -> list[int]:
    store = open_store(url)  # its own engine and connections, like a separate worker
    try:
        if barrier is not None:
            barrier.wait()
        got = []
        while (session := store.claim_next_session(worker)) is not None:
            assert session["worker_id"] == worker
            got.append(session["id"])
        return got
    finally:
        store.close()


def test_claim_race_between_threads_gives_each_session_once(store: Store, store_url: str) -> None:
    ids = [store.create_session(**SETTINGS) for _ in range(60)]
    barrier = threading.Barrier(2)
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            results[name] = _claim_all(store_url, name, barrier)  # its own engine, like a separate worker
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    claimed = results["w0"] + results["w1"]
    assert sorted(claimed) == ids and len(set(claimed)) == len(ids)  # every session claimed exactly once
    owners = {s["id"]: s["worker_id"] for s in store.list_sessions()}
    assert all(owners[i] == "w0" for i in results["w0"]) and all(owners[i] == "w1" for i in results["w1"])
    assert {s["status"] for s in store.list_sessions()} == {"running"}


def _claim_in_process(url: str, worker: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put((worker, _claim_all(url, worker)))


def test_claim_race_between_processes_gives_each_session_once(store: Store, store_url: str) -> None:
    ids = [store.create_session(**SETTINGS) for _ in range(20)]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(store_url, f"p{i}", out)) for i in range(2)]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=30) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    claimed = results["p0"] + results["p1"]
    assert sorted(claimed) == ids and len(set(claimed)) == len(ids)


def test_interrupt_orphaned_sessions(store: Store) -> None:
    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid no longer exists
    stale = store.create_session(**SETTINGS)
    alive = store.create_session(**SETTINGS)
    dead_pid = store.create_session(**SETTINGS)
    remote = store.create_session(**SETTINGS)
    for worker in ["otherhost:11", make_worker_id(), f"{host}:{dead.pid}", "otherhost:12"]:
        assert store.claim_next_session(worker) is not None
    run = store.create_run(stale, "ngram", 2, 0.0, "speculative")
    with store.step_writer(run) as writer:
        for i in range(10):
            writer.add(step(i))

    assert store.interrupt_orphaned_sessions(stale_after_s=60) == [dead_pid]  # heartbeats fresh; one pid gone
    failed = store.get_session(dead_pid) or {}
    assert failed["status"] == "interrupted" and failed["error"].startswith("worker died (no heartbeat since ")
    assert f"process {dead.pid} on {host} is gone" in failed["error"]

    store.heartbeat(remote, "otherhost:12")
    later = utcnow() + timedelta(seconds=90)  # 90 s pass with no heartbeat from anyone
    assert sorted(store.interrupt_orphaned_sessions(stale_after_s=60, now=later)) == sorted([stale, alive, remote])
    orphan = store.get_session(stale) or {}
    assert orphan["status"] == "interrupted" and orphan["error"].startswith("worker died (no heartbeat since 20")
    assert store.run_progress(run)["steps"] == 10  # the steps it logged are kept
    assert store.get_run(run)["status"] == "cancelled"  # the run it left running is closed with it
    assert store.interrupt_orphaned_sessions(stale_after_s=60, now=later) == []


def test_delete_session_cascades(store: Store) -> None:
    keep = store.create_session(**SETTINGS)
    doomed = store.create_session(**SETTINGS)
    for sid in (keep, doomed):
        for kind, gamma in (("baseline", 0), ("speculative", 2)):
            run = store.create_run(sid, "none" if kind == "baseline" else "ngram", gamma, 0.0, kind)
            with store.step_writer(run) as writer:
                for i in range(5):
                    writer.add(step(i))
                writer.add_sample({"util": 0.5}, "cpu")
            out = PromptOutput(0, "p0", 3, [1, 2], "hi", [False, True], 0.1, 2)
            store.add_output(run, out, None)
        store.add_utilisation_samples(sid, [{"t": 1.0, "source": "nvml", "metrics": {"gpu": 1}}])
    assert count(store, "steps") == 20 and count(store, "utilisation_samples") == 6

    store.claim_next_session("w:1")  # `keep` is running now: it cannot be deleted, `doomed` still can
    with pytest.raises(StoreError, match="is running; cancel it"):
        store.delete_session(keep)
    assert store.delete_session(doomed) is True
    assert store.get_session(doomed) is None and store.list_runs(doomed) == []
    assert (count(store, "runs"), count(store, "steps"), count(store, "outputs")) == (2, 10, 2)
    assert count(store, "utilisation_samples") == 3
    assert count(store, "utilisation_samples", f"session_id = {doomed}") == 0
    assert store.delete_session(doomed) is False


def test_running_session_cannot_be_deleted(store: Store) -> None:
    sid = store.create_session(**SETTINGS)
    store.claim_next_session("w:1")
    with pytest.raises(StoreError, match="is running; cancel it"):
        store.delete_session(sid)
    store.finish_session(sid, "cancelled")
    assert store.delete_session(sid) is True


# --- prompt sets ----------------------------------------------------------------------------------


def test_prompt_set_upload_dedupes(store: Store) -> None:
    prompts = [
        {"text": "Explain WAL mode.", "category": "db"},
        {"text": "Write a haiku.", "category": "creative", "token_count": 5},
        {"text": "Explain WAL mode.", "category": "db"},  # repeated inside the file
    ]
    set_id, added, duplicates = store.add_prompt_set("demo", "demo.jsonl", prompts)
    assert (added, duplicates) == (2, 1)
    assert store.add_prompt_set("demo again", "demo.jsonl", prompts) == (set_id, 0, 3)  # same file: same set
    assert store.add_prompts(set_id, [{"text": "Write a haiku."}, {"text": "New one"}]) == (1, 1)
    rows = store.get_prompts(set_id)
    assert [(r["position"], r["text"]) for r in rows] == [
        (0, "Explain WAL mode."),
        (1, "Write a haiku."),
        (2, "New one"),
    ]
    assert rows[1]["token_count"] == 5 and len(rows[0]["content_hash"]) == 64
    assert [r["text"] for r in store.get_prompts(set_id, limit=1)] == ["Explain WAL mode."]
    assert [(p["id"], p["n_prompts"]) for p in store.list_prompt_sets()] == [(set_id, 3)]
    other, added, _ = store.add_prompt_set("other", None, ["Explain WAL mode."])
    assert other != set_id and added == 1  # the same text in another set is its own prompt
    # like engine.prompts.Prompt
    parsed = [SimpleNamespace(text="From the parser ünïcödé ✓", category="x", prompt_id="p1")]
    third, added, _ = store.add_prompt_set("parsed", "p.csv", parsed)
    assert added == 1 and store.get_prompts(third)[0]["category"] == "x"
    assert store.get_prompts(third)[0]["text"] == "From the parser ünïcödé ✓"
    with pytest.raises(StoreError, match="no prompts"):
        store.add_prompt_set("empty", None, [])


def test_delete_prompt_set_keeps_sessions(store: Store) -> None:
    set_id, _, _ = store.add_prompt_set("demo", None, ["a", "b"])
    sid = store.create_session(**SETTINGS, prompt_set_id=set_id, n_prompts=2)
    assert store.delete_prompt_set(set_id) is True
    assert store.get_prompts(set_id) == [] and count(store, "prompts") == 0
    assert count(store, "prompts", f"prompt_set_id = {set_id}") == 0
    assert (store.get_session(sid) or {})["prompt_set_id"] is None
    assert store.delete_prompt_set(set_id) is False


def test_concurrent_identical_uploads_share_one_set(store: Store, store_url: str) -> None:
    prompts = [f"prompt {i}" for i in range(50)]
    barrier = threading.Barrier(2)
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def upload() -> None:
        other = open_store(store_url)  # its own engine, like the dashboard in another browser tab
        try:
            barrier.wait()
            results.append(other.add_prompt_set("same", None, prompts))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=upload) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({r[0] for r in results}) == 1 and sorted(r[1] for r in results) == [0, 50]  # the loser finds the set
    assert count(store, "prompt_sets") == 1 and count(store, "prompts") == 50


# --- recommendations --------------------------------------------------------------------------------


def test_recommendations_and_exports(store: Store) -> None:
    sid = store.create_session(**SETTINGS)
    rec = store.save_recommendation([sid], "throughput", {"draft": "ngram", "gamma": 4})
    export = store.save_export(rec, "vllm", "spec.yaml", "speculative_config: {}\n")
    [saved] = store.list_recommendations()
    assert saved["id"] == rec and saved["session_ids"] == [sid] and saved["payload"]["gamma"] == 4
    assert saved["created_at"].tzinfo is not None
    [exported] = store.list_exports(rec)
    assert exported["id"] == export and exported["content"] == "speculative_config: {}\n"
    assert (store.get_recommendation(rec) or {})["objective"] == "throughput"
    with store.engine.begin() as conn:  # exports go with their recommendation (ON DELETE CASCADE)
        conn.execute(text("DELETE FROM recommendations WHERE id = :r"), {"r": rec})
    assert store.list_exports(rec) == [] and store.list_recommendations() == []
