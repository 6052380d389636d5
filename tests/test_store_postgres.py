"""The store against a real PostgreSQL server: migrations, queue, step logging, readers, cascades, a worker.

Runs only when SPECTUNE_TEST_PG_URL names a server, e.g. the throwaway one from scripts/start_postgres.sh:

    export SPECTUNE_TEST_PG_URL="$(scripts/start_postgres.sh)"; .venv/bin/python -m pytest tests/test_store_postgres.py
    scripts/stop_postgres.sh

Every test gets its own empty database, created on that server (as CREATE DATABASE from the URL's user)
and dropped again afterwards, so tests never see each other's rows and nothing is left behind.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the project is not installed; let `pytest tests/...` import it from any cwd
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, event, inspect, text  # noqa: E402
from sqlalchemy.engine import URL, make_url  # noqa: E402

from engine.records import Divergence, PromptOutput, StepRecord  # noqa: E402
from store import Store, StoreError, open_store  # noqa: E402
from store.coltypes import utcnow  # noqa: E402
from store.workers import make_worker_id  # noqa: E402

PG_URL = os.environ.get("SPECTUNE_TEST_PG_URL", "").strip()

pytestmark = pytest.mark.skipif(
    not PG_URL,
    reason="PostgreSQL store tests need SPECTUNE_TEST_PG_URL "
    '(export SPECTUNE_TEST_PG_URL="$(scripts/start_postgres.sh)"; CI sets it)',
)

SETTINGS = {"target": "tiny", "drafts": ["ngram", "none"], "gammas": [2, 4], "temperatures": [0.0], "max_new_tokens": 8}
TABLES = {
    "prompt_sets",
    "prompts",
    "sessions",
    "runs",
    "steps",
    "outputs",
    "utilisation_samples",
    "recommendations",
    "exports",
    "alembic_version",
}


# --- a fresh database per test --------------------------------------------------------------------


def _server_url() -> URL:
    url = make_url(PG_URL)
    if url.get_backend_name() != "postgresql":
        raise pytest.UsageError(f"SPECTUNE_TEST_PG_URL must be a postgresql URL, not {url.get_backend_name()!r}")
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped (with its connections) afterwards."""
    server = _server_url()
    name = f"spectune_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield server.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = open_store(pg_url)
    yield s
    s.close()


@pytest.fixture
def run_id(store: Store) -> int:
    sid = store.create_session(**(SETTINGS | {"drafts": ["ngram"], "gammas": [4]}))
    return store.create_run(sid, "ngram", 4, 0.0, "speculative")


def step(i: int, accepted: int = 1, gamma: int = 2) -> StepRecord:
    mask = [True] * accepted + ([False] if accepted < gamma else [])
    return StepRecord(0, i, gamma, accepted, mask, [0.5] * len(mask), 0.001, 0.002, gamma, accepted + 1)


def make_steps(n: int, seed: int = 0, prompts: int = 1) -> list[StepRecord]:
    """Synthetic steps whose accept_mask agrees with (gamma, accepted), as the decoder's do."""
    rng = random.Random(seed)
    records = []
    per_prompt = n // prompts
    for i in range(n):
        gamma = rng.choice([0, 2, 4, 4, 4])
        accepted = rng.randint(0, gamma)
        mask = [True] * accepted + ([False] if accepted < gamma else [])
        records.append(
            StepRecord(
                prompt_index=i // per_prompt,
                step_index=i % per_prompt,
                gamma=gamma,
                accepted=accepted,
                accept_mask=mask,
                beta=[rng.random() for _ in mask],
                draft_time_s=0.001 * gamma,
                verify_time_s=0.01,
                draft_forwards=gamma,
                emitted=accepted + 1,
            )
        )
    return records


def count(store: Store, table: str, where: str = "1=1") -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one())


def assert_plain_numbers(rows: list[dict[str, Any]]) -> None:
    """Readers hand the dashboard int/float/None, never Decimal (PostgreSQL's avg() of integers is numeric)."""
    for row in rows:
        for key, value in row.items():
            assert value is None or type(value) in (int, float, str, dict), (key, type(value))


