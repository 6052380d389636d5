"""watch's own verdicts as Prometheus metrics (prometheus-client), so a team's Alertmanager can page on them.

Per deployment: `spectune_predicted_speedup` (the predicted gain of the deployed configuration at the observed
acceptance and load; absent while a window has none), `spectune_verdict{verdict=…}` (1 for the latest window's
verdict or state, 0 for the others), `spectune_mean_acceptance_length`, `spectune_requests_running` and
`spectune_windows_total{verdict=…}`.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from engine.watch.verdict import VERDICTS, Verdict
from engine.watch.window import OK, STATES, Window

ALL = tuple(dict.fromkeys((*VERDICTS, *(s for s in STATES if s != OK))))  # what spectune_verdict's label can be


class Exporter:
    """The metrics of the windows seen so far, in a registry of their own; `serve` puts them on /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["deployment"]
        self.speedup = Gauge(
            "spectune_predicted_speedup",
            "Predicted speedup of the deployed speculation vs none.",
            labels,
            registry=self.registry,
        )
        self.verdict = Gauge(
            "spectune_verdict",
            "1 for the latest window's verdict or state, 0 for the others.",
            [*labels, "verdict"],
            registry=self.registry,
        )
        self.mal = Gauge(
            "spectune_mean_acceptance_length",
            "Mean acceptance length in the latest window.",
            labels,
            registry=self.registry,
        )
        self.running = Gauge(
            "spectune_requests_running", "Requests running in the latest window (mean).", labels, registry=self.registry
        )
        self.windows = Counter(
            "spectune_windows", "Windows judged, by verdict or state.", [*labels, "verdict"], registry=self.registry
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def update(self, deployment: str, window: Window, verdict: Verdict) -> None:
        """Show this window as the latest of `deployment`."""
        for name in ALL:
            self.verdict.labels(deployment, name).set(1.0 if name == verdict.verdict else 0.0)
        self.windows.labels(deployment, verdict.verdict).inc()
        for gauge, value in (
            (self.speedup, verdict.predicted_speedup),
            (self.mal, window.mean_acceptance_length),
            (self.running, window.requests_running),
        ):
            if value is None:
                gauge.remove(deployment)  # no figure this window: the series goes, not a stale value
            else:
                gauge.labels(deployment).set(float(value))

    def text(self) -> str:
        """The exposition text a scrape gets."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on host:port (0: a free port) in a daemon thread; returns the port."""
        self._server, self._thread = start_http_server(port, host, self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving (if serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
