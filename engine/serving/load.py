"""A server's load gauges and token counters from its /metrics text (parsed by prometheus_client), by engine name.

The speculation counters are engine.serving.metrics' (parsed there once); this module reads what a watched window
needs beside them, under each engine's own names:
- requests running and waiting (gauges, summed over label sets);
- the tokens emitted (a counter);
- time per output token as a (seconds, count) pair of cumulative values, differenced over a window: vLLM's and
  SGLang's `request_time_per_output_token_seconds` histograms (their `_sum` and `_count`: the mean over the
  requests that finished), llama.cpp's generation time and predicted tokens (`tokens_predicted_seconds_total`,
  `tokens_predicted_total`: the mean over the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs")
EMITTED = ("vllm:generation_tokens", "llamacpp:tokens_predicted", "sglang:generation_tokens")
# per engine, the (seconds, count) sample names whose differences give the time per output token
TPOT = (
    ("vllm:request_time_per_output_token_seconds_sum", "vllm:request_time_per_output_token_seconds_count"),
    ("sglang:request_time_per_output_token_seconds_sum", "sglang:request_time_per_output_token_seconds_count"),
    ("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),
)


@dataclass(frozen=True)
class Load:
    """Requests running and waiting at one moment, the tokens emitted so far, and the cumulative (seconds, count) of
    the time per output token (None: not exposed)."""

    running: float | None = None
    waiting: float | None = None
    emitted: float | None = None
    tpot_seconds: float | None = None
    tpot_count: float | None = None


def _add(total: float | None, value: float) -> float:
    return value if total is None else total + value


def parse_load(text: str) -> Load:
    """The load gauges and token counters of Prometheus exposition text (ValueError if it is not)."""
    running = waiting = emitted = seconds = count = None
    tpot_seconds = {s for s, _ in TPOT}
    tpot_counts = {c for _, c in TPOT}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            value = float(sample.value)
            if sample.name in tpot_seconds:
                seconds = _add(seconds, value)
            if sample.name in tpot_counts:
                count = _add(count, value)
            base = sample.name.removesuffix("_total")
            if base in RUNNING:
                running = _add(running, value)
            elif base in WAITING:
                waiting = _add(waiting, value)
            elif base in EMITTED:
                emitted = _add(emitted, value)
    return Load(running, waiting, emitted, seconds, count)
