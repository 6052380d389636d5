"""One endpoint driven in rounds: a round is n requests in flight at once (one thread and keep-alive connection
each), with the server's /metrics read before it and, once settled, after it.

The client keeps every round per concurrency level (requests, wall time, summed counter differences) and the
safety rules of a sweep: requests go only to the endpoint's URL; a refused connection, a 401/403 or 404, or a run
of `max_consecutive_errors` failed requests stops the endpoint with one message (`stopped`), and everything
measured until then is kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from engine.engines.endpoint.requests import build_request, send
from engine.engines.endpoint.results import EndpointRun, LevelResult, RequestResult
from engine.engines.endpoint.settings import Endpoint, SweepLimits, api_key
from engine.serving.detect import detect
from engine.serving.metrics import ServerCounters, scrape, settled
from engine.serving.transport import FATAL_KINDS, Connection, EndpointError

POLL_S = 0.25  # how often the cancel callback is asked while a round is in flight


@dataclass
class Round:
    requests: list[RequestResult]
    wall_s: float
    counters: ServerCounters | None  # the /metrics difference over the round; None without metrics

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]


class EndpointClient:
    """One endpoint of a session: connected once, warmed up, then driven round by round."""

    def __init__(self, endpoint: Endpoint, limits: SweepLimits) -> None:
        self.endpoint = endpoint
        self.limits = limits
        self.run = EndpointRun(endpoint, None, endpoint.model)
        self.key: str | None = None
        self.engine = "openai"
        self.metrics_ok = True
        self.stopped: str | None = None
        self.consecutive = 0
        self.levels: dict[int, LevelResult] = {}
        self.wake = threading.Event()  # set to cut a retry's back-off short

    @property
    def label(self) -> str:
        return self.endpoint.label

    def connect(self) -> None:
        """The API key from its variable, the server's engine, version and model; EndpointError/SettingsError."""
        self.key = api_key(self.endpoint.api_key_env)
        conn = Connection(self.endpoint.url, self.key, 10.0)
        try:
            self.run.info = detect(conn, self.endpoint.kind)
        finally:
            conn.close()
        self.engine = self.run.info.engine or "openai"
        self.run.model = self.endpoint.model or self.run.info.model or ""

    def warm_up(self, prompts: Sequence[str]) -> None:
        """`warmup_requests` untimed requests; a fatal failure raises, any other is a warning."""
        conn = Connection(self.endpoint.url, self.key, self.limits.request_timeout_s)
        try:
            for i in range(self.limits.warmup_requests):
                probe = RequestResult(self.label, 0, -1, i, time.time())
                path, body = build_request(
                    self.endpoint, self.engine, self.run.model, prompts[i % len(prompts)], self.limits
                )
                send(conn, path, body, probe, replace(self.limits, max_retries=0), lambda: False, self.wake)
                if probe.error_kind in FATAL_KINDS:
                    raise EndpointError(probe.error_kind, probe.error or "failed")
                if not probe.ok:
                    self.run.warnings.append(f"warm-up request failed: {probe.error}")
        finally:
            conn.close()

    def level(self, concurrency: int) -> LevelResult:
        if concurrency not in self.levels:
            self.levels[concurrency] = LevelResult(self.label, concurrency)
        return self.levels[concurrency]

    def capped(self, concurrency: int) -> str | None:
        """Why this level may send no further round (its request or time cap), or None."""
        level = self.level(concurrency)
        if len(level.requests) + concurrency > self.limits.max_requests:
            return f"reached its cap of {self.limits.max_requests} requests at concurrency {concurrency}"
        if level.wall_s >= self.limits.max_duration_s:
            return f"reached its cap of {self.limits.max_duration_s:g} s at concurrency {concurrency}"
        return None

    def round(
        self, concurrency: int, prompts: Sequence[tuple[int, str]], temperature: float, should_stop: Callable[[], bool]
    ) -> Round:
        """`prompts` (index, text) sent at once; the level keeps the round, the error rules may stop the client."""
        level = self.level(concurrency)
        limits = replace(self.limits, temperature=temperature)
        before = self._scrape()
        first = len(level.requests)
        results = [RequestResult(self.label, concurrency, first + j, i, 0.0) for j, (i, _) in enumerate(prompts)]
        halt = threading.Event()

        def one(j: int) -> None:
            conn = Connection(self.endpoint.url, self.key, limits.request_timeout_s)
            try:
                path, body = build_request(self.endpoint, self.engine, self.run.model, prompts[j][1], limits)
                results[j].started_at = time.time()
                send(conn, path, body, results[j], limits, halt.is_set, halt)
            finally:
                conn.close()

        started = time.perf_counter()
        threads = [
            threading.Thread(target=one, args=(j,), name=f"spectune-load-{concurrency}-{j}", daemon=True)
            for j in range(len(prompts))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(POLL_S)
                if not halt.is_set() and should_stop():
                    halt.set()
        wall_s = time.perf_counter() - started
        counters = self._difference(before)
        level.requests += results
        level.wall_s += wall_s
        level.counters = (counters if level.counters is None else level.counters.plus(counters)) if counters else None
        self._judge(results, level)
        return Round(results, wall_s, counters)

    def _judge(self, results: list[RequestResult], level: LevelResult) -> None:
        """The stop rules: a fatal failure, or `max_consecutive_errors` failed requests in a row."""
        for result in results:
            if result.ok:
                self.consecutive = 0
                continue
            if result.error_kind == "cancelled" or self.stopped:
                continue
            self.consecutive += 1
            fatal = result.error_kind in FATAL_KINDS
            if fatal or self.consecutive >= self.limits.max_consecutive_errors:
                why = "" if fatal else f" after {self.consecutive} failed requests in a row"
                self.stop(f"stopped {self.label} endpoint at concurrency {level.concurrency}{why}: {result.error}")
                level.stopped = self.stopped

    def stop(self, message: str) -> None:
        self.stopped = self.stopped or message
        self.wake.set()

    def _scrape(self) -> ServerCounters | None:
        if not self.metrics_ok:
            return None
        conn = Connection(self.endpoint.url, self.key, 10.0)
        try:
            return scrape(conn, self.run.model)
        except EndpointError as exc:
            self.run.warnings.append(f"{exc}; the sweep goes on without server counters")
            self.metrics_ok = False
            return None
        finally:
            conn.close()

    def _difference(self, before: ServerCounters | None) -> ServerCounters | None:
        """The counters' difference over a round, read once they settle (None without usable metrics)."""
        after = settled(self._scrape) if before is not None else None
        return after.minus(before) if after is not None and before is not None and self.metrics_ok else None

    def measured(self) -> EndpointRun:
        """The endpoint with each level that sent a request, lowest concurrency first."""
        self.run.levels = [self.levels[c] for c in sorted(self.levels) if self.levels[c].requests]
        if not self.metrics_ok:
            for level in self.run.levels:
                level.counters = None
        return self.run
