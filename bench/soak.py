"""Soak: one long session (≥ 20,000 verification steps) through the real worker while a reader polls the store.

A tiny in-process model keeps the decode cheap, so what is measured is the plumbing: the worker
(`python -m engine worker`, a subprocess) logs every step through the batched writer while this process
reads the store the way the dashboard's live view does, every --poll-s seconds: the session, its runs,
run_progress of the current run and the baseline, step_series, per_position_acceptance,
utilisation_series and the newest outputs. Reported:

* worker RSS (psutil on the worker pid) when the session starts decoding and when it has finished,
  and the peak seen;
* this reader process's RSS at the start and at the end;
* live-view poll latency (max, p50, p95) and the slowest single query;
* the time to build the finished session's chart data with a fresh Store (every reader the Sessions
  page and the charts use, over every run).

It stops by itself: the session is bounded (prompts × max new tokens), and --timeout-s kills the worker
if it ever overruns. Writes bench/results/soak.json and prints a table.

    .venv/bin/python bench/soak.py [--prompts 40] [--max-new-tokens 400] [--timeout-s 900]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "soak.json"
MB = 1024 * 1024


def rss_mb(proc: psutil.Process) -> float | None:
    try:
        return round(proc.memory_info().rss / MB, 1)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def timed(record: dict[str, list[float]], name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    value = fn()
    record.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
    return value


def live_poll(store: Any, session_id: int, per_query: dict[str, list[float]]) -> dict[str, Any]:
    """What app/pages/2_Run.py's live fragment reads on each refresh (plus step_series for the chart)."""
    session = timed(per_query, "get_session", lambda: store.get_session(session_id))
    runs = timed(per_query, "list_runs", lambda: store.list_runs(session_id))
    if not runs:
        return {"status": session["status"], "steps": 0}
    current = next((r for r in reversed(runs) if r["status"] == "running"), runs[-1])
    baseline = runs[0]
    progress = timed(per_query, "run_progress", lambda: store.run_progress(current["id"]))
    timed(per_query, "run_progress", lambda: store.run_progress(baseline["id"]))
    timed(per_query, "step_series", lambda: store.step_series(current["id"]))
    if current["kind"] == "speculative":
        timed(per_query, "per_position_acceptance", lambda: store.per_position_acceptance(current["id"]))
    timed(per_query, "utilisation_series", lambda: store.utilisation_series(session_id, max_points=300))
    timed(per_query, "get_outputs", lambda: store.get_outputs(current["id"]))
    return {"status": session["status"], "steps": progress["steps"]}


