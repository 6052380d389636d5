"""A server's load gauges and emitted-token counter from its /metrics text (parsed by prometheus_client).

The speculation counters are engine.endpoint.metrics' (parsed there once); this module reads what a window needs
beside them: requests running and waiting (gauges, summed over label sets) and the tokens emitted (a counter), under
each engine's own names.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs")
EMITTED = ("vllm:generation_tokens", "llamacpp:tokens_predicted", "sglang:generation_tokens")


@dataclass(frozen=True)
class Load:
    """Requests running and waiting at one moment, and the tokens emitted so far (None: not exposed)."""

    running: float | None = None
    waiting: float | None = None
    emitted: float | None = None


def _add(total: float | None, value: float) -> float:
    return value if total is None else total + value


def parse_load(text: str) -> Load:
    """The load gauges and emitted-token counter of Prometheus exposition text (ValueError if it is not)."""
    running = waiting = emitted = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            base, value = sample.name.removesuffix("_total"), float(sample.value)
            if base in RUNNING:
                running = _add(running, value)
            elif base in WAITING:
                waiting = _add(waiting, value)
            elif base in EMITTED:
                emitted = _add(emitted, value)
    return Load(running, waiting, emitted)
