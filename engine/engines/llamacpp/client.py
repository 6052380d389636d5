"""A small HTTP client for llama-server's native endpoints: chat template, completion, metrics, props.

Only the standard library: a request goes to the one URL we were given, with a timeout, and every
failure (refused, timed out, not JSON, an error reply) becomes one ServerError line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from engine.core.counters import SpecCounters
from engine.core.records import PromptOutput, StepRecord
from engine.engines.llamacpp.server import ServerError

SPEC_COUNTERS = {  # llama-server /metrics names (counters, exposed with _total) → our names
    "llamacpp:spec_decode_num_drafts": "drafts",
    "llamacpp:spec_decode_num_draft_tokens": "draft_tokens",
    "llamacpp:spec_decode_num_accepted_tokens": "accepted_tokens",
    "llamacpp:n_decode": "target_calls",
    "llamacpp:tokens_predicted": "emitted",
}
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class Completion:
    """One /completion reply: the tokens, the server's own timings and, if asked, top log-probs."""

    text: str
    token_ids: list[int]
    predicted_n: int
    predicted_ms: float
    prompt_n: int
    prompt_ms: float
    draft_n: int
    draft_n_accepted: int
    stop_type: str
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per output token: (id, logprob)

    def step_record(self, index: int, draft_ms: float, forwards: int, calls: int) -> StepRecord:
        """The request as one step record of prompt `index`, covering all its `calls` target calls; the draft's
        share of its time is `draft_ms` where the server logged it."""
        return StepRecord(
            prompt_index=index,
            step_index=0,
            gamma=self.draft_n,
            accepted=self.draft_n_accepted,
            accept_mask=[],
            beta=[],
            draft_time_s=draft_ms / 1000.0,
            verify_time_s=(self.predicted_ms - draft_ms) / 1000.0,
            draft_forwards=forwards,
            emitted=self.predicted_n,
            target_calls=calls,
        )

    def prompt_output(self, index: int, prompt_id: str, wall_time_s: float, calls: int) -> PromptOutput:
        """The request's output as prompt `index`'s (which tokens came from the draft is not reported)."""
        return PromptOutput(
            prompt_index=index,
            prompt_id=prompt_id,
            prompt_tokens=self.prompt_n,
            token_ids=self.token_ids,
            text=self.text,
            from_draft=[],
            wall_time_s=wall_time_s,
            steps=calls,
            prefill_time_s=self.prompt_ms / 1000.0,
        )


def _request(url: str, body: dict[str, Any] | None, timeout_s: float) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as reply:
            return reply.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise ServerError(f"llama-server answered {exc.code} to {url}: {detail}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"llama-server at {url} did not answer: {reason}") from exc


def _json(url: str, body: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    raw = _request(url, body, timeout_s)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ServerError(f"llama-server at {url} sent something that is not JSON: {raw[:120]!r}") from exc
    if not isinstance(value, dict):
        raise ServerError(f"llama-server at {url} sent an unexpected reply: {str(value)[:120]}")
    return value


def chat_prompt(base_url: str, text: str, timeout_s: float = 30.0) -> str:
    """The prompt string for one user turn, in the model's own chat template (the server applies it)."""
    reply = _json(f"{base_url}/apply-template", {"messages": [{"role": "user", "content": text}]}, timeout_s)
    if not isinstance(reply.get("prompt"), str):
        raise ServerError("llama-server's /apply-template reply has no prompt")
    return reply["prompt"]


def complete(
    base_url: str,
    prompt: str | list[str | int],
    n_predict: int,
    temperature: float = 0.0,
    seed: int = 0,
    top_k: int = 0,
    top_p: float = 1.0,
    n_probs: int = 0,
    timeout_s: float = 600.0,
) -> Completion:
    """Generate up to `n_predict` tokens (no prompt cache, so every request does the same work); `prompt` is a text,
    or a text followed by token ids (llama-server tokenizes the text as it would alone and appends the ids)."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": temperature,
        "seed": seed,
        "top_k": top_k,
        "top_p": top_p,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": n_probs,
    }
    if temperature == 0:
        body["top_k"] = 1  # greedy: argmax of the target, as spectune's own loop
    reply = _json(f"{base_url}/completion", body, timeout_s)
    timings = reply.get("timings") or {}
    probs = [
        [(int(t["id"]), float(t["logprob"])) for t in entry.get("top_logprobs") or []]
        for entry in reply.get("completion_probabilities") or []
    ]
    return Completion(
        text=str(reply.get("content", "")),
        token_ids=[int(t) for t in reply.get("tokens") or []],
        predicted_n=int(timings.get("predicted_n", 0)),
        predicted_ms=float(timings.get("predicted_ms", 0.0)),
        prompt_n=int(timings.get("prompt_n", 0)),
        prompt_ms=float(timings.get("prompt_ms", 0.0)),
        draft_n=int(timings.get("draft_n", 0)),
        draft_n_accepted=int(timings.get("draft_n_accepted", 0)),
        stop_type=str(reply.get("stop_type", "")),
        top_logprobs=probs,
    )


def parse_metrics(text: str) -> SpecCounters:
    """SpecCounters from Prometheus text (parsed by prometheus_client, never by hand)."""
    counters = SpecCounters()
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:
        raise ServerError(f"llama-server /metrics is not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            if base in SPEC_COUNTERS:
                setattr(counters, SPEC_COUNTERS[base], float(sample.value))
            elif base == PER_POSITION and "position" in sample.labels:
                counters.accepted_per_position[int(sample.labels["position"])] = float(sample.value)
    return counters


def metrics(base_url: str, timeout_s: float = 10.0) -> SpecCounters:
    return parse_metrics(_request(f"{base_url}/metrics", None, timeout_s).decode(errors="replace"))


def speculating(base_url: str, timeout_s: float = 10.0) -> bool:
    """Whether the server's slots speculate (it can start with speculation off, e.g. a draft of another vocab)."""
    raw = _request(f"{base_url}/slots", None, timeout_s)
    try:
        slots = json.loads(raw)
    except ValueError as exc:
        raise ServerError(f"llama-server /slots is not JSON: {raw[:120]!r}") from exc
    return any(isinstance(slot, dict) and slot.get("speculative") for slot in slots)


def props(base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    return _json(f"{base_url}/props", None, timeout_s)
