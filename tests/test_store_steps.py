"""Step logging (batching, concurrency) and the dashboard's SQL aggregates, on real databases.

Every test runs on a fresh SQLite file and on a fresh PostgreSQL database (the `store` fixture in
tests/conftest.py), except the one marked sqlite_only: WAL readers against a raw sqlite3 write lock.
"""

from __future__ import annotations

import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the project is not installed; let `pytest tests/...` import it from any cwd
    sys.path.insert(0, str(ROOT))

from sqlalchemy import event, text  # noqa: E402

from engine.core.records import Divergence, PromptOutput, StepRecord  # noqa: E402
from store import Store, StoreError  # noqa: E402
from store.db import sqlite_path  # noqa: E402
from store.readers import positions_from_histogram  # noqa: E402

SETTINGS = {"target": "tiny", "drafts": ["ngram"], "gammas": [4], "temperatures": [0.0], "max_new_tokens": 8}


@pytest.fixture
def run_id(store: Store) -> int:
    sid = store.create_session(**SETTINGS)
    return store.create_run(sid, "ngram", 4, 0.0, "speculative")


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


def assert_plain_numbers(rows: list[dict[str, Any]]) -> None:
    """Readers hand the dashboard int/float/None, never Decimal (PostgreSQL's avg() of integers is numeric)."""
    for row in rows:
        for key, value in row.items():
            assert value is None or type(value) in (int, float, str, dict), (key, type(value))


def count_commits(store: Store) -> list[int]:
    commits = [0]

    def on_commit(_conn: object) -> None:
        commits[0] += 1

    event.listen(store.engine, "commit", on_commit)
    return commits


# --- writing --------------------------------------------------------------------------------------


def test_batched_writes_commit_rarely(store: Store, run_id: int) -> None:
    commits = count_commits(store)
    records = make_steps(2000)
    with store.step_writer(run_id, flush_interval_s=3600) as writer:
        for record in records:
            writer.add(record, t=float(record.step_index))
        assert writer.pending == 2000 % 256
    assert store.run_progress(run_id)["steps"] == 2000
    assert writer.commits == 8 and writer.steps_written == 2000  # 7 full batches of 256 + the rest on close
    assert commits[0] <= 10  # far below one commit per step (2000)


def test_time_based_flush(store: Store, run_id: int) -> None:
    now = [0.0]
    writer = store.step_writer(run_id, batch_size=1000, flush_interval_s=0.5)
    writer._clock = lambda: now[0]  # a controllable clock instead of sleeping
    writer._last_flush = 0.0
    records = make_steps(5)
    for record in records[:3]:
        writer.add(record)
    assert store.run_progress(run_id)["steps"] == 0
    now[0] = 0.6
    writer.add(records[3])  # half a second since the last commit: flush now
    assert store.run_progress(run_id)["steps"] == 4
    writer.add(records[4])
    writer.close()
    assert store.run_progress(run_id)["steps"] == 5 and writer.commits == 2


def test_writer_flushes_when_the_run_fails(store: Store, run_id: int) -> None:
    with pytest.raises(RuntimeError, match="decoder blew up"):
        with store.step_writer(run_id) as writer:
            for record in make_steps(10):
                writer.add(record)
            writer.add_sample({"cpu_percent": 93.0}, "cpu")
            raise RuntimeError("decoder blew up")
    assert store.run_progress(run_id)["steps"] == 10
    assert len(store.utilisation_series((store.get_run(run_id) or {})["session_id"])) == 1


