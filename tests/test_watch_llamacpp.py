"""`watch` against a real llama-server (smallest bundled GGUF, n-gram speculation, --metrics) on 127.0.0.1.

The windows come from the server's own /metrics: a window with requests has plausible acceptance and a verdict
from the stored session; the server asked as if it were Prometheus gives "malformed"; a restarted server gives a
"reset" window; a stopped one "source down", and the stored windows are kept. The watch loop's sleep is where the
test drives the server (a request, a restart, a stop), so each window holds exactly what the test did. Every test
checks that no llama-server it started is left running.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from watch_parts import (
    DRAFT,
    KNEE_AT_16,
    REPETITIVE,
    SHIFTED,
    PacedLoad,
    complete,
    draft_config,
    ngram_config,
    ngram_session,
    scrambled_draft,
    watch_page,
)
from watch_parts import no_server_left_behind as no_server_left_behind  # noqa: F401 - a fixture
from watch_parts import store as store  # noqa: F401 - a fixture

from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND
from engine.engines.llamacpp.server import ManagedServer
from engine.service.watch import deployed_gamma, deployment_for, watch
from engine.watch.prometheus import PrometheusSource
from engine.watch.scrape import MetricsSource
from engine.watch.verdict import BELOW, COLLAPSED, COSTING, DRIFTED, PAYING, VERDICTS
from engine.watch.watcher import metrics_windows, prometheus_windows
from engine.watch.window import DOWN, MALFORMED, OK, RESET
from store import Store, open_store

ROOT = Path(__file__).resolve().parents[1]


def driven(steps: list[Callable[[], object]]) -> Callable[[float], None]:
    """A sleep for the watch loop that runs the next step instead of waiting (polls=1: one call per window)."""
    queue = list(steps)
    return lambda _seconds: queue.pop(0)() if queue else None


def test_windows_from_a_real_server_then_a_restart_and_a_stop(store: Store) -> None:
    sid = ngram_session(store)
    dep = deployment_for(store, sid, gamma=4)
    assert dep.measurement.name == DRAFT and dep.alpha_band == (0.3, 0.99)
    server = ManagedServer(ngram_config())
    try:
        server.start()
        source = MetricsSource(server.url)

        def restart() -> None:
            server.stop()
            server.start()  # the same port: the same URL, counters from zero
            complete(server.url, tokens=8)

        sleep = driven([lambda: complete(server.url), restart, server.stop])
        (not_prometheus,) = prometheus_windows(PrometheusSource(server.url), 1.0, 1, sleep=lambda _s: None)
        windows = list(metrics_windows(source, 5.0, 3, polls=1, sleep=sleep))
    finally:
        server.stop()
    first, second, third = windows
    assert not_prometheus.state == MALFORMED and "no Prometheus query API" in not_prometheus.message
    assert first.state == OK, first.message
    assert first.num_drafts and first.num_drafts > 0 and first.emitted_tokens == 32
    assert 1.5 < first.mean_acceptance_length <= 5.0  # the repeated sentence: most drafts accepted, γ 4 at most
    assert 0.3 < first.draft_acceptance_rate <= 1.0
    assert first.time_per_output_token_s is not None and 0.0 < first.time_per_output_token_s < 5.0, first
    assert first.per_position_acceptance and all(0 <= r <= 1 for r in first.per_position_acceptance)
    assert first.requests_running is not None
    assert second.state == RESET and "went down" in second.message
    assert third.state == DOWN and server.url.split("//")[1] in third.message


def test_judged_windows_are_stored_and_kept_when_the_server_stops(store: Store) -> None:
    sid = ngram_session(store)
    dep = deployment_for(store, sid, gamma=4)
    server = ManagedServer(ngram_config())
    try:
        server.start()
        sleep = driven([lambda: complete(server.url), server.stop])
        judged = list(watch(store, MetricsSource(server.url), dep, "llama", 5.0, 2, polls=1, sleep=sleep))
    finally:
        server.stop()
    paying, down = judged
    assert paying.verdict.verdict == PAYING and paying.verdict.predicted_speedup > 1.0, paying.verdict
    assert paying.verdict.verdict in VERDICTS and paying.verdict.batch == 1
    assert down.verdict.verdict == DOWN
    kept = store.list_watch_windows("llama")
    assert [w["verdict"] for w in kept] == [PAYING, DOWN]
    assert kept[0]["figures"]["mean_acceptance_length"] == pytest.approx(paying.window.mean_acceptance_length)
    assert kept[0]["figures"]["predicted_speedup"] == pytest.approx(paying.verdict.predicted_speedup)


def test_traffic_that_shifts_moves_the_verdict_from_paying_to_drifted(store: Store) -> None:
    # the session measured the repeated sentence (α 0.95–0.99); then the traffic varies and n-gram drafts miss
    dep = deployment_for(store, ngram_session(store, alphas=(0.95, 0.99)), gamma=4)
    server = ManagedServer(ngram_config())
    try:
        server.start()
        sleep = driven([lambda: complete(server.url, tokens=48), lambda: complete(server.url, SHIFTED, tokens=48)])
        judged = list(watch(store, MetricsSource(server.url), dep, "shift", 5.0, 2, polls=1, sleep=sleep))
    finally:
        server.stop()
    before, after = judged
    assert before.verdict.verdict == PAYING, before.verdict
    assert after.verdict.verdict == DRIFTED and after.verdict.alpha < 0.9, after.verdict
    assert after.window.num_drafts and after.window.mean_acceptance_length < before.window.mean_acceptance_length


def test_a_costly_verify_is_costing_you_on_the_third_window_and_the_watch_page_says_so(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a session whose 5-token verify cost 4.5 steps: judge_regime reads that v(k) as compute-bound, where the gain is
    # 1 ÷ the operations multiplier, below 1× for any n-gram traffic short of perfect; the third window says so
    steep = {"1": 1.0, "2": 1.9, "4": 3.6, "5": 4.5}
    dep = deployment_for(store, ngram_session(store, verify=steep), gamma=4)
    server = ManagedServer(ngram_config())
    try:
        server.start()
        assert deployed_gamma(MetricsSource(server.url)) == (None, "the server counts no draft position yet")
        varied = lambda: complete(server.url, SHIFTED)  # noqa: E731
        judged = list(watch(store, MetricsSource(server.url), dep, "steep", 5.0, 3, polls=1,
                            sleep=driven([varied, varied, varied])))  # fmt: skip
        # the deployed γ, as the server says it: ngram-simple drafts size-m = 4 tokens, counted at 4 positions
        assert deployed_gamma(MetricsSource(server.url))[0] == 4
    finally:
        server.stop()
    verdicts = [j.verdict.verdict for j in judged]
    assert verdicts == [BELOW, BELOW, COSTING], [j.verdict for j in judged]
    assert all(j.verdict.regime == COMPUTE_BOUND and j.verdict.predicted_speedup < 1.0 for j in judged)
    assert "off" in judged[2].verdict.action and "2 of 3" in judged[1].verdict.why
    assert [w["verdict"] for w in store.list_watch_windows("steep")] == verdicts
    page_shows(tmp_path, monkeypatch, "steep", judged)


def test_a_draft_that_accepts_nothing_is_acceptance_collapsed_and_offers_speculation_off(
    store: Store, tmp_path: Path
) -> None:
    """llama-server drafting with a draft whose token embeddings are shuffled: it proposes at every step and the
    target accepts next to nothing, so the window is "acceptance collapsed" and offers llama-server's flags with
    speculation off."""
    from engine.service.watch import record
    from engine.service.watch_actions import action_file

    dep = deployment_for(store, ngram_session(store, draft="smollm2-135m"), gamma=4)
    server = ManagedServer(draft_config(scrambled_draft(tmp_path)))
    try:
        server.start()
        (judged,) = list(watch(store, MetricsSource(server.url), dep, "scrambled", 5.0, 1, polls=1,
                               sleep=driven([lambda: complete(server.url, SHIFTED, tokens=48)])))  # fmt: skip
    finally:
        server.stop()
    window = judged.window
    assert window.num_drafts and window.num_drafts >= 10 and window.engine == "llama.cpp", window
    assert window.mean_acceptance_length is not None and window.mean_acceptance_length <= 1.05, window
    assert judged.verdict.verdict == COLLAPSED and "off" in judged.verdict.action
    offered = action_file(store, COLLAPSED, record(window, judged.verdict, dep))
    assert offered is not None and offered.fmt == "llamacpp" and "acceptance collapsed" in offered.text
    assert not [line for line in offered.text.splitlines() if line.strip() and not line.startswith("#")]


def test_concurrency_climbing_from_1_to_8_turns_paying_into_costing_you(store: Store) -> None:
    """One request in flight on repeated text, then eight on fresh text: the session's batch sweep has its knee at 16
    token rows, so a γ-4 verify (5 rows a request) is memory-bound alone and compute-bound from 4 requests on, where
    every rejected draft token is billed. The first window pays; once the load climbs, the verdict is "costing you"
    within four windows (the windows between may say the traffic drifted), at the batch the server reported.

    The windows follow the load, not the clock (PacedLoad): each of the first window's reads waits for 2 more
    requests of one in flight, each later read for 8 more of eight in flight, so what each window holds is the
    same however busy the machine is. The server runs one thread: llama.cpp's threads spin at a barrier after every
    step, and two of them on two busy cores wait there for whichever one the scheduler took away."""
    sid = ngram_session(store)
    store.set_regime(sid, KNEE_AT_16)
    dep = deployment_for(store, sid, gamma=4)
    server = ManagedServer(replace(ngram_config(), parallel=8, ctx_size=4096, threads=1))
    polls = 3
    try:
        server.start()
        with PacedLoad(server.url, [(1, REPETITIVE, 2), (8, SHIFTED, 8)], polls) as load:
            judged = list(watch(store, MetricsSource(server.url), dep, "climb", 6.0, 5, polls=polls,
                                sleep=load.sleep))  # fmt: skip
    finally:
        server.stop()
    verdicts = [j.verdict.verdict for j in judged]
    assert load.finished[0] >= 2 * polls and load.finished[1] >= 8 * polls * 4, load.finished
    assert verdicts[0] == PAYING and judged[0].verdict.regime == MEMORY_BOUND, judged[0]
    costing = verdicts.index(COSTING) if COSTING in verdicts else None
    assert costing is not None and costing <= 4, [(j.verdict.verdict, j.verdict.batch, j.verdict.why) for j in judged]
    assert judged[costing].verdict.batch >= 4 and judged[costing].verdict.regime == COMPUTE_BOUND


def page_shows(home: Path, monkeypatch: pytest.MonkeyPatch, deployment: str, judged: list) -> None:
    """The Watch page on the store the watch wrote: the latest verdict with what to do, its figures, the timeline
    and every window, newest first."""
    at = watch_page(home, monkeypatch, deployment)
    latest = judged[-1].verdict
    banner = " ".join(str(e.value) for e in at.error)
    assert "costing you" in banner and "turn speculation off" in banner and f"{latest.predicted_speedup:.2f}" in banner
    shown = {m.label: m.value for m in at.metric}
    assert shown["Predicted speedup"] == f"{latest.predicted_speedup:.2f}×"
    assert shown["Mean acceptance length"] == f"{judged[-1].window.mean_acceptance_length:.2f}"
    table = at.dataframe[0].value
    assert list(table["verdict"]) == [j.verdict.verdict for j in reversed(judged)]
    assert len(at.get("vega_lite_chart")) == 1
    assert "below 1× 2, costing you 1" in " ".join(str(c.value) for c in at.caption)
    # what to do, as a file: no γ pays at this verify cost, so llama-server's flags turn speculation off and say why
    assert "What to do" in [s.value for s in at.subheader]
    offered = " ".join(str(c.value) for c in at.code)
    assert "spectune watch: costing you" in offered and "--spec-type" not in offered.replace("/ --spec-type", "")
    assert "this file: speculation off" in " ".join(str(m.value) for m in at.markdown)


def test_the_cli_watches_a_server_killed_mid_watch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'spectune.db'}"
    with open_store(url) as s:
        sid = ngram_session(s)
    server = ManagedServer(ngram_config())
    proc = None
    try:
        server.start()
        env = {"SPECTUNE_DB_URL": url, "SPECTUNE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        cmd = [sys.executable, "-m", "engine", "watch", "--metrics-url", server.url, "--session", str(sid),
               "--gamma", "4", "--window", "3s", "--windows", "6", "--deployment", "llama",
               "--serve-metrics", "0"]  # fmt: skip
        err_path = tmp_path / "watch.err"
        with err_path.open("w") as err_file:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err_file, text=True)
        assert proc.stdout is not None

        def traffic() -> None:
            complete(server.url, tokens=16)
            time.sleep(4.0)  # a window's reads see the finished request's counters before the server goes
            server.stop()

        driver = threading.Thread(target=traffic)
        lines: list[str] = []
        served = ""
        for line in proc.stdout:  # two header lines, then one a window; the traffic starts after the headers
            lines.append(line.rstrip("\n"))
            if len(lines) == 2:
                driver.start()
            if "mean acceptance length" in line and not served:  # the verdict as the exporter serves it
                with urllib.request.urlopen(lines[1].split(" on ")[1], timeout=5) as reply:
                    served = reply.read().decode()
        proc.wait(timeout=60)
        if driver.ident is not None:
            driver.join(timeout=120)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
    out = "\n".join(lines) + "\n" + err_path.read_text()
    assert proc.returncode == 0 and len(lines) == 8, out
    assert lines[0].startswith("watching llama: ngram:3-4 at γ=4"), out
    assert lines[1].startswith("serving verdicts on http://127.0.0.1:"), out
    assert any("mean acceptance length" in line for line in lines[2:]), out
    assert 'spectune_predicted_speedup{deployment="llama"}' in served, served
    assert "source down" in lines[-1], out
    with open_store(url) as s:
        assert len(s.list_watch_windows("llama")) == 6
