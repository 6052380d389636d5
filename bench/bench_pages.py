"""First paint of every dashboard page in Chromium, against a dashboard with a few stored sessions.

A fresh data directory gets the sessions a user makes from the CLI (tests/test_browser_walk.make_sessions: one in
spectune's PyTorch loop with tiny models, a noisy tiny draft and n-gram, with its batch sweep; one real llama.cpp
session on the bundled smollm2-135m with n-gram; --extra more tiny sessions), then the Streamlit server is started
on it and headless Chromium (Playwright, Debian's /usr/bin/chromium) opens each page. One warm-up visit per page
(Streamlit compiles a page on its first run), then --reps rounds; each round visits every page, the order rotated
by one page per round so no page always comes first or after the same neighbour.

First paint = from page.goto() until the page's main content is rendered: Streamlit's script has finished, the
title is shown, every visible table (data grid) and chart has drawn, and the main text then stays the same for a
second (the time is taken when that final state was first reached, not after the second). Also recorded: the time
until the title appeared. Expanders are left closed (what a user sees first). The machine's load average is read
before and after and the share of the CPUs other processes used meanwhile (psutil), since a busy machine is slower.

    .venv/bin/python bench/bench_pages.py [--reps 3] [--extra 1] [--out bench/results/pages.json]
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import psutil  # noqa: E402
from test_browser_e2e import _free_port, _stop, _wait_healthy  # noqa: E402
from test_browser_walk import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    SETTLED_JS,
    TARGET,
    VIEWPORT,
    _engine,
    _env,
    make_sessions,
)

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "pages.json"
TARGET_S = 2.0
STABLE_S = 1.0


def pages(ids: dict[str, int]) -> list[tuple[str, str]]:
    tiny, llama = ids["tiny"], ids["llamacpp"]
    return [
        ("Home", ""), ("Prompts", "Prompts"), ("Run", f"Run?session={tiny}"), ("Sessions", f"Sessions?session={tiny}"),
        ("Theory", "Theory"), ("Recommend", f"Recommend?session={tiny},{llama}"), ("Endpoints", "Endpoints"),
        ("Policies", f"Policies?session={tiny}"),
    ]  # fmt: skip


def first_paint(page: Any, url: str, timeout_s: float = 90.0) -> dict[str, float]:
    """Navigate and time: title shown, and main content complete (see the module docstring)."""
    t0 = time.perf_counter()
    page.goto(url)
    title_s = None
    ready_at, last = None, None
    deadline = t0 + timeout_s
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        if title_s is None and page.locator("[data-testid=stMain] h1").count():
            title_s = now - t0
        state = page.evaluate(SETTLED_JS)
        text = page.locator("[data-testid=stMain]").inner_text() if not state else None
        if text is not None and text == last:
            if now - ready_at >= STABLE_S:
                return {"first_paint_s": round(ready_at - t0, 3), "title_s": round(title_s or ready_at - t0, 3)}
        elif text is not None:
            ready_at, last = now, text
        else:
            ready_at, last = None, None
        page.wait_for_timeout(40)
    raise RuntimeError(f"{url}: never finished drawing ({state})")


class OtherLoad:
    """The share of all CPUs used by other processes: all CPU time minus ours (this bench, its browser, its server)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = psutil.cpu_times()

    def share(self, mine_s: float) -> float:
        cpu1 = psutil.cpu_times()
        busy = sum(getattr(cpu1, f) - getattr(self.cpu0, f) for f in ("user", "nice", "system", "irq", "softirq"))
        wall = (time.monotonic() - self.t0) * psutil.cpu_count()
        return max(0.0, (busy - mine_s) / wall) if wall > 0 else 0.0


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--extra", type=int, default=1, help="more tiny sessions stored beside the two")
    ap.add_argument("--chromium", default=CHROMIUM)
    ap.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    scratch = Path(tempfile.mkdtemp(prefix="spectune-pages-"))
    home = scratch / "home"
    server = log = None
    try:
        t_sessions = time.monotonic()
        ids = make_sessions(home, scratch / "prompts.txt")
        for i in range(args.extra):
            _engine(home, "submit", "--target", TARGET, "--draft", "ngram", "--gamma", "2", "--prompts",
                    str(scratch / "prompts.txt"), "--max-new-tokens", "16", "--dtype", "float32", "--device", "cpu",
                    "--no-regime", "--name", f"bench extra {i + 1}")  # fmt: skip
        if args.extra:
            _engine(home, "worker", "--once", timeout=600)
        sessions_s = time.monotonic() - t_sessions
        stored = len(json.loads(_engine(home, "sessions", "--json")))
        port = _free_port()
        log = open(scratch / "streamlit.log", "wb")  # noqa: SIM115 - closed in finally
        server = subprocess.Popen(
            [sys.executable, "-m", "app.serve", "--server.port", str(port), "--server.headless",
             "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=ROOT, env=_env(home), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, server, timeout_s=120)
        order = pages(ids)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in order}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(120_000)
            first_visit: dict[str, float] = {}
            for name, path in order:  # warm-up: the first run of each page compiles it (and fills app/memo.py)
                first_visit[name] = first_paint(page, f"{url}/{path}")["first_paint_s"]
            load_before = os.getloadavg()
            mine = [psutil.Process(), psutil.Process(server.pid)]
            other, mine0 = OtherLoad(), cpu_seconds(mine)
            for rep in range(args.reps):
                rotated = order[rep % len(order) :] + order[: rep % len(order)]
                for name, path in rotated:
                    result = first_paint(page, f"{url}/{path}")
                    samples[name].append(result)
                    print(f"round {rep + 1} {name}: {result}", flush=True)
            other_share = other.share(cpu_seconds(mine) - mine0)
            load_after = os.getloadavg()
            browser.close()
        results = []
        for name, path in order:
            paints = [s["first_paint_s"] for s in samples[name]]
            results.append({
                "page": name, "path": "/" + path, "first_paint_s": paints,
                "median_s": round(statistics.median(paints), 2), "max_s": round(max(paints), 2),
                "title_median_s": round(statistics.median(s["title_s"] for s in samples[name]), 2),
                "first_visit_s": round(first_visit[name], 2),
                "within_target": max(paints) <= TARGET_S,
            })  # fmt: skip
        out = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
            "load": {
                "loadavg_1min_before": round(load_before[0], 2),
                "loadavg_1min_after": round(load_after[0], 2),
                "other_processes_cpu_share": round(other_share, 2),
                "note": "share of all CPUs used by processes other than this bench, its Chromium and its Streamlit "
                "server while the rounds ran",
            },  # fmt: skip
            "settings": {
                "reps": args.reps,
                "stored_sessions": stored,
                "viewport": VIEWPORT,
                "target_s": TARGET_S,
                "stable_s": STABLE_S,
                "sessions_made_in_s": round(sessions_s, 1),
            },  # fmt: skip
            "results": results,
        }
        write_output(args.out, json.dumps(out, indent=2) + "\n", "--out")
        print(f"wrote {args.out}")
        print("| page | first visit (compile + compute) | median first paint | max | title shown (median) | ≤ 2 s |")
        print("|---|---|---|---|---|---|")
        for r in results:
            mark = "yes" if r["within_target"] else "no"
            cells = [r["page"], f"{r['first_visit_s']:.2f} s", f"{r['median_s']:.2f} s", f"{r['max_s']:.2f} s",
                     f"{r['title_median_s']:.2f} s", mark]  # fmt: skip
            print("| " + " | ".join(cells) + " |", flush=True)
        return 0
    finally:
        if server is not None:
            _stop(server.pid)
        if log is not None:
            log.close()
        pid_file = home / "worker.pid"
        if pid_file.exists():
            try:
                _stop(int(pid_file.read_text().strip()))
            except ValueError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    run_command(main)
