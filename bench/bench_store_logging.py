"""How much does per-step logging cost? StepWriter vs doing nothing, on a real SQLite file.

Logs --steps synthetic StepRecords (default 20,000) through store.StepWriter and through a no-op sink,
reports the per-step overhead in microseconds and its share of an assumed decode step (--step-ms,
default 100 ms: a real model on CPU), then times the dashboard's SQL aggregates on the logged run.
Writes the numbers to bench/results/store_logging.json.

    .venv/bin/python bench/bench_store_logging.py [--steps 20000] [--step-ms 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy  # noqa: E402

from engine.core.records import StepRecord  # noqa: E402
from engine.service.outputs import output_file, run_command, write_output  # noqa: E402
from store import Store, open_store  # noqa: E402
from store.writer import DEFAULT_BATCH_SIZE, DEFAULT_FLUSH_INTERVAL_S  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "store_logging.json"
SETTINGS = {"target": "bench", "drafts": ["ngram"], "gammas": [4], "temperatures": [0.0], "max_new_tokens": 256}


def make_records(n: int, seed: int = 0) -> list[StepRecord]:
    """Realistic-looking steps (γ=4, 10 prompts), built up front so neither side pays for them."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        accepted = rng.randint(0, 4)
        mask = [True] * accepted + ([False] if accepted < 4 else [])
        records.append(
            StepRecord(
                prompt_index=i * 10 // n,
                step_index=i,
                gamma=4,
                accepted=accepted,
                accept_mask=mask,
                beta=[rng.random() for _ in mask],
                draft_time_s=0.002,
                verify_time_s=0.05,
                draft_forwards=0,
                emitted=accepted + 1,
                emitted_token_ids=[rng.randrange(50_000) for _ in range(accepted + 1)],
                from_draft=[True] * accepted + [False],
            )
        )
    return records


def time_nothing(records: list[StepRecord]) -> float:
    def keep(_record: StepRecord) -> None:  # one call per step, as writer.add is
        return None

    start = time.perf_counter()
    for record in records:
        keep(record)
    return time.perf_counter() - start


def time_logging(store: Store, records: list[StepRecord], batch_size: int) -> tuple[float, int, int]:
    """Seconds to log every record (including the final flush), the run id, and the commits made."""
    session_id = store.create_session(**SETTINGS)
    run_id = store.create_run(session_id, "ngram", 4, 0.0, "speculative")
    writer = store.step_writer(run_id, batch_size=batch_size)
    start = time.perf_counter()
    with writer:
        for record in records:
            writer.add(record)
    elapsed = time.perf_counter() - start
    return elapsed, run_id, writer.commits


def time_small_flush(store: Store, records: list[StepRecord], n: int = 50) -> float:
    """Seconds per commit of a one-row batch: the fixed cost the 0.5 s timer pays when steps are slow."""
    session_id = store.create_session(**SETTINGS)
    run_id = store.create_run(session_id, "ngram", 4, 0.0, "speculative")
    writer = store.step_writer(run_id, batch_size=10**9, flush_interval_s=float("inf"))
    start = time.perf_counter()
    for record in records[:n]:
        writer.add(record)
        writer.flush()
    return (time.perf_counter() - start) / n


def median_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(samples), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--step-ms", type=float, default=100.0, help="assumed decode step time (ms)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--repeats", type=int, default=3, help="best of N timings")
    parser.add_argument("--db", type=Path, help="database file (default: a temporary one)")
    parser.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    args = parser.parse_args(argv)
    out = Path(args.out)

    records = make_records(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "bench.db"
        store = open_store(f"sqlite:///{db}")
        try:
            baseline_s = min(time_nothing(records) for _ in range(args.repeats))
            logged = [time_logging(store, records, args.batch_size) for _ in range(args.repeats)]
            logging_s, run_id, commits = min(logged)
            readers_ms = {
                "run_progress": median_ms(lambda: store.run_progress(run_id)),
                "step_series": median_ms(lambda: store.step_series(run_id)),
                "per_position_acceptance": median_ms(lambda: store.per_position_acceptance(run_id)),
                "per_position_from_histogram": median_ms(lambda: store.per_position_from_histogram(run_id)),
            }
            points = len(store.step_series(run_id))
            small_flush_s = time_small_flush(store, records)
        finally:
            store.close()
        db_bytes = db.stat().st_size

    overhead_us = max(0.0, logging_s - baseline_s) / args.steps * 1e6
    result = {
        "what": "cost of logging StepRecords through store.StepWriter vs doing nothing",
        "steps": args.steps,
        "batch_size": args.batch_size,
        "flush_interval_s": DEFAULT_FLUSH_INTERVAL_S,
        "baseline_s": round(baseline_s, 6),
        "logging_s": round(logging_s, 6),
        "commits": commits,
        "overhead_per_step_us": round(overhead_us, 2),
        "assumed_step_ms": args.step_ms,
        "overhead_fraction_of_step": overhead_us / 1000 / args.step_ms,
        # With slow steps the 0.5 s timer, not the batch size, triggers commits: this fixed cost per interval.
        "small_flush_ms": round(small_flush_s * 1000, 3),
        "timer_flush_fraction": small_flush_s / DEFAULT_FLUSH_INTERVAL_S,
        "readers_ms": readers_ms,
        "step_series_points": points,
        "db_bytes": db_bytes,
        "env": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "sqlalchemy": sqlalchemy.__version__,
            "cpus": os.cpu_count(),
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }
    print(
        f"logged {args.steps} steps in {logging_s:.3f} s ({commits} commits) vs {baseline_s:.4f} s doing nothing\n"
        f"overhead per step: {overhead_us:.1f} µs = {100 * result['overhead_fraction_of_step']:.4f}% "
        f"of a {args.step_ms:g} ms step; a timer-driven commit costs {small_flush_s * 1000:.2f} ms per 0.5 s\n"
        f"dashboard queries on {args.steps} steps (ms): {readers_ms}"
    )
    write_output(out, json.dumps(result, indent=2) + "\n", "--out")  # replaced whole: a temporary file renamed
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_command(main)