@pytest.mark.sqlite_only  # WAL mode: readers see the last commit while another connection holds the write lock
def test_reader_not_blocked_by_open_write_transaction(store: Store, run_id: int) -> None:
    db_path = sqlite_path(store.engine.url)
    assert db_path is not None and db_path.is_file()
    with store.step_writer(run_id) as writer:
        for record in make_steps(100):
            writer.add(record)
    writer_conn = sqlite3.connect(db_path, isolation_level=None)
    writer_conn.execute("BEGIN EXCLUSIVE")  # in rollback-journal mode this would lock readers out
    writer_conn.execute(
        "INSERT INTO steps (run_id, prompt_index, step_index, gamma, accepted, accept_mask, beta, draft_time_s, "
        "verify_time_s, draft_forwards, emitted, t) VALUES (?, 0, 999, 1, 1, '[true]', '[1]', 0, 0, 1, 2, 0)",
        (run_id,),
    )
    seen: list[int] = []
    elapsed: list[float] = []

    def read() -> None:
        start = time.perf_counter()
        seen.append(store.run_progress(run_id)["steps"])
        elapsed.append(time.perf_counter() - start)

    try:
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(timeout=5)
    finally:
        writer_conn.execute("COMMIT")
        writer_conn.close()
    assert seen == [100]  # committed rows only, and no waiting on the 10 s busy timeout
    assert elapsed[0] < 2.0
    assert store.run_progress(run_id)["steps"] == 101


def test_dashboard_reads_while_worker_writes(store: Store, run_id: int) -> None:
    records = make_steps(3000)
    errors: list[BaseException] = []
    done = threading.Event()

    def worker() -> None:
        try:
            with store.step_writer(run_id, batch_size=64) as writer:
                for record in records:
                    writer.add(record)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    counts = []
    while not done.is_set():
        counts.append(store.run_progress(run_id)["steps"])
        store.step_series(run_id)
    thread.join()
    assert errors == []
    assert counts == sorted(counts)  # progress only ever grows
    assert store.run_progress(run_id)["steps"] == 3000


# --- reading --------------------------------------------------------------------------------------


def write(store: Store, run_id: int, records: list[StepRecord]) -> None:
    with store.step_writer(run_id) as writer:
        for i, record in enumerate(records):
            writer.add(record, t=1000.0 + i * 0.01)


def test_run_progress_totals(store: Store, run_id: int) -> None:
    records = make_steps(1500, prompts=3)
    write(store, run_id, records)
    progress = store.run_progress(run_id)
    assert progress["steps"] == 1500 and progress["prompts"] == 3
    assert progress["accepted"] == sum(r.accepted for r in records)
    assert progress["proposed"] == sum(r.gamma for r in records)
    assert progress["emitted"] == sum(r.emitted for r in records)
    assert progress["draft_time_s"] == pytest.approx(sum(r.draft_time_s for r in records))
    assert progress["verify_time_s"] == pytest.approx(sum(r.verify_time_s for r in records))
    assert progress["draft_acceptance_rate"] == pytest.approx(progress["accepted"] / progress["proposed"])
    assert progress["last_t"] == pytest.approx(1000.0 + 1499 * 0.01)
    assert_plain_numbers([progress])
    empty = store.run_progress(run_id + 1000)
    assert empty["steps"] == 0 and empty["draft_acceptance_rate"] is None and empty["tokens_per_s"] is None
    assert store.session_progress((store.get_run(run_id) or {})["session_id"])[run_id]["steps"] == 1500


def test_step_series_buckets_in_sql(store: Store, run_id: int) -> None:
    records = make_steps(6000)
    write(store, run_id, records)
    points = store.step_series(run_id)
    assert 250 < len(points) <= 500
    assert sum(p["steps"] for p in points) == 6000
    assert sum(p["emitted"] for p in points) == sum(r.emitted for r in records)
    width = points[1]["step"] - points[0]["step"]
    first = records[:width]
    assert points[0]["tokens_per_call"] == pytest.approx(sum(r.emitted for r in first) / width)
    assert points[0]["mean_gamma"] == pytest.approx(sum(r.gamma for r in first) / width)
    assert_plain_numbers(points)
    fine = store.step_series(run_id, bucket=1)
    assert len(fine) == 6000 and fine[7]["accepted"] == records[7].accepted
    by_time = store.step_series(run_id, by="time", max_points=100)
    assert len(by_time) <= 101 and sum(p["steps"] for p in by_time) == 6000
    assert_plain_numbers(by_time)
    assert store.step_series(run_id + 1000) == []


