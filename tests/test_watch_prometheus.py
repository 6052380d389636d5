"""`watch` through a real Prometheus server (Debian's package, 127.0.0.1, 1 s scrapes) of a real llama-server.

The Prometheus source's window matches what the server's own /metrics says; a restarted server gives a "reset"
window; the server stopped gives "source down" (its target is down); Prometheus stopped gives "source down"
(refused); stored windows are kept throughout. Prometheus and llama-server are stopped by the test, and
Prometheus dies with the test process if that dies first.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from watch_parts import complete, ngram_config, ngram_session, running_prometheus, watch_page
from watch_parts import no_server_left_behind as no_server_left_behind  # noqa: F401 - a fixture
from watch_parts import store as store  # noqa: F401 - a fixture

from engine.engines.llamacpp.server import ManagedServer
from engine.service.watch import deployment_for, watch
from engine.serving.metrics import scrape
from engine.serving.transport import Connection
from engine.watch.prometheus import PrometheusSource
from engine.watch.verdict import PAYING
from engine.watch.window import DOWN, OK, RESET
from store import Store


def wait_up(source: PrometheusSource, want: float, timeout_s: float = 30.0) -> None:
    """Until Prometheus has scraped the target (up == want) at least once."""
    deadline = time.monotonic() + timeout_s
    while source.targets_up(time.time()) != want:
        assert time.monotonic() < deadline, f"Prometheus never saw the target with up == {want}"
        time.sleep(0.5)


def test_prometheus_windows_of_a_real_server(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dep = deployment_for(store, ngram_session(store), gamma=4)
    server = ManagedServer(ngram_config())
    try:
        server.start()
        with running_prometheus(server.url.split("//")[1], tmp_path) as prom:
            source = PrometheusSource(prom, 'job="llama"')
            wait_up(source, 1.0)
            # every per-position series exists from here (increase() needs a first value): a request long enough to
            # draft at all four positions, not 8 tokens that may leave a position's first count inside the window
            complete(server.url, tokens=32)
            time.sleep(2.0)
            before = scrape(Connection(server.url))
            began = time.time()
            complete(server.url)
            time.sleep(3.0)  # scraped after the request ended
            direct = scrape(Connection(server.url)).minus(before)
            window = source.window(time.time() - began + 1.0)  # the request, not the first one
            assert window.state == OK, window.message
            assert window.mean_acceptance_length == pytest.approx(direct.mean_acceptance_length(), rel=0.1)
            assert window.draft_acceptance_rate == pytest.approx(direct.draft_acceptance_rate(), rel=0.1)
            assert window.per_position_acceptance == pytest.approx(direct.per_position_acceptance(), abs=0.1)
            assert window.emitted_tokens == pytest.approx(32, rel=0.35)  # increase() extrapolates to the window
            assert window.requests_running is not None
            # PromQL's increase() of llama.cpp's generation seconds over its predicted tokens: a few ms to a second
            assert window.time_per_output_token_s is not None and 0.0 < window.time_per_output_token_s < 5.0
            assert window.engine == "llama.cpp"
            assert source.positions() == 4  # ngram-simple's size-m: the deployed γ, as the servers count it

            def restart() -> None:
                server.stop()
                server.start()  # the same port: Prometheus scrapes counters from zero again
                complete(server.url, tokens=8)
                time.sleep(3.0)

            def stop_server() -> None:
                server.stop()
                time.sleep(3.0)  # a failed scrape: up == 0

            steps = [lambda: time.sleep(0.5), restart, stop_server]
            sleep = lambda _s: steps.pop(0)() if steps else None  # noqa: E731
            judged = list(watch(store, source, dep, "llama", 15.0, 3, sleep=sleep))
        after = list(watch(store, source, dep, "llama", 1.0, 1, sleep=lambda _s: None))  # Prometheus gone
    finally:
        server.stop()
    first, reset, down = judged
    assert first.verdict.verdict == PAYING, first.verdict
    assert reset.window.state == RESET
    assert down.window.state == DOWN and "target is down" in down.window.message
    assert after[0].window.state == DOWN and "refused" in after[0].window.message
    kept = [w["verdict"] for w in store.list_watch_windows("llama")]
    assert kept == [PAYING, RESET, DOWN, DOWN]
    # the page on those windows: the state in the banner with why, the last judged window beside it, every window kept
    at = watch_page(tmp_path, monkeypatch, "llama")
    warned = " ".join(str(w.value) for w in at.warning)
    assert "source down" in warned and "refused" in warned, warned
    assert "paying" in " ".join(str(s.value) for s in at.success)
    assert list(at.dataframe[0].value["verdict"]) == [DOWN, DOWN, RESET, PAYING]