# --- schema ---------------------------------------------------------------------------------------


def test_open_store_migrates_empty_database_to_head(pg_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from store.migrate import current_revision, head_revision
    from store.models import Base

    store = open_store(pg_url)
    try:
        assert store.engine.dialect.name == "postgresql"
        assert set(inspect(store.engine).get_table_names()) == TABLES
        assert current_revision(store.engine) == head_revision()
        with store.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []  # migrations build exactly the models
        fks = {fk["referred_table"]: fk["options"] for fk in inspect(store.engine).get_foreign_keys("steps")}
        assert fks["runs"].get("ondelete") == "CASCADE"
    finally:
        store.close()
    again = open_store(pg_url)  # already at head: a no-op
    try:
        assert current_revision(again.engine) == head_revision()
    finally:
        again.close()


def test_concurrent_first_open_migrates_once(pg_url: str) -> None:
    from store.migrate import current_revision, head_revision

    barrier = threading.Barrier(3)
    errors: list[BaseException] = []
    stores: list[Store] = []

    def opener() -> None:
        barrier.wait()
        try:
            stores.append(open_store(pg_url))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert [current_revision(s.engine) for s in stores] == [head_revision()] * 3
    finally:
        for s in stores:
            s.close()


def test_newer_schema_is_refused(store: Store, pg_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match="schema revision 9999, newer"):
        open_store(pg_url)


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
    parsed = [SimpleNamespace(text="From the parser ünïcödé ✓", category="x", prompt_id="p1")]
    third, added, _ = store.add_prompt_set("parsed", "p.csv", parsed)
    assert added == 1 and store.get_prompts(third)[0]["text"] == "From the parser ünïcödé ✓"
    with pytest.raises(StoreError, match="no prompts"):
        store.add_prompt_set("empty", None, [])

    sid = store.create_session(**SETTINGS, prompt_set_id=set_id, n_prompts=3)
    assert store.delete_prompt_set(set_id) is True  # the session keeps its results; prompt_set_id -> NULL
    assert store.get_prompts(set_id) == [] and count(store, "prompts", f"prompt_set_id = {set_id}") == 0
    assert (store.get_session(sid) or {})["prompt_set_id"] is None
    assert store.delete_prompt_set(set_id) is False


def test_concurrent_identical_uploads_share_one_set(store: Store, pg_url: str) -> None:
    prompts = [f"prompt {i}" for i in range(50)]
    barrier = threading.Barrier(2)
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def upload() -> None:
        other = open_store(pg_url)
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


# --- sessions as a queue --------------------------------------------------------------------------


def test_create_claim_and_finish(store: Store) -> None:
    first = store.create_session(**SETTINGS, seed=3, hardware="cpu: test", top_p=0.9, notes="first")
    second = store.create_session(**SETTINGS)
    session = store.get_session(first) or {}
    assert session["status"] == "queued" and session["cancel_requested"] is False
    assert session["drafts"] == ["ngram", "none"] and session["gammas"] == [2, 4]
    assert session["created_at"].tzinfo is not None and session["name"].startswith("tiny ")
    claimed = store.claim_next_session("host:1")
    assert claimed is not None and claimed["id"] == first  # oldest first
    assert claimed["started_at"].tzinfo is not None
    assert store.heartbeat(first, "host:1") is True and store.heartbeat(first, "host:2") is False
    store.set_progress(first, 3, 10)
    store.set_regime(first, {"regime": "memory-bound"})
    store.finish_session(first, "done", summary={"best": {"gamma": 4}})
    done = store.get_session(first) or {}
    assert done["status"] == "done" and done["summary"] == {"best": {"gamma": 4}}
    assert done["finished_at"] >= done["started_at"] >= done["created_at"]
    assert done["regime"] == {"regime": "memory-bound"} and done["progress_done"] == 3
    assert store.request_cancel(second) is True and store.claim_next_session("host:1") is None
    assert [s["id"] for s in store.list_sessions()] == [second, first]
    assert [s["id"] for s in store.list_sessions(status="done")] == [first]
    with pytest.raises(StoreError, match="does not exist"):
        store.set_progress(999, 1, 2)


def test_claim_race_between_threads_gives_each_session_once(store: Store, pg_url: str) -> None:
    ids = [store.create_session(**SETTINGS) for _ in range(60)]
    barrier = threading.Barrier(2)
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        own = open_store(pg_url)  # its own engine and connections, like a separate worker process
        try:
            barrier.wait()
            got = []
            while (session := own.claim_next_session(name)) is not None:
                assert session["worker_id"] == name
                got.append(session["id"])
            results[name] = got
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            own.close()

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


def test_fail_orphaned_sessions(store: Store) -> None:
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

    assert store.fail_orphaned_sessions(stale_after_s=60) == [dead_pid]  # heartbeats fresh; one pid gone
    failed = store.get_session(dead_pid) or {}
    assert failed["status"] == "failed" and failed["error"].startswith("worker died (no heartbeat since ")
    assert f"process {dead.pid} on {host} is gone" in failed["error"]

    store.heartbeat(remote, "otherhost:12")
    later = utcnow() + timedelta(seconds=90)  # 90 s pass with no heartbeat from anyone
    assert sorted(store.fail_orphaned_sessions(stale_after_s=60, now=later)) == sorted([stale, alive, remote])
    orphan = store.get_session(stale) or {}
    assert orphan["status"] == "failed" and orphan["error"].startswith("worker died (no heartbeat since 20")
    assert store.run_progress(run)["steps"] == 10  # the steps it logged are kept
    assert store.fail_orphaned_sessions(stale_after_s=60, now=later) == []


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
            store.add_output(run, PromptOutput(0, "p0", 3, [1, 2], "hi", [False, True], 0.1, 2), None)
        store.add_utilisation_samples(sid, [{"t": 1.0, "source": "nvml", "metrics": {"gpu": 1}}])
    assert count(store, "steps") == 20 and count(store, "utilisation_samples") == 6

    store.claim_next_session("w:1")  # `keep` is running now: it cannot be deleted
    with pytest.raises(StoreError, match="is running; cancel it"):
        store.delete_session(keep)
    assert store.delete_session(doomed) is True
    assert store.get_session(doomed) is None and store.list_runs(doomed) == []
    assert (count(store, "runs"), count(store, "steps"), count(store, "outputs")) == (2, 10, 2)
    assert count(store, "utilisation_samples") == 3
    assert count(store, "utilisation_samples", f"session_id = {doomed}") == 0
    assert store.delete_session(doomed) is False


# --- step logging and the dashboard's readers -----------------------------------------------------


def test_batched_step_writes_and_readers(store: Store, run_id: int) -> None:
    commits = [0]

    def on_commit(_conn: object) -> None:
        commits[0] += 1

    event.listen(store.engine, "commit", on_commit)
    records = make_steps(4000, seed=3, prompts=4)
    with store.step_writer(run_id, flush_interval_s=3600) as writer:
        for i, record in enumerate(records):
            writer.add(record, t=1000.0 + i * 0.01)
        assert writer.pending == 4000 % 256
    assert writer.commits == 16 and writer.steps_written == 4000  # 15 full batches of 256 + the rest
    assert commits[0] <= 20

    progress = store.run_progress(run_id)
    assert progress["steps"] == 4000 and progress["prompts"] == 4
    assert progress["accepted"] == sum(r.accepted for r in records)
    assert progress["proposed"] == sum(r.gamma for r in records)
    assert progress["emitted"] == sum(r.emitted for r in records)
    assert progress["draft_time_s"] == pytest.approx(sum(r.draft_time_s for r in records))
    assert progress["verify_time_s"] == pytest.approx(sum(r.verify_time_s for r in records))
    assert progress["acceptance_rate"] == pytest.approx(progress["accepted"] / progress["proposed"])
    assert progress["last_t"] == pytest.approx(1000.0 + 3999 * 0.01)
    assert_plain_numbers([progress])
    empty = store.run_progress(run_id + 1000)
    assert empty["steps"] == 0 and empty["acceptance_rate"] is None and empty["tokens_per_s"] is None
    sid = (store.get_run(run_id) or {})["session_id"]
    assert store.session_progress(sid)[run_id]["steps"] == 4000

    # step_series: bucketed by step_index (4 prompts x 1000 steps each)
    points = store.step_series(run_id, max_points=100)
    assert len(points) == 100 and sum(p["steps"] for p in points) == 4000
    assert sum(p["emitted"] for p in points) == sum(r.emitted for r in records)
    first = [r for r in records if r.step_index < 10]
    assert points[0]["step"] == 0 and points[0]["steps"] == len(first)
    assert points[0]["mean_accepted"] == pytest.approx(sum(r.accepted for r in first) / len(first))
    assert points[0]["mean_gamma"] == pytest.approx(sum(r.gamma for r in first) / len(first))
    assert_plain_numbers(points)
    fine = store.step_series(run_id, bucket=1, max_points=10_000)
    assert len(fine) == 1000 and sum(p["steps"] for p in fine) == 4000
    assert fine[7]["accepted"] == sum(r.accepted for r in records if r.step_index == 7)
    # by time: 40 s of steps in 4 s buckets; the bucket is floor((t - first t) / width), as on SQLite
    by_time = store.step_series(run_id, bucket=4.0, by="time")
    assert sum(p["steps"] for p in by_time) == 4000
    assert [p["steps"] for p in by_time] == [400] * 10
    assert_plain_numbers(by_time)
    assert len(store.step_series(run_id, by="time", max_points=100)) <= 101
    assert store.step_series(run_id + 1000) == []

    # per-position acceptance: PostgreSQL takes the (gamma, accepted) histogram path
    expected: dict[int, list[int]] = {}
    for record in records:
        for pos, ok in enumerate(record.accept_mask):
            expected.setdefault(pos, [0, 0])
            expected[pos][0] += 1
            expected[pos][1] += int(ok)
    reference = [
        {"position": pos, "evaluated": n, "accepted": k, "rate": k / n} for pos, (n, k) in sorted(expected.items())
    ]
    assert store.per_position_acceptance(run_id) == reference
    assert store.per_position_from_histogram(run_id) == reference


def test_utilisation_series_thins_and_pages(store: Store, run_id: int) -> None:
    sid = (store.get_run(run_id) or {})["session_id"]
    with store.step_writer(run_id) as writer:
        for i in range(1500):
            writer.add_sample({"gpu_util": i % 100, "mem_gb": 1.5}, "nvml", t=100.0 + i)
            writer.add_sample({"cpu_percent": 50}, "cpu", t=100.0 + i)
    series = store.utilisation_series(sid, max_points=200)
    assert {s["source"] for s in series} == {"nvml", "cpu"}
    assert 300 <= len(series) <= 2 * 201
    assert [s["t"] for s in series] == sorted(s["t"] for s in series)
    assert series[0]["t"] == 100.0  # the first sample of the first bucket is kept
    assert series[0]["metrics"] in ({"gpu_util": 0.0, "mem_gb": 1.5}, {"cpu_percent": 50.0})
    recent = store.utilisation_series(sid, since_t=1595.0)
    assert [s["t"] for s in recent] == [1596.0, 1596.0, 1597.0, 1597.0, 1598.0, 1598.0, 1599.0, 1599.0]
    assert len(store.utilisation_series(sid, run_id=run_id, max_points=10_000)) == 3000
    assert store.add_utilisation_samples(sid, [SimpleNamespace(t=5000.0, source="cpu", metrics={"x": 1})]) == 1
    assert store.utilisation_series(sid, since_t=4999.0)[0]["run_id"] is None


def test_runs_outputs_recommendations_and_exports(store: Store, run_id: int) -> None:
    sid = (store.get_run(run_id) or {})["session_id"]
    baseline = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.update_run(run_id, alpha=0.7, c=0.05, verify_cost={1: 0.011, 4: 0.013}, status="done", summary={"n": 1})
    run = store.get_run(run_id) or {}
    assert run["verify_cost"] == {1: 0.011, 4: 0.013} and run["alpha"] == 0.7 and run["status"] == "done"
    assert [r["id"] for r in store.list_runs(sid)] == [run_id, baseline]
    store.finish_run(baseline, {"tokens_per_s": 41.5, "mean_accepted_tokens": 0.0, "steps": 3})
    assert (store.get_run(baseline) or {})["tokens_per_s"] == 41.5
    with pytest.raises(StoreError, match="does not exist"):
        store.update_run(run_id + 1000, alpha=0.1)
    out = PromptOutput(1, "p1", 12, [5, 6, 7], "abc", [True, False, True], 0.25, 2)
    divergence = Divergence("p1", False, position=2, target_token=7, speculative_token=8, verdict="near-tie")
    store.add_output(run_id, out, divergence)
    store.add_output(run_id, PromptOutput(0, "p0", 3, [1], "a", [False], 0.1, 1), {"identical": True})
    outputs = store.get_outputs(run_id)
    assert [o["prompt_id"] for o in outputs] == ["p0", "p1"]
    assert outputs[1]["token_ids"] == [5, 6, 7] and outputs[1]["from_draft"] == [True, False, True]
    assert outputs[1]["divergence"]["verdict"] == "near-tie" and outputs[0]["divergence"] == {"identical": True}

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


# --- a worker, end to end, on the tiny models -----------------------------------------------------


def test_worker_runs_a_session_end_to_end(store: Store) -> None:
    import torch

    from engine.jobs import submit_session
    from engine.settings import SweepSettings
    from engine.worker import serve

    target, draft = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"
    texts = [{"text": f"p prompt {i}: write a short story about the number {i}."} for i in range(3)]
    set_id, _, _ = store.add_prompt_set("pg-e2e", None, texts)
    settings = SweepSettings(target=target, drafts=[draft, "ngram"], gammas=[1, 2], max_new_tokens=32, dtype="float32")
    sid = submit_session(store, settings, set_id, 3, "pg", options={"detect_regime": False})
    assert (store.get_session(sid) or {})["status"] == "queued"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread hand-off would cost more than the work
    try:
        assert serve(store, once=True) == 1
    finally:
        torch.set_num_threads(threads)

    session = store.get_session(sid) or {}
    assert session["status"] == "done", session["error"]
    assert session["progress_total"] == 3 * (1 + 2 * 2) == session["progress_done"]
    runs = store.list_runs(sid)
    assert [(r["kind"], r["draft"], r["gamma"]) for r in runs] == [
        ("baseline", "none", 0),
        ("speculative", draft, 1),
        ("speculative", draft, 2),
        ("speculative", "ngram", 1),
        ("speculative", "ngram", 2),
    ]
    for run in runs:
        assert run["status"] == "done"
        outputs = store.get_outputs(run["id"])
        assert [o["prompt_index"] for o in outputs] == [0, 1, 2]
        logged = store.run_progress(run["id"])["steps"]
        assert logged == sum(o["steps"] for o in outputs) > 0
        assert run["summary"]["steps"] == logged
        if run["kind"] == "speculative":
            assert 0.0 <= run["alpha"] <= 1.0
            assert store.per_position_acceptance(run["id"])
            assert_plain_numbers(store.step_series(run["id"]))
    assert store.utilisation_series(sid)
    assert set(session["summary"]["verify_cost"]) >= {"1", "2", "3"}
    assert session["regime"] is None
    assert store.delete_session(sid) is True and count(store, "steps") == 0
