"""The engine's own /metrics, read directly: one Reading per GET (counters by engine.serving.metrics' parser)."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable

from engine.serving.load import parse_load
from engine.serving.metrics import parse_metrics
from engine.serving.transport import Connection, EndpointError, status_error
from engine.watch.window import Reading


class MetricsSource:
    """A server's /metrics page under `url` (its root, e.g. http://127.0.0.1:8080)."""

    def __init__(
        self, url: str, api_key: str | None = None, timeout_s: float = 5.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.url = url.rstrip("/")
        self.conn = Connection(self.url, api_key, timeout_s)
        self.clock = clock

    @property
    def where(self) -> str:
        return self.conn.url("/metrics")

    def read(self) -> Reading:
        """The server's counters and load now; EndpointError when it cannot be read or is not Prometheus text."""
        status, _, body = self.conn.get("/metrics")
        if status in (404, 501):
            why = "the server exports no metrics (vLLM: on by default; SGLang: --enable-metrics; llama.cpp: --metrics)"
            raise EndpointError("metrics_missing", f"{self.where} answered {status}: {why}", status)
        if status != 200:
            raise status_error(self.where, status, http.client.responses.get(status, ""), body)
        text = body.decode("utf-8", errors="replace")
        counters = parse_metrics(text, where=self.where)
        try:
            load = parse_load(text)
        except (ValueError, TypeError, IndexError) as exc:
            raise EndpointError("metrics_malformed", f"{self.where} is not Prometheus text ({exc})") from exc
        return Reading(self.clock(), counters, load)

    def positions(self) -> int | None:
        """How many draft positions the server counts acceptance at (its γ, as far as it has drafted); None where it
        counts none yet."""
        counted = self.read().counters.accepted_per_position
        return max(counted) + 1 if counted else None

    def close(self) -> None:
        self.conn.close()
