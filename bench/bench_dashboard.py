"""Dashboard overhead: the Streamlit server's CPU share while one browser tab watches a live session.

For each variant, side by side on the same machine: a fresh data directory, a long session queued (tiny
model, so the worker logs steps continuously), the Streamlit server started on it, headless Chromium
(Playwright, as in bench/soak.py) on the live view /Run?session=N, then the worker. Once steps are being
logged, the server's CPU time (with its children) is read over --window-s seconds: CPU seconds ÷ wall
seconds = the share of one core. The page's own script (bench/soak.py's sampler) records every change of
the progress text and the "Steps logged" metric, so a variant cannot look cheap by not updating.

Variants:
* ``old``: the app as committed (``git archive HEAD app``): a fragment that re-reads and redraws everything every
  second, where HEAD's live view still does;
* ``old-nogc``: the same old page with Streamlit's full gc.collect() after every script run turned off
  (``--runner.postScriptGC false``), to show how much of the difference that one setting is;
* ``new``: the working tree's app/ (its Run page turns that collection off itself, and re-reads only what
  changed).

Then the session is cancelled and everything started here is stopped. Writes bench/results/dashboard.json.

    .venv/bin/python bench/bench_dashboard.py [--variants old,old-nogc,new] [--window-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import psutil  # noqa: E402
from soak import CHROMIUM, CHROMIUM_ARGS, SAMPLER_JS, VIEWPORT, _free_port, _stop_process  # noqa: E402

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "dashboard.json"


def app_root(variant: str, scratch: Path) -> Path:
    """The directory holding the app/ package the server runs: the project, or HEAD's app/ (git archive)."""
    if variant == "new":
        return ROOT
    root = scratch / "old_tree"
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "HEAD", "app"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and its live children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total


def measure(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    from engine.service.jobs import submit_session
    from engine.session.spec import SessionSpec
    from store import open_store

    scratch = Path(tempfile.mkdtemp(prefix=f"spectune-dash-{variant}-"))
    home = scratch / "home"
    home.mkdir()
    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    texts = [{"text": f"Story {i}: once upon a time, by the sea, there lived", "category": ["a", "b"][i % 2]}
             for i in range(args.prompts)]  # fmt: skip
    set_id, _, _ = store.add_prompt_set("bench", None, texts)
    spec = SessionSpec(target=args.target, drafts=[args.draft], gammas=[2], max_new_tokens=args.max_new_tokens,
                       dtype="float32", device="cpu", measure_verify_cost=False, detect_regime=False)  # fmt: skip
    session_id = submit_session(store, spec, set_id, args.prompts, f"dashboard bench ({variant})")

    root = app_root(variant, scratch)
    extra = ["--runner.postScriptGC", "false"] if variant == "old-nogc" else []
    port = _free_port()
    env = dict(os.environ, SPECTUNE_HOME=str(home), PYTHONUNBUFFERED="1", PYTHONPATH=str(root))
    env.pop("SPECTUNE_DB_URL", None)
    server_log = open(scratch / "streamlit.out", "wb")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen(
        [sys.executable, *(args.server_wrapper or ["-m", "streamlit"]), "run", str(root / "app" / "Home.py"),
         "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none", *extra],
        cwd=root, env=env, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    worker = None
    pw = browser = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("streamlit did not start")
            time.sleep(0.5)
        sproc = psutil.Process(server.pid)
        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(120_000)
        page.add_init_script(SAMPLER_JS)
        page.goto(f"http://127.0.0.1:{port}/Run?session={session_id}")
        page.get_by_text("Progress:").first.wait_for()

        wenv = dict(os.environ, SPECTUNE_HOME=str(home), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        wenv.pop("SPECTUNE_DB_URL", None)
        worker = subprocess.Popen(
            [sys.executable, "-m", "engine", "worker"], cwd=ROOT, env=wenv, stdin=subprocess.DEVNULL,
            stdout=open(scratch / "worker.out", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while store.live_version(session_id)["steps"] < 50:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the session never started logging steps")
            time.sleep(0.5)
        time.sleep(args.settle_s)  # the page has redrawn with the running session's charts
        steps0 = store.live_version(session_id)["steps"]
        t0_ms = time.time() * 1000
        c0, w0 = cpu_seconds(sproc), time.monotonic()
        time.sleep(args.window_s)
        c1, w1 = cpu_seconds(sproc), time.monotonic()
        t1_ms = time.time() * 1000
        state = store.live_version(session_id)
        obs = page.evaluate("() => window.__soak || null") or {}
        events = [e for e in obs.get("events") or [] if t0_ms <= e[0] <= t1_ms]
        gaps = [(b[0] - a[0]) / 1000 for a, b in zip(events, events[1:], strict=False)]
        if os.environ.get("BENCH_DEBUG"):
            print([(round((e[0] - t0_ms) / 1000, 1), e[2]) for e in events])
        return {
            "variant": variant,
            "server_cpu_pct_of_one_core": round(100 * (c1 - c0) / (w1 - w0), 1),
            "window_s": round(w1 - w0, 1),
            "session_status_at_end": state["status"],
            "steps_logged_in_window": state["steps"] - steps0,
            "page_changes_in_window": len(events),
            "page_change_gap_median_s": round(statistics.median(gaps), 2) if gaps else None,
            "page_change_gap_max_s": round(max(gaps), 2) if gaps else None,
            "page_changes_span_s": round((events[-1][0] - events[0][0]) / 1000, 1) if events else None,
        }
    finally:
        store.request_cancel(session_id)
        for stop in (
            lambda: browser and browser.close(),
            lambda: pw and pw.stop(),
            lambda: worker and _stop_process(worker),
            lambda: _stop_process(server),
        ):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                print(f"bench_dashboard: while stopping: {exc}", file=sys.stderr)
        server_log.close()
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="old,old-nogc,new")
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--target", default="tiny:1:48:1:32")
    ap.add_argument("--draft", default="tiny:1:48:1:32~0.15")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--chromium", default=CHROMIUM)
    ap.add_argument(
        "--server-wrapper",
        nargs="*",
        default=None,
        help="run the server as `python WRAPPER... run app/Home.py` (e.g. a profiling wrapper)",
    )
    ap.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    args = ap.parse_args(argv)
    results = []
    for variant in args.variants.split(","):
        result = measure(variant.strip(), args)
        print(json.dumps(result), flush=True)
        results.append(result)
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{psutil.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the end",
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "chromium")},
        "results": results,
    }
    by = {r["variant"]: r["server_cpu_pct_of_one_core"] for r in results}
    if "old" in by and "new" in by and by["new"]:
        out["old_over_new"] = round(by["old"] / by["new"], 1)
    write_output(args.out, json.dumps(out, indent=2) + "\n", "--out")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_command(main)