def test_step_series_buckets_over_prompts_and_time(store: Store, run_id: int) -> None:
    commits = count_commits(store)
    records = make_steps(4000, seed=3, prompts=4)
    with store.step_writer(run_id, flush_interval_s=3600) as writer:
        for i, record in enumerate(records):
            writer.add(record, t=1000.0 + i * 0.01)
        assert writer.pending == 4000 % 256
    assert writer.commits == 16 and writer.steps_written == 4000  # 15 full batches of 256 + the rest
    assert commits[0] <= 20
    assert store.run_progress(run_id)["steps"] == 4000 and store.run_progress(run_id)["prompts"] == 4
    # bucketed by step_index (4 prompts x 1000 steps each)
    points = store.step_series(run_id, max_points=100)
    assert len(points) == 100 and sum(p["steps"] for p in points) == 4000
    assert sum(p["emitted"] for p in points) == sum(r.emitted for r in records)
    first = [r for r in records if r.step_index < 10]
    assert points[0]["step"] == 0 and points[0]["steps"] == len(first)
    assert points[0]["tokens_per_call"] == pytest.approx(sum(r.emitted for r in first) / len(first))
    assert points[0]["mean_gamma"] == pytest.approx(sum(r.gamma for r in first) / len(first))
    assert_plain_numbers(points)
    fine = store.step_series(run_id, bucket=1, max_points=10_000)
    assert len(fine) == 1000 and sum(p["steps"] for p in fine) == 4000
    assert fine[7]["accepted"] == sum(r.accepted for r in records if r.step_index == 7)
    # by time: 40 s of steps in 4 s buckets; the bucket is floor((t - first t) / width) on every backend
    by_time = store.step_series(run_id, bucket=4.0, by="time")
    assert sum(p["steps"] for p in by_time) == 4000
    assert [p["steps"] for p in by_time] == [400] * 10
    assert_plain_numbers(by_time)
    assert len(store.step_series(run_id, by="time", max_points=100)) <= 101


def test_per_position_acceptance_matches_masks(store: Store, run_id: int) -> None:
    records = make_steps(4000, seed=3)
    write(store, run_id, records)
    expected: dict[int, list[int]] = {}
    for record in records:
        for pos, ok in enumerate(record.accept_mask):
            expected.setdefault(pos, [0, 0])
            expected[pos][0] += 1
            expected[pos][1] += int(ok)
    reference = [
        {"position": pos, "evaluated": n, "accepted": k, "rate": k / n} for pos, (n, k) in sorted(expected.items())
    ]
    assert store.per_position_acceptance(run_id) == reference  # json_each on SQLite, the histogram on PostgreSQL
    assert store.per_position_from_histogram(run_id) == reference  # the portable (γ, accepted) histogram
    assert positions_from_histogram([(4, 4, 2), (4, 1, 1)])[1] == {
        "position": 1,
        "evaluated": 3,
        "accepted": 2,
        "rate": 2 / 3,
    }


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
    assert series[0]["metrics"] == {"gpu_util": 0.0, "mem_gb": 1.5} or series[0]["metrics"] == {"cpu_percent": 50.0}
    recent = store.utilisation_series(sid, since_t=1595.0)
    assert [s["t"] for s in recent] == [1596.0, 1596.0, 1597.0, 1597.0, 1598.0, 1598.0, 1599.0, 1599.0]
    assert len(store.utilisation_series(sid, run_id=run_id, max_points=10_000)) == 3000
    assert store.add_utilisation_samples(sid, [SimpleNamespace(t=5000.0, source="cpu", metrics={"x": 1})]) == 1
    assert store.utilisation_series(sid, since_t=4999.0)[0]["run_id"] is None
    with pytest.raises(ValueError):
        writer.add_sample({"x": 1}, "tpu")


