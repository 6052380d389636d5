"""watch's verdicts as Prometheus metrics: served over HTTP by prometheus-client and read back by its parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from engine.watch.exporter import Exporter
from engine.watch.verdict import COSTING, PAYING, Verdict
from engine.watch.window import DOWN, Window


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip


def test_the_latest_verdict_per_deployment_served_over_http() -> None:
    exporter = Exporter()
    ok = Window(0.0, 15.0, mean_acceptance_length=3.2, requests_running=2.0)
    exporter.update("llama", ok, Verdict(PAYING, 1.42))
    exporter.update("vllm", ok, Verdict(COSTING, 0.81))
    port = exporter.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            got = samples(reply.read().decode())
    finally:
        exporter.close()
    assert got[("spectune_predicted_speedup", (("deployment", "llama"),))] == 1.42
    assert got[("spectune_predicted_speedup", (("deployment", "vllm"),))] == 0.81
    assert got[("spectune_verdict", (("deployment", "llama"), ("verdict", PAYING)))] == 1.0
    assert got[("spectune_verdict", (("deployment", "llama"), ("verdict", COSTING)))] == 0.0
    assert got[("spectune_verdict", (("deployment", "vllm"), ("verdict", COSTING)))] == 1.0
    assert got[("spectune_mean_acceptance_length", (("deployment", "llama"),))] == 3.2
    assert got[("spectune_windows_total", (("deployment", "llama"), ("verdict", PAYING)))] == 1.0


def test_a_window_without_figures_drops_the_stale_gauges() -> None:
    exporter = Exporter()
    exporter.update("llama", Window(0.0, 15.0, mean_acceptance_length=3.2), Verdict(PAYING, 1.42))
    exporter.update("llama", Window(15.0, 30.0, DOWN, "refused"), Verdict(DOWN))
    got = samples(exporter.text())
    assert ("spectune_predicted_speedup", (("deployment", "llama"),)) not in got
    assert got[("spectune_verdict", (("deployment", "llama"), ("verdict", DOWN)))] == 1.0
    assert got[("spectune_verdict", (("deployment", "llama"), ("verdict", PAYING)))] == 0.0