def render_finished(store: Any, session_id: int) -> tuple[float, dict[str, float], int]:
    """Every chart's data for the finished session; returns (total ms, ms per reader, points)."""
    per: dict[str, list[float]] = {}
    points = 0
    t0 = time.perf_counter()
    session = timed(per, "get_session", lambda: store.get_session(session_id))
    runs = timed(per, "list_runs", lambda: store.list_runs(session_id))
    timed(per, "session_progress", lambda: store.session_progress(session_id))
    timed(per, "get_prompts", lambda: store.get_prompts(session["prompt_set_id"], limit=session["n_prompts"]))
    for run in runs:
        timed(per, "get_outputs", lambda run=run: store.get_outputs(run["id"]))
        timed(per, "run_progress", lambda run=run: store.run_progress(run["id"]))
        points += len(timed(per, "step_series", lambda run=run: store.step_series(run["id"])))
        points += len(timed(per, "step_series_by_time", lambda run=run: store.step_series(run["id"], by="time")))
        if run["kind"] == "speculative":
            points += len(
                timed(per, "per_position_acceptance", lambda run=run: store.per_position_acceptance(run["id"]))
            )
    points += len(timed(per, "utilisation_series", lambda: store.utilisation_series(session_id)))
    total = (time.perf_counter() - t0) * 1000
    return total, {k: round(sum(v), 2) for k, v in per.items()}, points


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny:1:48:1:32")
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--gamma", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--min-steps", type=int, default=20_000, help="fail the soak if fewer steps were logged")
    ap.add_argument("--poll-s", type=float, default=0.5)
    ap.add_argument("--timeout-s", type=float, default=900, help="hard bound: the worker is killed after this")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for the worker")
    ap.add_argument("--home", default=None, help="data directory (default: a fresh temporary one)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)

    home = Path(args.home or tempfile.mkdtemp(prefix="spectune-soak-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ["SPECTUNE_HOME"] = str(home)
    os.environ.pop("SPECTUNE_DB_URL", None)
    me = psutil.Process()
    reader_rss_start = rss_mb(me)

    from engine.jobs import submit_session
    from engine.settings import SweepSettings
    from store import open_store

    db = home / "spectune.db"
    store = open_store(f"sqlite:///{db}")
    texts = [
        {"text": f"Story {i}: once upon a time, in a village by the sea, there lived"} for i in range(args.prompts)
    ]
    set_id, _, _ = store.add_prompt_set("soak", None, texts)
    settings = SweepSettings(
        target=args.target, drafts=[args.draft], gammas=[args.gamma], max_new_tokens=args.max_new_tokens,
        dtype="float32", device="cpu",
    )  # fmt: skip
    session_id = submit_session(store, settings, set_id, args.prompts, "soak", options={"detect_regime": False})
    reader_rss_ready = rss_mb(me)

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    log_path = home / "worker.out"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "engine", "worker"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    wproc = psutil.Process(worker.pid)
    t_start = time.monotonic()
    per_query: dict[str, list[float]] = {}
    poll_ms: list[float] = []
    worker_rss: list[tuple[float, float]] = []
    worker_rss_decoding: float | None = None
    steps_seen = 0
    status = "queued"
    timed_out = False
    try:
        while True:
            elapsed = time.monotonic() - t_start
            if elapsed > args.timeout_s:
                timed_out = True
                break
            if worker.poll() is not None:
                break
            t0 = time.perf_counter()
            state = live_poll(store, session_id, per_query)
            poll_ms.append((time.perf_counter() - t0) * 1000)
            status, steps_seen = state["status"], state["steps"]
            rss = rss_mb(wproc)
            if rss is not None:
                worker_rss.append((round(elapsed, 1), rss))
                if worker_rss_decoding is None and steps_seen > 0:
                    worker_rss_decoding = rss
            if status in ("done", "failed", "cancelled"):
                break
            time.sleep(max(0.0, args.poll_s - (time.perf_counter() - t0)))
        wall_s = time.monotonic() - t_start
        time.sleep(1.0)  # the worker idles between sessions: its resting RSS with the models still loaded
        worker_rss_end = rss_mb(wproc)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)  # serve() stops at its next poll
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
    store.close()

    fresh = open_store(f"sqlite:///{db}")
    session = fresh.get_session(session_id)
    render_ms, render_per, render_points = render_finished(fresh, session_id)
    runs = fresh.list_runs(session_id)
    steps_total = sum(fresh.run_progress(r["id"])["steps"] for r in runs)
    samples = len(fresh.utilisation_series(session_id, max_points=10**9))
    fresh.close()
    reader_rss_end = rss_mb(me)

    peak = max((r for _, r in worker_rss), default=None)
    slowest = max(((name, max(v)) for name, v in per_query.items()), key=lambda kv: kv[1], default=("-", 0.0))
    result = {
        "what": "soak: one long session through the real worker while a reader polls like the live view",
        "target": args.target,
        "draft": args.draft,
        "gamma": args.gamma,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "status": session["status"],
        "error": session["error"],
        "timed_out": timed_out,
        "runs": [
            {
                "id": r["id"],
                "kind": r["kind"],
                "status": r["status"],
                "steps": r["summary"] and r["summary"].get("steps"),
            }
            for r in runs
        ],
        "steps_logged": steps_total,
        "utilisation_samples": samples,
        "wall_s": round(wall_s, 1),
        "steps_per_s": round(steps_total / wall_s, 1) if wall_s else None,
        "db_mb": round(db.stat().st_size / MB, 2),
        "worker_rss_mb": {
            "decoding_start": worker_rss_decoding,
            "end": worker_rss_end,
            "peak": peak,
            "growth_start_to_end": round(worker_rss_end - worker_rss_decoding, 1)
            if worker_rss_end is not None and worker_rss_decoding is not None
            else None,
            "trace": worker_rss[:: max(1, len(worker_rss) // 40)],
        },
        "reader_rss_mb": {"start": reader_rss_start, "after_imports": reader_rss_ready, "end": reader_rss_end},
        "live_view": {
            "polls": len(poll_ms),
            "poll_ms_max": round(max(poll_ms), 2) if poll_ms else None,
            "poll_ms_p50": round(statistics.median(poll_ms), 2) if poll_ms else None,
            "poll_ms_p95": round(pct(poll_ms, 0.95), 2) if poll_ms else None,
            "query_ms_max": {name: round(max(v), 2) for name, v in sorted(per_query.items())},
            "slowest_query": {"name": slowest[0], "ms": round(slowest[1], 2)},
        },
        "render_after_completion": {
            "total_ms": round(render_ms, 2),
            "per_reader_ms": render_per,
            "points": render_points,
        },
        "worker_log_tail": log_path.read_text(errors="replace").splitlines()[-3:],
        "env": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "worker_threads": args.threads,
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    rows = [
        ("session", f"{result['status']}{' (timed out)' if timed_out else ''}"),
        ("steps logged", f"{steps_total:,} in {wall_s:.1f} s ({result['steps_per_s']} steps/s)"),
        ("runs", ", ".join(f"{r['kind']}:{r['status']}:{r['steps']}" for r in result["runs"])),
        ("utilisation samples", str(samples)),
        ("database", f"{result['db_mb']} MB"),
        ("worker RSS start/end/peak", f"{worker_rss_decoding} / {worker_rss_end} / {peak} MB"),
        ("reader RSS start/end", f"{reader_rss_start} / {reader_rss_end} MB"),
        (
            "live poll max/p95/p50",
            f"{result['live_view']['poll_ms_max']} / {result['live_view']['poll_ms_p95']} / "
            f"{result['live_view']['poll_ms_p50']} ms over {len(poll_ms)} polls",
        ),
        ("slowest live query", f"{slowest[0]} {slowest[1]:.1f} ms"),
        ("render finished session", f"{render_ms:.1f} ms ({render_points} chart points)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"wrote {out}")
    ok = result["status"] == "done" and steps_total >= args.min_steps and not timed_out
    if not ok:
        print(f"SOAK FAILED: status={result['status']} steps={steps_total} (need {args.min_steps})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
