"""The load generator: replay prompts through an endpoint's streaming API at each concurrency level.

At level c, c threads (each with its own keep-alive connection) take the next request until the level's
request cap or time cap is reached; each request streams (SSE) and is timed on arrival of every chunk:
time to first token, the gaps between chunks (inter-token latency; a chunk can carry several tokens, which
usage stats then count), output tokens, tokens/s, and the server's own per-request speculation figures
when it sends them (llama.cpp `timings.draft_n`/`draft_n_accepted`; SGLang `sglext.spec_tokens_details`).
Before and after every level /metrics is scraped and the difference kept.

Safety: requests go only to the endpoint's URL; concurrency, requests, durations and retries are capped
(engine.endpoint.settings). 429 and 503 are retried with back-off (Retry-After honoured, at most 5 s);
a refused connection, a 401/403 or 404, or a run of `max_consecutive_errors` failures stops the sweep with
one message, and everything measured until then is kept.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.endpoint.detect import ServerInfo, detect
from engine.endpoint.metrics import ServerCounters, scrape
from engine.endpoint.settings import Endpoint, SweepLimits, api_key
from engine.endpoint.transport import FATAL_KINDS, RETRY_KINDS, Connection, EndpointError

MAX_BACKOFF_S = 5.0
SETTLE_S = 2.0  # how long to wait for a server's counters to stop moving after a level
POLL_S = 0.25  # how often the cancel callback is asked


@dataclass
class RequestResult:
    """One request as sent and measured (one row of the store's endpoint_requests table)."""

    endpoint: str
    concurrency: int
    request_index: int
    prompt_index: int
    started_at: float  # unix seconds
    ok: bool = False
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    output_tokens: int = 0
    duration_s: float = 0.0
    tokens_per_s: float | None = None  # output tokens ÷ the request's whole duration
    tpot_s: float | None = None  # (last token − first token) ÷ (output tokens − 1)
    finish_reason: str | None = None
    error_kind: str | None = None
    error: str | None = None
    http_status: int | None = None
    retries: int = 0
    draft_n: int | None = None  # draft tokens proposed for this request (server-reported)
    draft_n_accepted: int | None = None
    verify_calls: int | None = None  # SGLang spec_verify_ct

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LevelResult:
    endpoint: str
    concurrency: int
    requests: list[RequestResult]
    wall_s: float
    counters: ServerCounters | None  # the /metrics difference over the level; None without metrics
    stopped: str | None = None  # why the level (and the sweep) stopped early


@dataclass
class EndpointRun:
    endpoint: Endpoint
    info: ServerInfo | None
    model: str
    levels: list[LevelResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class SweepResult:
    runs: list[EndpointRun]
    stopped: str | None = None  # the one message that stopped the sweep
    cancelled: bool = False


def build_request(endpoint: Endpoint, engine: str, model: str, prompt: str, limits: SweepLimits) -> tuple[str, dict]:
    """(path, JSON body) of one streamed request in the endpoint's API, with the engine's optional extras."""
    stream_options: dict[str, Any] = {"include_usage": True}
    body: dict[str, Any] = {"max_tokens": limits.max_new_tokens, "temperature": limits.temperature, "stream": True}
    if model:
        body["model"] = model
    if engine in ("vllm", "sglang"):
        stream_options["continuous_usage_stats"] = True  # a chunk's token count, for multi-token chunks
    if engine == "sglang":
        body["return_spec_tokens_details"] = True  # per-request acceptance in the last chunk's sglext
    if limits.ignore_eos and engine in ("vllm", "sglang", "llama.cpp"):
        body["ignore_eos"] = True
    body["stream_options"] = stream_options
    if endpoint.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt
    return "/v1/completions", body


def _chunk_text(event: dict[str, Any]) -> tuple[str, str | None]:
    """(text, finish_reason) of an event's first choice, for completions and chat alike."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", None
    choice = choices[0]
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), dict):
        delta = choice["delta"]
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return (text if isinstance(text, str) else ""), choice.get("finish_reason")


def _spec_details(event: dict[str, Any]) -> dict[str, Any] | None:
    ext = event.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, list):
        details = details[0] if details else None
    return details if isinstance(details, dict) else None


def measure_stream(conn: Connection, path: str, body: dict, result: RequestResult, timeout_s: float,
                   stop: Callable[[], bool] | None = None) -> None:  # fmt: skip
    """Stream one request into `result` (timings, tokens, server figures); EndpointError on failure."""
    start = time.perf_counter()
    times: list[float] = []  # arrival of every chunk carrying text
    usage_tokens: int | None = None  # the server's count (the last usage seen; cumulative with continuous stats)
    for t, event in conn.stream(path, body, timeout_s, stop):
        text, finish = _chunk_text(event)
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            usage_tokens = usage["completion_tokens"]
        if text:
            times.append(t)
        if finish:
            result.finish_reason = str(finish)
        timings = event.get("timings")
        if isinstance(timings, dict) and "draft_n" in timings:
            result.draft_n = int(timings.get("draft_n") or 0)
            result.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)
        details = _spec_details(event)
        if details is not None:
            result.draft_n = int(details.get("spec_num_proposed_drafts") or 0)
            result.draft_n_accepted = int(details.get("spec_num_correct_drafts") or 0)
            result.verify_calls = int(details.get("spec_verify_ct") or 0)
    end = time.perf_counter()
    if stop is not None and stop() and result.finish_reason is None:
        raise EndpointError("cancelled", "cancelled while streaming")
    if not times:
        raise EndpointError("empty", f"{conn.url(path)} streamed no text (finish reason {result.finish_reason})")
    result.output_tokens = usage_tokens if usage_tokens is not None else len(times)
    result.ttft_s = times[0] - start
    result.itl_s = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    result.duration_s = end - start
    result.tokens_per_s = result.output_tokens / result.duration_s if result.duration_s > 0 else None
    if result.output_tokens > 1:
        result.tpot_s = (times[-1] - times[0]) / (result.output_tokens - 1)
    result.ok = True


class Sweep:
    """Drive one or more endpoints (the one under test, then an optional baseline) level by level.

    `on_request(result)` is called in the calling thread for every finished request (the store writer);
    `should_stop()` is polled every POLL_S (a cancel): in-flight requests end, and the sweep returns.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        limits: SweepLimits,
        prompts: Sequence[str],
        on_request: Callable[[RequestResult], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        on_level: Callable[[LevelResult], None] | None = None,
        on_phase: Callable[[str, int, int], None] | None = None,
    ) -> None:
        if not prompts:
            raise EndpointError("settings", "no prompts to send")
        self.endpoints = list(endpoints)
        self.limits = limits
        self.prompts = list(prompts)
        self.on_request = on_request
        self.should_stop = should_stop
        self.on_level = on_level
        self.on_phase = on_phase
        self._stop = threading.Event()
        self._cancelled = False
        self._last_poll = 0.0

    # -- control ------------------------------------------------------------------------------------------------

    def _poll(self) -> bool:
        now = time.monotonic()
        if self.should_stop is not None and now - self._last_poll >= POLL_S:
            self._last_poll = now
            if self.should_stop():
                self._cancelled = True
                self._stop.set()
        return self._stop.is_set()

    # -- the sweep ----------------------------------------------------------------------------------------------

    def run(self) -> SweepResult:
        result = SweepResult(runs=[])
        states: list[tuple[EndpointRun, str | None, bool]] = []  # (run, key, metrics usable)
        for endpoint in self.endpoints:
            run = EndpointRun(endpoint, None, endpoint.model)
            result.runs.append(run)
            try:
                key = api_key(endpoint.api_key_env)
                conn = Connection(endpoint.url, key, 10.0)
                try:
                    run.info = detect(conn, endpoint.kind)
                finally:
                    conn.close()
                run.model = endpoint.model or run.info.model or ""
                self._warmup(run, key)
            except EndpointError as exc:
                result.stopped = f"{endpoint.label} endpoint: {exc}"
                return result
            except Exception as exc:  # SettingsError for a missing key variable
                result.stopped = f"{endpoint.label} endpoint: {exc}"
                return result
            states.append((run, key, True))
        total = len(self.limits.concurrency) * len(states)
        done = 0
        for level in self.limits.concurrency:
            for i, (run, key, metrics_ok) in enumerate(states):
                if self._poll():
                    result.cancelled = self._cancelled
                    return result
                if self.on_phase is not None:
                    self.on_phase(f"{run.endpoint.label} endpoint at concurrency {level}", done, total)
                outcome, metrics_ok = self._level(run, key, level, metrics_ok)
                states[i] = (run, key, metrics_ok)
                run.levels.append(outcome)
                done += 1
                if self.on_level is not None:
                    self.on_level(outcome)
                if outcome.stopped:
                    result.stopped = outcome.stopped
                    result.cancelled = self._cancelled
                    return result
        result.cancelled = self._cancelled
        return result

    def _warmup(self, run: EndpointRun, key: str | None) -> None:
        engine = run.info.engine if run.info else "openai"
        conn = Connection(run.endpoint.url, key, self.limits.request_timeout_s)
        try:
            for i in range(self.limits.warmup_requests):
                path, body = build_request(run.endpoint, engine, run.model, self.prompts[i % len(self.prompts)],
                                           self.limits)  # fmt: skip
                probe = RequestResult(run.endpoint.label, 0, -1, i, time.time())
                try:
                    measure_stream(conn, path, body, probe, self.limits.request_timeout_s, self._stop.is_set)
                except EndpointError as exc:
                    if exc.kind in FATAL_KINDS:
                        raise
                    run.warnings.append(f"warm-up request failed: {exc}")
        finally:
            conn.close()

    def _scrape(self, run: EndpointRun, key: str | None) -> ServerCounters:
        conn = Connection(run.endpoint.url, key, 10.0)
        try:
            return scrape(conn, run.model)
        finally:
            conn.close()

    def _settled(self, run: EndpointRun, key: str | None) -> ServerCounters:
        """/metrics after a level, once two reads agree (a server may count a request just after replying)."""
        last = self._scrape(run, key)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            again = self._scrape(run, key)
            if again == last:
                return again
            last = again
        return last

    def _level(self, run: EndpointRun, key: str | None, level: int, metrics_ok: bool) -> tuple[LevelResult, bool]:
        before = None
        if metrics_ok:
            try:
                before = self._scrape(run, key)
            except EndpointError as exc:
                run.warnings.append(f"{exc}; the sweep goes on without server counters")
                metrics_ok = False
        requests, wall_s, stopped = self._drive(run, key, level)
        counters = None
        if before is not None:
            try:
                counters = self._settled(run, key).minus(before)
            except EndpointError as exc:
                run.warnings.append(f"after concurrency {level}: {exc}")
        return LevelResult(run.endpoint.label, level, requests, wall_s, counters, stopped), metrics_ok

    def _drive(self, run: EndpointRun, key: str | None, level: int) -> tuple[list[RequestResult], float, str | None]:
        limits = self.limits
        engine = run.info.engine if run.info else "openai"
        indices = itertools.count()
        finished: queue.Queue[RequestResult] = queue.Queue()
        lock = threading.Lock()
        state: dict[str, Any] = {"consecutive": 0, "stopped": None}
        start = time.monotonic()
        deadline = start + limits.max_duration_s
        level_stop = threading.Event()

        def stopping() -> bool:
            return level_stop.is_set() or self._stop.is_set()

        def worker() -> None:
            conn = Connection(run.endpoint.url, key, limits.request_timeout_s)
            try:
                while not stopping():
                    with lock:
                        index = next(indices)
                    if index >= limits.max_requests or time.monotonic() >= deadline:
                        return
                    prompt_index = index % len(self.prompts)
                    result = self._one(conn, run, engine, level, index, prompt_index, stopping)
                    with lock:
                        if result.ok:
                            state["consecutive"] = 0
                        elif result.error_kind != "cancelled":
                            state["consecutive"] += 1
                            fatal = result.error_kind in FATAL_KINDS
                            run_of_errors = state["consecutive"] >= limits.max_consecutive_errors
                            if (fatal or run_of_errors) and not state["stopped"]:
                                why = "" if fatal else f" after {state['consecutive']} failed requests in a row"
                                state["stopped"] = (
                                    f"stopped {run.endpoint.label} endpoint at concurrency {level}{why}: {result.error}"
                                )
                                level_stop.set()
                    finished.put(result)
            finally:
                conn.close()

        threads = [
            threading.Thread(target=worker, name=f"spectune-load-{level}-{i}", daemon=True) for i in range(level)
        ]
        for thread in threads:
            thread.start()
        requests: list[RequestResult] = []
        while True:
            alive = any(t.is_alive() for t in threads)
            try:
                result = finished.get(timeout=0.05)
            except queue.Empty:
                if not alive:
                    break
                self._poll()
                continue
            requests.append(result)
            if self.on_request is not None:
                self.on_request(result)
            self._poll()
        for thread in threads:
            thread.join()
        while not finished.empty():  # pragma: no cover - every result was drained above
            requests.append(finished.get())
        wall_s = time.monotonic() - start
        requests.sort(key=lambda r: r.request_index)
        return requests, wall_s, state["stopped"]

    def _one(self, conn: Connection, run: EndpointRun, engine: str, level: int, index: int, prompt_index: int,
             stopping: Callable[[], bool]) -> RequestResult:  # fmt: skip
        limits = self.limits
        path, body = build_request(run.endpoint, engine, run.model, self.prompts[prompt_index], limits)
        result = RequestResult(run.endpoint.label, level, index, prompt_index, time.time())
        for attempt in range(limits.max_retries + 1):
            try:
                measure_stream(conn, path, body, result, limits.request_timeout_s, stopping)
                return result
            except EndpointError as exc:
                result.error_kind, result.error, result.http_status = exc.kind, str(exc), exc.status
                if exc.kind in RETRY_KINDS and attempt < limits.max_retries and not stopping():
                    wait = exc.retry_after_s if exc.retry_after_s is not None else 0.5 * 2**attempt
                    result.retries += 1
                    self._stop.wait(min(max(wait, 0.0), MAX_BACKOFF_S))
                    result.error_kind = result.error = result.http_status = None
                    continue
                if exc.kind in RETRY_KINDS and result.retries:
                    result.error = f"{exc} (after {result.retries} retries)"
                return result
            except Exception as exc:  # a bug in the stream handling must not kill the thread silently
                result.error_kind, result.error = "internal", f"{type(exc).__name__}: {exc}"
                return result
        return result
