"""What does `watch` cost? The CPU share of a `python -m engine watch` process at a 15 s window, per source.

Starts a llama-server on the smallest bundled GGUF (n-gram speculation, --metrics), a stored session in a temporary
SQLite file, and (for the Prometheus source, where `prometheus` is installed) a Prometheus server scraping it every
second; drives the server with a request every few seconds from this process; runs `python -m engine watch` as a
child for --windows windows and reads the child's CPU time (psutil) from its first window line to its last, so the
interpreter's start-up is left out. Everything it starts is stopped at the end. The goal: at most 2 % of a core.
Writes the numbers to bench/results/watch.json.

    .venv/bin/python bench/bench_watch.py [--window 15] [--windows 4] [--source metrics|prometheus|both]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from watch_parts import complete, ngram_config, ngram_session, running_prometheus  # noqa: E402

from engine.engines.llamacpp.server import ManagedServer  # noqa: E402
from engine.service.outputs import output_file, run_command, write_output  # noqa: E402
from store import open_store  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "watch.json"
GOAL_PCT = 2.0


def measure(args: list[str], db_url: str, home: Path, window: float, windows: int) -> dict[str, Any]:
    """Run `python -m engine watch ARGS` and return its CPU share between its first and last window lines."""
    env = {**os.environ, "SPECTUNE_DB_URL": db_url, "SPECTUNE_HOME": str(home)}
    cmd = [sys.executable, "-m", "engine", "watch", *args, "--window", f"{window:g}s", "--windows", str(windows)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    child = psutil.Process(proc.pid)
    marks: list[tuple[float, float]] = []
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line[:2].isdigit():  # a window line ("HH:MM:SS ...")
                try:
                    cpu = child.cpu_times()
                except psutil.NoSuchProcess:  # the last window printed, the process already gone
                    break
                marks.append((time.monotonic(), cpu.user + cpu.system))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if len(marks) < 2:
        return {"error": "fewer than two windows", "lines": lines}
    (t0, c0), (t1, c1) = marks[0], marks[-2] if len(marks) > 2 else marks[-1]
    pct = 100.0 * (c1 - c0) / (t1 - t0)
    return {"cpu_pct_of_a_core": round(pct, 3), "seconds": round(t1 - t0, 1), "cpu_s": round(c1 - c0, 4),
            "windows": len(marks), "goal_pct": GOAL_PCT, "meets_goal": pct <= GOAL_PCT, "lines": lines}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--source", choices=("metrics", "prometheus", "both"), default="both")
    parser.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    args = parser.parse_args()
    out = Path(args.out)
    result: dict[str, Any] = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
                              "cpus": os.cpu_count(), "window_s": args.window, "windows": args.windows}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="spectune-bench-watch-") as tmp:
        folder = Path(tmp)
        db_url = f"sqlite:///{folder / 'spectune.db'}"
        with open_store(db_url) as store:
            sid = ngram_session(store)
        server = ManagedServer(ngram_config())
        stop = threading.Event()

        def traffic() -> None:
            while not stop.wait(3.0):
                try:
                    complete(server.url, tokens=16)
                except OSError:
                    pass

        driver = threading.Thread(target=traffic, daemon=True)
        try:
            server.start()
            driver.start()
            common = ["--session", str(sid), "--gamma", "4"]
            if args.source in ("metrics", "both"):
                got = measure(["--metrics-url", server.url, *common], db_url, folder, args.window, args.windows + 1)
                result["metrics"] = got
                print(f"/metrics source: {got.get('cpu_pct_of_a_core')} % of a core", flush=True)
            if args.source in ("prometheus", "both"):
                with running_prometheus(server.url.split("//")[1], folder) as prom:
                    got = measure(["--prometheus", prom, "--match", 'job="llama"', *common], db_url, folder,
                                  args.window, args.windows + 1)  # fmt: skip
                result["prometheus"] = got
                print(f"Prometheus source: {got.get('cpu_pct_of_a_core')} % of a core", flush=True)
        finally:
            stop.set()
            server.stop()
            driver.join(timeout=30)
    write_output(out, json.dumps(result, indent=2) + "\n", "--out")
    return 0


if __name__ == "__main__":
    run_command(main)
