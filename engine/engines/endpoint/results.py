"""What an endpoint sweep measured, as plain data: every request, each (endpoint, concurrency) level, each endpoint.

The report (engine.engines.endpoint.report) and the store read these; the endpoint engine
(engine.engines.endpoint.runner) fills them as the one sweep driver hands it rounds of requests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engine.engines.endpoint.settings import Endpoint
from engine.serving.detect import ServerInfo
from engine.serving.metrics import ServerCounters


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
    text: str = field(default="", repr=False)  # what it streamed (kept with the run's outputs, not in the row)

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "text"}


@dataclass
class LevelResult:
    """One endpoint at one concurrency: its requests, their rounds' wall time and the server counters' difference."""

    endpoint: str
    concurrency: int
    requests: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0
    counters: ServerCounters | None = None  # summed over its rounds; None without metrics
    stopped: str | None = None  # why the endpoint stopped during this level


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
