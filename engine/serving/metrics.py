"""A server's speculation counters from its /metrics page (parsed by prometheus_client, never by hand).

Families read (counters are exposed with a `_total` suffix; `_created` samples are ignored):

- vLLM 0.33 (`vllm/v1/spec_decode/metrics.py`, class SpecDecodingProm; labels model_name, engine):
  `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`,
  `vllm:spec_decode_num_accepted_tokens_per_pos` (label position).
- llama.cpp (llama-server --metrics): the same four names under `llamacpp:`.
- SGLang 0.5.23 (`sglang/srt/observability/metrics_collector.py`): the counter `sglang:spec_verify_calls`
  and the gauges `sglang:spec_accept_length` and `sglang:spec_accept_rate` (over SGLang's last decode-log
  interval, not a counter: read after a level, not differenced).

A counter summed over its label sets (several engines or data-parallel ranks); when samples carry a
`model_name` label and one of them is the model under test, only that model's samples count.
Derived figures are engine.core.counters' (vLLM's SpecDecodingProm conventions, defined there once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from engine.core.counters import SpecCounters, draft_acceptance_rate, mean_acceptance_length, per_position_rates
from engine.serving.transport import Connection, EndpointError

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "llamacpp:spec_decode_num_drafts": "drafts",
    "llamacpp:spec_decode_num_draft_tokens": "draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens": "accepted_tokens",
    "sglang:spec_verify_calls": "verify_calls",
}
PER_POSITION = ("vllm:spec_decode_num_accepted_tokens_per_pos", "llamacpp:spec_decode_num_accepted_tokens_per_pos")
GAUGES = {"sglang:spec_accept_length": "accept_length", "sglang:spec_accept_rate": "accept_rate"}
PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llama.cpp"}
_NOT_PROMETHEUS = ("text/html", "application/json")


@dataclass
class ServerCounters:
    """Cumulative speculation counters at one moment, or the difference of two (`after.minus(before)`)."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    verify_calls: float | None = None
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    accept_length: float | None = None  # SGLang gauge (last interval)
    accept_rate: float | None = None  # SGLang gauge (last interval)
    engines: set[str] = field(default_factory=set)  # metric-name prefixes seen: which engine this is

    def minus(self, before: ServerCounters) -> ServerCounters:
        def diff(a: float | None, b: float | None) -> float | None:
            return None if a is None else a - (b or 0.0)

        positions = set(self.accepted_per_position)
        return ServerCounters(
            drafts=diff(self.drafts, before.drafts),
            draft_tokens=diff(self.draft_tokens, before.draft_tokens),
            accepted_tokens=diff(self.accepted_tokens, before.accepted_tokens),
            verify_calls=diff(self.verify_calls, before.verify_calls),
            accepted_per_position={
                p: self.accepted_per_position[p] - before.accepted_per_position.get(p, 0.0) for p in positions
            },
            accept_length=self.accept_length,
            accept_rate=self.accept_rate,
            engines=set(self.engines),
        )

    def plus(self, other: ServerCounters) -> ServerCounters:
        """Two differences added (two rounds of requests); a gauge keeps the later reading."""

        def add(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        mine, theirs = self.accepted_per_position, other.accepted_per_position
        return ServerCounters(
            drafts=add(self.drafts, other.drafts),
            draft_tokens=add(self.draft_tokens, other.draft_tokens),
            accepted_tokens=add(self.accepted_tokens, other.accepted_tokens),
            verify_calls=add(self.verify_calls, other.verify_calls),
            accepted_per_position={p: mine.get(p, 0.0) + theirs.get(p, 0.0) for p in set(mine) | set(theirs)},
            accept_length=other.accept_length,
            accept_rate=other.accept_rate,
            engines=self.engines | other.engines,
        )

    def as_spec(self, emitted: int) -> SpecCounters:
        """These counters over requests that emitted `emitted` tokens, as the one counters type. A target step of a
        sequence emits its accepted drafts + 1, so its steps are the tokens emitted less the drafts accepted."""
        accepted = self.accepted_tokens or 0.0
        calls = max(emitted - accepted, 1.0 if emitted else 0.0)
        return SpecCounters(
            drafts=self.drafts or 0.0,
            draft_tokens=self.draft_tokens or 0.0,
            accepted_tokens=accepted,
            target_calls=calls,
            emitted=float(emitted),
            accepted_per_position=dict(self.accepted_per_position),
        )

    @property
    def speculates(self) -> bool:
        return any(v is not None for v in (self.drafts, self.draft_tokens, self.accept_length))

    def draft_acceptance_rate(self) -> float | None:
        """engine.core.counters' definition where the server counts draft tokens; SGLang's gauge otherwise."""
        if self.draft_tokens:
            return draft_acceptance_rate(self.draft_tokens, self.accepted_tokens or 0.0)
        return self.accept_rate

    def mean_acceptance_length(self) -> float | None:
        """engine.core.counters' definition where the server counts drafts; SGLang's gauge otherwise."""
        if self.drafts:
            return mean_acceptance_length(self.drafts, self.accepted_tokens or 0.0)
        return self.accept_length

    def per_position_acceptance(self) -> list[float] | None:
        """Conditional acceptance per draft position (None when the server does not count positions)."""
        if not self.accepted_per_position or not self.drafts:
            return None
        return per_position_rates(self.drafts, self.accepted_per_position)

    def source(self) -> str | None:
        """Where the acceptance figures come from: 'counters', 'gauges' (SGLang) or None."""
        if self.drafts or self.draft_tokens:
            return "counters"
        if self.accept_length is not None or self.accept_rate is not None:
            return "gauges"
        return None


def parse_metrics(text: str, model: str = "", where: str = "/metrics") -> ServerCounters:
    """ServerCounters from Prometheus exposition text; EndpointError(kind='metrics_malformed') if it is not."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise EndpointError("metrics_malformed", f"{where} is not Prometheus text ({exc})") from exc
    samples = [s for family in families for s in family.samples if not s.name.endswith("_created")]
    models = {s.labels.get("model_name") for s in samples if "model_name" in s.labels}
    only = model if model and model in models else None
    counters = ServerCounters()
    gauges: dict[str, list[float]] = {}
    for family in families:
        for prefix, engine in PREFIXES.items():
            if family.name.startswith(prefix):
                counters.engines.add(engine)
    for sample in samples:
        if only is not None and sample.labels.get("model_name", only) != only:
            continue
        base = sample.name.removesuffix("_total")
        value = float(sample.value)
        if base in COUNTERS:
            name = COUNTERS[base]
            setattr(counters, name, (getattr(counters, name) or 0.0) + value)
        elif base in PER_POSITION and "position" in sample.labels:
            try:
                position = int(sample.labels["position"])
            except ValueError:
                continue
            counters.accepted_per_position[position] = counters.accepted_per_position.get(position, 0.0) + value
        elif sample.name in GAUGES:
            gauges.setdefault(GAUGES[sample.name], []).append(value)
    for name, values in gauges.items():  # one value per rank: the mean
        setattr(counters, name, sum(values) / len(values))
    return counters


SETTLE_S = 2.0  # how long to wait for a server's counters to stop moving after its last reply


def settled(read: Callable[[], ServerCounters | None], settle_s: float = SETTLE_S) -> ServerCounters | None:
    """/metrics once two reads in a row agree (a server may count a request just after replying), or the last read
    after `settle_s`; None when a read fails (`read` returns None)."""
    last = read()
    deadline = time.monotonic() + settle_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        again = read()
        if again is None or again == last:
            return again
        last = again
    return last


def scrape(conn: Connection, model: str = "", timeout_s: float = 10.0) -> ServerCounters:
    """GET /metrics and parse it; a missing page or one that is not Prometheus text is one EndpointError."""
    url = conn.url("/metrics")
    status, content_type, body = conn.get("/metrics", timeout_s)
    if status in (404, 501):
        raise EndpointError(
            "metrics_missing",
            f"{url} answered {status}: the server exports no metrics (vLLM: on by default; SGLang: "
            "--enable-metrics; llama.cpp: --metrics)",
            status,
        )
    if status in (401, 403):
        raise EndpointError("unauthorized", f"{url} answered {status}: /metrics needs other credentials", status)
    if status != 200:
        raise EndpointError("metrics_missing", f"{url} answered {status}", status)
    if content_type.split(";")[0].strip() in _NOT_PROMETHEUS:
        raise EndpointError("metrics_malformed", f"{url} is not Prometheus text (Content-Type {content_type})")
    return parse_metrics(body.decode("utf-8", errors="replace"), model, url)