def test_runs_and_outputs_round_trip(store: Store, run_id: int) -> None:
    sid = (store.get_run(run_id) or {})["session_id"]
    baseline = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.update_run(run_id, alpha=0.7, c=0.05, verify_cost={1: 0.011, 4: 0.013}, status="done", summary={"n": 1})
    run = store.get_run(run_id) or {}
    assert run["verify_cost"] == {1: 0.011, 4: 0.013} and run["alpha"] == 0.7 and run["status"] == "done"
    assert [r["id"] for r in store.list_runs(sid)] == [run_id, baseline]
    store.finish_run(baseline, {"steps": 3}, tokens_per_s=41.5, tokens_per_call=1.0)
    assert (store.get_run(baseline) or {})["tokens_per_s"] == 41.5
    with pytest.raises(StoreError, match="does not exist"):
        store.update_run(run_id + 1000, alpha=0.1)
    with pytest.raises(TypeError, match="unknown fields"):
        store.update_run(run_id, bogus=1)
    with pytest.raises(ValueError):
        store.create_run(sid, "ngram", 2, 0.0, "turbo")
    out = PromptOutput(1, "p1", 12, [5, 6, 7], "abc", [True, False, True], 0.25, 2)
    divergence = Divergence("p1", False, position=2, target_token=7, speculative_token=8, verdict="near-tie")
    store.add_output(run_id, out, divergence)
    store.add_output(run_id, PromptOutput(0, "p0", 3, [1], "a", [False], 0.1, 1), {"identical": True})
    outputs = store.get_outputs(run_id)
    assert [o["prompt_id"] for o in outputs] == ["p0", "p1"]
    assert outputs[1]["token_ids"] == [5, 6, 7] and outputs[1]["from_draft"] == [True, False, True]
    assert outputs[1]["divergence"]["verdict"] == "near-tie" and outputs[0]["divergence"] == {"identical": True}


def test_steps_survive_in_sql_as_written(store: Store, run_id: int) -> None:
    record = make_steps(1, seed=5)[0]
    write(store, run_id, [record])
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT accept_mask, beta, gamma, accepted FROM steps")).one()
    assert (row.gamma, row.accepted) == (record.gamma, record.accepted)
    if store.engine.dialect.name == "sqlite":  # JSON is text on SQLite ...
        assert row.accept_mask.replace(" ", "") == str(record.accept_mask).lower().replace(" ", "")
    else:  # ... and a json column on PostgreSQL, which the driver parses
        assert row.accept_mask == record.accept_mask and row.beta == pytest.approx(record.beta)


def test_finish_run_takes_a_runner_summary(store: Store, run_id: int) -> None:
    from engine.session.summary import RunSummary

    result = RunSummary(
        tokens_per_s=41.5,
        steps=12,
        tokens=40,
        tokens_per_call=2.4,
        alpha=0.62,
        per_position_acceptance=[0.8, 0.6],
        c=0.04,
        speedup_measured=1.8,
        speedup_predicted=1.9,
        verify_cost={1: 1.0, 5: 1.12},
        method="ngram",
    )
    store.finish_run(run_id, result.to_dict(), **result.columns(), baseline_tokens_per_s=23.0)
    run = store.get_run(run_id) or {}
    assert (run["status"], run["tokens_per_call"], run["alpha"], run["baseline_tokens_per_s"]) == (
        "done",
        2.4,
        0.62,
        23.0,
    )
    assert run["verify_cost"] == {1: 1.0, 5: 1.12} and run["per_position_acceptance"] == [0.8, 0.6]
    assert run["summary"]["method"] == "ngram" and run["summary"]["tokens"] == 40


def test_samples_from_objects(store: Store, run_id: int) -> None:
    sid = (store.get_run(run_id) or {})["session_id"]
    sample = SimpleNamespace(t=5.0, source="cpu", metrics={"cpu_percent": 12})  # like engine.measure.telemetry.Sample
    assert store.add_utilisation_samples(sid, [sample, {"t": 6.0, "source": "nvml", "metrics": {"gpu": 3}}]) == 2
    series = store.utilisation_series(sid)
    assert [(s["t"], s["source"], s["run_id"]) for s in series] == [(5.0, "cpu", None), (6.0, "nvml", None)]
