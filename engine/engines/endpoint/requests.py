"""One streamed request to an endpoint, timed on arrival of every chunk, and retried where retrying can help.

Each request streams (SSE) and is timed per chunk: time to first token, the gaps between chunks (inter-token
latency; a chunk can carry several tokens, which usage stats then count), output tokens, tokens/s, and the
server's own per-request speculation figures when it sends them (llama.cpp `timings.draft_n`/`draft_n_accepted`;
SGLang `sglext.spec_tokens_details`). 429 and 503 are retried with back-off (Retry-After honoured, at most 5 s).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.engines.endpoint.results import RequestResult
from engine.engines.endpoint.settings import Endpoint, SweepLimits
from engine.serving.transport import RETRY_KINDS, Connection, EndpointError

MAX_BACKOFF_S = 5.0


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


def _server_figures(event: dict[str, Any], result: RequestResult) -> None:
    """The per-request speculation figures a llama.cpp or SGLang response carries."""
    timings = event.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        result.draft_n = int(timings.get("draft_n") or 0)
        result.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)
    details = _spec_details(event)
    if details is not None:
        result.draft_n = int(details.get("spec_num_proposed_drafts") or 0)
        result.draft_n_accepted = int(details.get("spec_num_correct_drafts") or 0)
        result.verify_calls = int(details.get("spec_verify_ct") or 0)


def measure_stream(
    conn: Connection,
    path: str,
    body: dict,
    result: RequestResult,
    timeout_s: float,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Stream one request into `result` (timings, tokens, text, server figures); EndpointError on failure."""
    start = time.perf_counter()
    times: list[float] = []  # arrival of every chunk carrying text
    pieces: list[str] = []
    usage_tokens: int | None = None  # the server's count (the last usage seen; cumulative with continuous stats)
    for t, event in conn.stream(path, body, timeout_s, stop):
        text, finish = _chunk_text(event)
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            usage_tokens = usage["completion_tokens"]
        if text:
            times.append(t)
            pieces.append(text)
        if finish:
            result.finish_reason = str(finish)
        _server_figures(event, result)
    end = time.perf_counter()
    if stop is not None and stop() and result.finish_reason is None:
        raise EndpointError("cancelled", "cancelled while streaming")
    if not times:
        raise EndpointError("empty", f"{conn.url(path)} streamed no text (finish reason {result.finish_reason})")
    result.text = "".join(pieces)
    result.output_tokens = usage_tokens if usage_tokens is not None else len(times)
    result.ttft_s = times[0] - start
    result.itl_s = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    result.duration_s = end - start
    result.tokens_per_s = result.output_tokens / result.duration_s if result.duration_s > 0 else None
    if result.output_tokens > 1:
        result.tpot_s = (times[-1] - times[0]) / (result.output_tokens - 1)
    result.ok = True


def send(
    conn: Connection,
    path: str,
    body: dict,
    result: RequestResult,
    limits: SweepLimits,
    stopping: Callable[[], bool],
    wait: threading.Event,
) -> RequestResult:
    """One request into `result`, retried on 429/503 (`wait` is set to cut a back-off short); never raises."""
    for attempt in range(limits.max_retries + 1):
        try:
            measure_stream(conn, path, body, result, limits.request_timeout_s, stopping)
            return result
        except EndpointError as exc:
            result.error_kind, result.error, result.http_status = exc.kind, str(exc), exc.status
            if exc.kind in RETRY_KINDS and attempt < limits.max_retries and not stopping():
                backoff = exc.retry_after_s if exc.retry_after_s is not None else 0.5 * 2**attempt
                result.retries += 1
                wait.wait(min(max(backoff, 0.0), MAX_BACKOFF_S))
                result.error_kind = result.error = result.http_status = None
                continue
            if exc.kind in RETRY_KINDS and result.retries:
                result.error = f"{exc} (after {result.retries} retries)"
            return result
        except Exception as exc:  # a bug in the stream handling must not kill the thread silently
            result.error_kind, result.error = "internal", f"{type(exc).__name__}: {exc}"
            return result
    return result
