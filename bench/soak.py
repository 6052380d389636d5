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

With the real dashboard (on by default; --no-dashboard skips it) the Streamlit server (`streamlit run
app/Home.py`, SPECTUNE_HOME = the soak's data directory) is started before the session, and headless
Chromium (Playwright, Debian's /usr/bin/chromium) opens the live view, /Run?session=N, before the worker
claims it. Also reported, under "dashboard" in the JSON:

* the Streamlit server's RSS (with its children) after the first page load, at the first decode step,
  when the session has ended, after the finished pages, and the peak (sampled every --poll-s);
* the live view's update interval: a script in the page reads the progress text and the "Steps logged"
  metric every 100 ms and records each change; the longest and p95 interval between changes from the
  first logged step until the page shows the session done (goal < 2 s), plus the longest silence on the
  page's websocket over the same stretch;
* the time from navigating to /Sessions?session=N until its Vega-Lite charts have drawn (goal < 2 s),
  once more with the server warm, and the same for the finished session's Run page;
* screenshots of the live view mid-session and of the finished Sessions page (bench/results/soak_live.png,
  soak_sessions.png; viewport 1400×1000).

It stops by itself: the session is bounded (prompts × max new tokens), --timeout-s kills the worker if it
ever overruns, every browser wait has a timeout, and the worker, the browser and the Streamlit server
are stopped on the way out. Writes bench/results/soak.json and prints a table; exits 1 when the session
fails, logs too few steps, or misses a dashboard goal.

    .venv/bin/python bench/soak.py [--prompts 40] [--max-new-tokens 400] [--timeout-s 900] [--no-dashboard]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

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
    done, total = session.get("progress_done") or 0, session.get("progress_total") or 0
    if not runs:
        return {"status": session["status"], "steps": 0, "done": done, "total": total}
    current = next((r for r in reversed(runs) if r["status"] == "running"), runs[-1])
    baseline = runs[0]
    progress = timed(per_query, "run_progress", lambda: store.run_progress(current["id"]))
    timed(per_query, "run_progress", lambda: store.run_progress(baseline["id"]))
    timed(per_query, "step_series", lambda: store.step_series(current["id"]))
    if current["kind"] == "speculative":
        timed(per_query, "per_position_acceptance", lambda: store.per_position_acceptance(current["id"]))
    timed(per_query, "utilisation_series", lambda: store.utilisation_series(session_id, max_points=300))
    timed(per_query, "get_outputs", lambda: store.get_outputs(current["id"]))
    return {"status": session["status"], "steps": progress["steps"], "done": done, "total": total}


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


# ---------------------------------------------------------------------------------------------------------------------
# The real dashboard: Streamlit server + headless Chromium on the live view

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1400, "height": 1000}
LIVE_GOAL_S = 2.0
CHARTS_GOAL_MS = 2000
PAGE_TIMEOUT_MS = 120_000

# Runs in the page itself, so the observations do not depend on this (busy, single-threaded) process:
# every 100 ms it reads the live view's progress text and "Steps logged" metric and records each change
# with its wall-clock time; it also wraps WebSocket to record every silence > 200 ms between messages
# from the server (a fragment refresh is a burst of messages).
SAMPLER_JS = r"""
(() => {
  if (window.__soak) return;
  const S = window.__soak = {events: [], silences: [], messages: 0, lastMessage: 0, last: null};
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', () => {
        const t = Date.now();
        if (S.lastMessage && t - S.lastMessage > 200) S.silences.push([S.lastMessage, t]);
        S.lastMessage = t; S.messages++;
      });
    }
  };
  setInterval(() => {
    const main = document.querySelector('[data-testid="stMain"]') || document.body;
    if (!main) return;
    const status = '(queued|running|done|failed|cancelled)';
    const m = new RegExp('Progress: \\d+ / \\d+ prompt decodes \\(\\d+%\\) — ' + status).exec(main.textContent || '');
    let steps = null;
    for (const metric of document.querySelectorAll('[data-testid="stMetric"]')) {
      const label = metric.querySelector('[data-testid="stMetricLabel"]');
      if (label && label.textContent.includes('Steps logged')) {
        const value = metric.querySelector('[data-testid="stMetricValue"]');
        steps = value ? value.textContent.trim() : null;
      }
    }
    const key = (m ? m[0] : '') + '|' + steps;
    if (key !== S.last) { S.last = key; S.events.push([Date.now(), m ? m[0] : null, steps]); }
  }, 100);
})();
"""

# How many Vega-Lite charts have drawn (a canvas or svg with a size); false until at least n have.
CHARTS_DRAWN_JS = r"""
(n) => {
  const drawn = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].filter(c => {
    const g = c.querySelector('canvas, svg.marks');
    return g && g.getBoundingClientRect().width > 0 && g.getBoundingClientRect().height > 0;
  });
  return drawn.length >= n ? drawn.length : false;
}
"""

# Every table (st.dataframe, a canvas grid) has drawn; false until then.
TABLES_DRAWN_JS = r"""
() => {
  const tables = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
  return tables.length > 0 && tables.every(t => t.querySelector('canvas')) ? tables.length : false;
}
"""

SCROLL_TO_HEADING_JS = r"""
(text) => {
  const h = [...document.querySelectorAll('h1, h2, h3, h4')].find(e => e.textContent.includes(text));
  if (h) h.scrollIntoView({block: 'start'});
  return !!h;
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_mb(proc: psutil.Process) -> float | None:
    """RSS of a process and all its children (the Streamlit server and anything it started)."""
    try:
        procs = [proc, *proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            if p is proc:
                return None
    return round(total / MB, 1)


def _stop_process(proc: subprocess.Popen, wait_s: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def change_gaps(events: list[list[Any]], t_from: float, t_to: float) -> list[float]:
    """Seconds between consecutive observed changes inside [t_from, t_to] (epoch ms in the events)."""
    times = [e[0] for e in events if t_from <= e[0] <= t_to]
    return [(b - a) / 1000 for a, b in zip(times, times[1:], strict=False)]


def _steps_value(text: str | None) -> int:
    digits = re.sub(r"[^0-9]", "", text or "")
    return int(digits) if digits else 0


class Dashboard:
    """The Streamlit server on a free port (SPECTUNE_HOME = the soak's data directory) and a headless
    Chromium page on it. Everything it starts is stopped by close()."""

    def __init__(self, home: Path, chromium: str, shots: Path) -> None:
        self.home, self.chromium, self.shots = home, chromium, shots
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "streamlit.out"
        self.server: subprocess.Popen | None = None
        self.sproc: psutil.Process | None = None
        self._pw: Any = None
        self.browser: Any = None
        self.page: Any = None
        self.rss: list[tuple[float, float]] = []
        self.shot_windows: list[tuple[float, float]] = []  # epoch ms: a screenshot can stall the page's timers

    def start_server(self, timeout_s: float = 120.0) -> float:
        env = dict(os.environ, SPECTUNE_HOME=str(self.home), PYTHONUNBUFFERED="1")
        env.pop("SPECTUNE_DB_URL", None)
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "app.serve", "--server.port", str(self.port),
                 "--server.headless", "true", "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.sproc = psutil.Process(self.server.pid)
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"streamlit exited early with code {self.server.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"streamlit did not become healthy within {timeout_s:.0f} s: {self.log_tail()}")

    def open_live_view(self, session_id: int) -> float:
        """Chromium on /Run?session=N; returns seconds until its progress bar was shown."""
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=self.chromium, args=CHROMIUM_ARGS)
        self.page = self.browser.new_page(viewport=VIEWPORT)
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.page.add_init_script(SAMPLER_JS)
        t0 = time.monotonic()
        self.page.goto(f"{self.url}/Run?session={session_id}")
        self.page.get_by_text(re.compile(r"Progress: \d+ / \d+")).first.wait_for()
        took = time.monotonic() - t0
        self.page.evaluate(SCROLL_TO_HEADING_JS, "Live view")
        return took

    def sample(self, elapsed: float) -> float | None:
        rss = tree_rss_mb(self.sproc) if self.sproc is not None else None
        if rss is not None:
            self.rss.append((round(elapsed, 1), rss))
        return rss

    def screenshot(self, name: str, heading: str | None = None) -> str:
        """The viewport (not the full page), scrolled to ``heading``; a failure is reported, not raised."""
        path = self.shots / name
        t0 = time.time() * 1000
        try:
            if heading:
                self.page.evaluate(SCROLL_TO_HEADING_JS, heading)
                self.page.wait_for_timeout(300)
            self.shots.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(path), full_page=False, timeout=30_000)
        except Exception as exc:  # noqa: BLE001
            return f"{name} (failed: {str(exc).splitlines()[0]})"
        finally:
            self.shot_windows.append((t0, time.time() * 1000))
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    def wait_done(self, timeout_s: float = 60.0) -> bool:
        """The live view has redrawn the finished session (its progress text says done)."""
        try:
            self.page.get_by_text(re.compile(r"Progress: \d+ / \d+ prompt decodes \(\d+%\) — done")).first.wait_for(
                timeout=timeout_s * 1000
            )
            return True
        except Exception:  # noqa: BLE001 - reported as not seen
            return False

    def observations(self) -> dict[str, Any]:
        return self.page.evaluate("() => window.__soak || null") or {}

    def time_charts(self, path: str, expected: int, tables: bool = True, timeout_s: float = 60.0) -> dict[str, Any]:
        """Navigate to ``path`` and time until ``expected`` Vega-Lite charts have drawn (and its tables)."""
        t0 = time.monotonic()
        self.page.goto(f"{self.url}{path}", wait_until="commit")
        drawn = self.page.wait_for_function(CHARTS_DRAWN_JS, arg=expected, polling=50, timeout=timeout_s * 1000)
        took = time.monotonic() - t0
        out = {"path": path, "charts_expected": expected, "charts_drawn": drawn.json_value(), "ms": round(took * 1000)}
        if not tables:
            return out
        try:  # and the tables too (not part of the goal; the screenshot waits for them)
            tables = self.page.wait_for_function(TABLES_DRAWN_JS, polling=50, timeout=15_000)
            out |= {"tables_drawn": tables.json_value(), "with_tables_ms": round((time.monotonic() - t0) * 1000)}
        except Exception:  # noqa: BLE001
            out["tables_drawn"] = None
        return out

    def log_tail(self, n: int = 5) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []

    def close(self) -> None:
        for step in (
            lambda: self.browser and self.browser.close(),
            lambda: self._pw and self._pw.stop(),
            lambda: self.server and _stop_process(self.server),
        ):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                print(f"soak: while stopping the dashboard: {exc}", file=sys.stderr)


def _done_value(text: str | None) -> int | None:
    m = re.search(r"Progress: (\d+) /", text or "")
    return int(m.group(1)) if m else None


def store_to_page_lag(events: list[list[Any]], store_trace: list[tuple[float, int, str]]) -> dict[str, Any]:
    """How long the page took to show what the store had, for each new prompt-decode count and for the
    final status: from the last reader poll that had not yet seen it (so the change came after it: an
    upper bound on the lag, off by at most one poll interval) to the page's first change showing it."""
    lags: list[tuple[float, str]] = []
    seen: set[int] = set()
    for i in range(1, len(store_trace)):
        t_prev, done_prev, status_prev = store_trace[i - 1]
        _, done, status = store_trace[i]
        if done > done_prev and done not in seen:
            seen.add(done)
            shown = next((e[0] for e in events if (_done_value(e[1]) or 0) >= done and e[0] >= t_prev), None)
            if shown is not None:
                lags.append(((shown - t_prev) / 1000, f"{done} decodes"))
        if status != status_prev and status in ("done", "failed", "cancelled"):
            shown = next((e[0] for e in events if e[1] and e[1].endswith(f"— {status}") and e[0] >= t_prev), None)
            if shown is not None:
                lags.append(((shown - t_prev) / 1000, f"status {status}"))
    if not lags:
        return {"lag_max_s": None}
    worst = max(lags)
    return {
        "changes": len(lags),
        "lag_max_s": round(worst[0], 2),
        "lag_max_at": worst[1],
        "lag_p95_s": round(pct([lag for lag, _ in lags], 0.95), 2),
        "lag_median_s": round(statistics.median(lag for lag, _ in lags), 2),
    }


def live_latency(
    obs: dict[str, Any],
    t_end_ms: float | None,
    store_trace: list[tuple[float, int, str]] | None = None,
    shot_windows: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The live view's update intervals while the session ran: from the first change showing logged steps
    to the change showing the session done (or t_end_ms when that was never seen); the longest ones with
    what the page showed before and after; and the store-to-page lag."""
    events = obs.get("events") or []
    start = next((e[0] for e in events if _steps_value(e[2]) > 0), None)
    done = next((e[0] for e in events if e[1] and e[1].endswith("— done")), None)
    end = done or t_end_ms
    out: dict[str, Any] = {"changes_observed": len(events), "done_seen": done is not None}
    if start is None or end is None or end <= start:
        return out | {"max_s": None, "p95_s": None, "median_s": None}
    gaps = change_gaps(events, start, end)
    inside = [e for e in events if start <= e[0] <= end]
    shot_windows = shot_windows or []

    def during_shot(a: float, b: float) -> bool:
        return any(a < s1 and b > s0 for s0, s1 in shot_windows)

    clean = [(b[0] - a[0]) / 1000 for a, b in zip(inside, inside[1:], strict=False) if not during_shot(a[0], b[0])]
    if done is None and t_end_ms is not None:  # the stretch after the last change counts too
        last = max(e[0] for e in events if e[0] <= end)
        gaps.append((end - last) / 1000)
    silences = [(b - a) / 1000 for a, b in obs.get("silences") or [] if a >= start and b <= end]
    longest = sorted(
        (
            {
                "at_s": round((a[0] - start) / 1000, 1),
                "gap_s": round((b[0] - a[0]) / 1000, 2),
                "before": f"{a[1]} | steps {a[2]}",
                "after": f"{b[1]} | steps {b[2]}",
                "during_screenshot": during_shot(a[0], b[0]),
            }
            for a, b in zip(inside, inside[1:], strict=False)
        ),
        key=lambda g: -g["gap_s"],
    )[:3]
    return out | {
        "window_s": round((end - start) / 1000, 1),
        "changes_in_window": len(gaps) + 1,
        "max_s": round(max(gaps), 2) if gaps else None,
        "p95_s": round(pct(gaps, 0.95), 2) if gaps else None,
        "median_s": round(statistics.median(gaps), 2) if gaps else None,
        "ws_messages": obs.get("messages"),
        "max_s_outside_screenshots": round(max(clean), 2) if clean else None,
        "screenshots_at_s": [round((s0 - start) / 1000, 1) for s0, _ in shot_windows if start <= s0 <= end],
        "ws_max_silence_s": round(max(silences), 2) if silences else 0.0,
        "longest_gaps": longest,
        "store_to_page": store_to_page_lag(events, store_trace or []),
    }


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
    ap.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    ap.add_argument(
        "--no-dashboard", dest="dashboard", action="store_false",
        help="skip the real dashboard (Streamlit server + headless Chromium on the live view)",
    )  # fmt: skip
    ap.add_argument("--chromium", default=CHROMIUM, help="the Chromium that Playwright drives")
    ap.add_argument("--shots", default=str(DEFAULT_OUT.parent), help="folder for soak_live.png, soak_sessions.png")
    args = ap.parse_args(argv)
    if args.dashboard:
        if importlib.util.find_spec("playwright") is None:  # imported only once the dashboard starts
            ap.error("the dashboard mode needs playwright (pip install playwright), or pass --no-dashboard")
        if not Path(args.chromium).exists():
            ap.error(f"no Chromium at {args.chromium} (make browser, or --chromium PATH), or pass --no-dashboard")

    home = Path(args.home or tempfile.mkdtemp(prefix="spectune-soak-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ["SPECTUNE_HOME"] = str(home)
    os.environ.pop("SPECTUNE_DB_URL", None)
    me = psutil.Process()
    reader_rss_start = rss_mb(me)

    from engine.service.jobs import submit_session
    from engine.session.spec import SessionSpec
    from store import open_store

    db = home / "spectune.db"
    store = open_store(f"sqlite:///{db}")
    categories = ["story", "fable", "legend", "myth"]  # so the Sessions page also draws its by-category chart
    texts = [
        {"text": f"Story {i}: once upon a time, in a village by the sea, there lived", "category": categories[i % 4]}
        for i in range(args.prompts)
    ]
    set_id, _, _ = store.add_prompt_set("soak", None, texts)
    settings = SessionSpec(
        target=args.target, drafts=[args.draft], gammas=[args.gamma], max_new_tokens=args.max_new_tokens,
        dtype="float32", device="cpu",
    )  # fmt: skip
    session_id = submit_session(store, settings, set_id, args.prompts, "soak", options={"detect_regime": False})
    reader_rss_ready = rss_mb(me)

    dash = Dashboard(home, args.chromium, Path(args.shots)) if args.dashboard else None
    try:
        return _soak(args, home, db, store, me, session_id, reader_rss_start, reader_rss_ready, dash)
    finally:
        if dash is not None:
            dash.close()


def _soak(
    args: argparse.Namespace, home: Path, db: Path, store: Any, me: psutil.Process, session_id: int,
    reader_rss_start: float | None, reader_rss_ready: float | None, dash: Dashboard | None,
) -> int:  # fmt: skip
    from store import open_store

    dash_info: dict[str, Any] = {}
    streamlit_rss_start = streamlit_rss_decoding = None
    shots: list[str] = []
    if dash is not None:
        # the server is up before the session starts, the live view is open on it before the worker claims it
        dash_info["server_ready_s"] = round(dash.start_server(), 1)
        dash_info["first_page_load_s"] = round(dash.open_live_view(session_id), 1)
        dash.page.wait_for_timeout(2000)  # the queued session's live fragment has refreshed a couple of times
        streamlit_rss_start = dash.sample(0.0)

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
    store_trace: list[tuple[float, int, str]] = []  # (epoch ms before the poll, prompt decodes done, status)
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
            t0_ms = time.time() * 1000
            state = live_poll(store, session_id, per_query)
            poll_ms.append((time.perf_counter() - t0) * 1000)
            status, steps_seen = state["status"], state["steps"]
            store_trace.append((t0_ms, state["done"], status))
            rss = rss_mb(wproc)
            if rss is not None:
                worker_rss.append((round(elapsed, 1), rss))
                if worker_rss_decoding is None and steps_seen > 0:
                    worker_rss_decoding = rss
            if dash is not None:
                srss = dash.sample(elapsed)
                if streamlit_rss_decoding is None and steps_seen > 0:
                    streamlit_rss_decoding = srss
                if not shots and status == "running" and state["total"] and state["done"] >= 0.6 * state["total"]:
                    shots.append(dash.screenshot("soak_live.png", "Live view"))  # the speculative run, mid-way
            if status in ("done", "failed", "cancelled"):
                break
            time.sleep(max(0.0, args.poll_s - (time.perf_counter() - t0)))
        wall_s = time.monotonic() - t_start
        t_end_ms = time.time() * 1000  # when the store said the session ended (the live view's window closes)
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
    reader_rss_end = rss_mb(me)
    expected_sessions, expected_run = expected_charts(fresh, session_id)  # imports pandas: after the RSS
    fresh.close()

    checks: list[str] = []
    if dash is not None:
        dash_info.update(
            dashboard_after(dash, session_id, t_end_ms, store_trace, expected_sessions, expected_run, shots, wall_s)
        )
        dash_info["streamlit_rss_mb"] = {
            "start_after_first_page_load": streamlit_rss_start,
            "decoding_start": streamlit_rss_decoding,
            **dash_info.pop("_rss_after"),
            "peak": max((r for _, r in dash.rss), default=None),
            "trace": dash.rss[:: max(1, len(dash.rss) // 40)],
        }
        end = dash_info["streamlit_rss_mb"]["end"]
        dash_info["streamlit_rss_mb"]["growth_start_to_end"] = (
            round(end - streamlit_rss_start, 1) if end is not None and streamlit_rss_start is not None else None
        )
        dash_info["streamlit_log_tail"] = dash.log_tail()
        live = dash_info["live_view"]
        if live.get("max_s") is None or live["max_s"] >= LIVE_GOAL_S:
            checks.append(f"live view max interval between updates {live.get('max_s')} s (goal < {LIVE_GOAL_S} s)")
        sessions_ms = (dash_info.get("sessions_page") or {}).get("ms")
        if sessions_ms is None or sessions_ms >= CHARTS_GOAL_MS:
            checks.append(f"Sessions page charts {sessions_ms} ms (goal < {CHARTS_GOAL_MS} ms)")

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
        "reader_rss_mb": {
            "start": reader_rss_start,
            "after_imports": reader_rss_ready,
            "end": reader_rss_end,
            **({"note": "with the dashboard this process also runs the Playwright client"} if dash else {}),
        },
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
        "dashboard": dash_info or None,
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
    write_output(out, json.dumps(result, indent=2) + "\n", "--out")

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
    if dash is not None:
        srss, live = dash_info["streamlit_rss_mb"], dash_info["live_view"]
        sp, again, runp = (
            dash_info.get(k) or {} for k in ("sessions_page", "sessions_page_again", "run_page_finished")
        )
        rows += [
            (
                "streamlit RSS start/end/peak",
                f"{srss['start_after_first_page_load']} / {srss['end']} / {srss['peak']} MB "
                f"(at the first step {srss['decoding_start']}, after the pages {srss['after_pages']})",
            ),
            ("worker RSS start/end", f"{worker_rss_decoding} / {worker_rss_end} MB"),
            (
                "live view update max/p95/median",
                f"{live.get('max_s')} / {live.get('p95_s')} / {live.get('median_s')} s over "
                f"{live.get('changes_in_window')} changes in {live.get('window_s')} s "
                f"(websocket max silence {live.get('ws_max_silence_s')} s)",
            ),
            (
                "longest live-view gap",
                "; ".join(
                    f"{g['gap_s']} s at +{g['at_s']} s{' (screenshot)' if g['during_screenshot'] else ''}: "
                    f"{g['before']} -> {g['after']}"
                    for g in live.get("longest_gaps", [])[:1]
                )
                or "-",
            ),
            (
                "store -> page lag max/p95/median",
                f"{live.get('store_to_page', {}).get('lag_max_s')} / {live.get('store_to_page', {}).get('lag_p95_s')}"
                f" / {live.get('store_to_page', {}).get('lag_median_s')} s "
                f"(worst at {live.get('store_to_page', {}).get('lag_max_at')}; an upper bound)",
            ),
            (
                "Sessions page charts",
                f"{sp.get('ms')} ms ({sp.get('charts_drawn')}/{sp.get('charts_expected')} charts; with its tables "
                f"{sp.get('with_tables_ms')} ms); again {again.get('ms')} ms",
            ),
            (
                "Run page charts, finished",
                f"{runp.get('ms')} ms ({runp.get('charts_drawn')}/{runp.get('charts_expected')} charts)",
            ),
            ("screenshots", ", ".join(dash_info.get("screenshots") or []) or "-"),
        ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"wrote {out}")
    ok = result["status"] == "done" and steps_total >= args.min_steps and not timed_out
    if not ok:
        print(f"SOAK FAILED: status={result['status']} steps={steps_total} (need {args.min_steps})", file=sys.stderr)
    for check in checks:
        print(f"SOAK FAILED: {check}", file=sys.stderr)
    return 0 if ok and not checks else 1


def expected_charts(store: Any, session_id: int) -> tuple[int, int]:
    """How many Vega-Lite charts the Sessions page and the finished Run page draw for this session
    (the same conditions as app/pages/3_Sessions.py and 2_Run.py)."""
    from app import data as app_data

    session = store.get_session(session_id)
    runs = store.list_runs(session_id)
    sessions = 0 if app_data.speedup_long(runs).empty else 1
    prompts = store.get_prompts(session["prompt_set_id"], limit=session["n_prompts"])
    if any(p.get("category") for p in prompts):
        cats = app_data.category_frame(runs, {r["id"]: store.get_outputs(r["id"]) for r in runs}, prompts)
        if not cats.empty and not cats.dropna(subset=["speedup"]).empty:
            sessions += 1
    last = runs[-1] if runs else None
    run_page = int(bool(last and last["kind"] == "speculative" and store.per_position_acceptance(last["id"])))
    run_page += int(bool(store.utilisation_series(session_id, max_points=300)))
    return sessions, run_page


def dashboard_after(
    dash: Dashboard, session_id: int, t_end_ms: float, store_trace: list[tuple[float, int, str]],
    expected_sessions: int, expected_run: int, shots: list[str], wall_s: float,
) -> dict[str, Any]:  # fmt: skip
    """The live view's record of the session, then the finished session's pages, timed."""
    info: dict[str, Any] = {}
    info["live_view_done_seen"] = dash.wait_done(60)
    dash.page.wait_for_timeout(1000)
    rss_end = dash.sample(wall_s + 1)
    obs = dash.observations()
    info["live_view"] = live_latency(obs, t_end_ms, store_trace, dash.shot_windows) | {"goal_s": LIVE_GOAL_S}
    if not shots:  # a session too short to catch mid-way: the finished live view instead
        shots.append(dash.screenshot("soak_live.png", "Live view"))
    for key, path, expected in (
        ("sessions_page", f"/Sessions?session={session_id}", expected_sessions),
        ("sessions_page_again", f"/Sessions?session={session_id}", expected_sessions),
        ("run_page_finished", f"/Run?session={session_id}", expected_run),
    ):
        try:
            info[key] = dash.time_charts(path, expected, tables=key.startswith("sessions"))
        except Exception as exc:  # noqa: BLE001 - recorded; the soak then fails its check
            info[key] = {"path": path, "charts_expected": expected, "ms": None, "error": str(exc).splitlines()[0]}
        if key == "sessions_page":
            info[key]["goal_ms"] = CHARTS_GOAL_MS
            shots.append(dash.screenshot("soak_sessions.png", f"#{session_id} "))
    info["_rss_after"] = {"end": rss_end, "after_pages": dash.sample(wall_s + 2)}
    info["screenshots"] = shots
    return info


if __name__ == "__main__":
    run_command(main)
