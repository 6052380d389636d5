"""Requests to a vLLM server, timed like a deployment: n prompts in flight at once, each streamed and timed per
chunk (time to first token, inter-token gaps), with the output's token ids (`return_token_ids`) and, for the
baseline, each token's top log-probs by token id (`return_tokens_as_token_ids`), and the server's speculation
counters (/metrics) before and after the batch, settled."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.counters import SpecCounters
from engine.serving.metrics import ServerCounters, scrape, settled
from engine.serving.transport import Connection, EndpointError


@dataclass
class Completion:
    """One streamed completion."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    duration_s: float = 0.0
    finish_reason: str | None = None
    top: list[list[tuple[int, float]]] | None = None  # per token: (token id, log-prob), best first


@dataclass
class Batch:
    """n completions sent at once, and the server's speculation counters over exactly them."""

    completions: list[Completion]
    wall_s: float
    counters: SpecCounters


def tokenize_chat(url: str, model: str, text: str) -> list[int]:
    """The prompt's token ids with the model's chat template, rendered by vLLM itself (POST /tokenize)."""
    return _tokenize(
        url, {"model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
    )


def tokenize(url: str, model: str, text: str) -> list[int]:
    """The token ids vLLM's completions make of `text` as a prompt (POST /tokenize)."""
    return _tokenize(url, {"model": model, "prompt": text})


def _tokenize(url: str, body: dict[str, Any]) -> list[int]:
    request = urllib.request.Request(f"{url}/tokenize", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            reply = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EndpointError("malformed", f"{url}/tokenize failed: {exc}") from exc
    tokens = reply.get("tokens") if isinstance(reply, dict) else None
    if not isinstance(tokens, list):
        raise EndpointError("malformed", f"{url}/tokenize answered without tokens: {str(reply)[:200]}")
    return [int(t) for t in tokens]


def _top(logprobs: Any) -> list[list[tuple[int, float]]]:
    rows = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    out = []
    for row in rows or []:
        pairs = [(int(k.split(":", 1)[1]), float(v)) for k, v in (row or {}).items() if k.startswith("token_id:")]
        out.append(sorted(pairs, key=lambda p: -p[1]))
    return out


def complete(
    conn: Connection,
    model: str,
    prompt: list[int] | str,
    sampling: dict[str, Any],
    top_logprobs: int,
    timeout_s: float,
    stop: Callable[[], bool] | None = None,
) -> Completion:
    """Stream one completion; EndpointError when the server fails it."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    if top_logprobs:
        body |= {"logprobs": top_logprobs, "return_tokens_as_token_ids": True}
    done = Completion(top=[] if top_logprobs else None)
    start = time.perf_counter()
    times: list[float] = []
    for t, event in conn.stream("/v1/completions", body, timeout_s, stop):
        usage = event.get("usage")
        if isinstance(usage, dict):
            done.prompt_tokens = int(usage.get("prompt_tokens") or done.prompt_tokens)
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids") or []
            if ids:
                times.append(t)
                done.token_ids += [int(i) for i in ids]
            done.text += choice.get("text") or ""
            done.finish_reason = choice.get("finish_reason") or done.finish_reason
            if done.top is not None:
                done.top += _top(choice.get("logprobs"))
    done.duration_s = time.perf_counter() - start
    if times:
        done.ttft_s = times[0] - start
        done.itl_s = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    return done


def _settled(url: str, model: str) -> ServerCounters:
    """/metrics once it stops moving (vLLM may count a request's last step just after its reply)."""
    conn = Connection(url, None, 10.0)
    try:
        found = settled(lambda: scrape(conn, model))
    finally:
        conn.close()
    assert found is not None  # scrape raises rather than return None
    return found


def batch(
    url: str,
    model: str,
    prompts: Sequence[list[int] | str],
    sampling: dict[str, Any],
    top_logprobs: int,
    timeout_s: float,
    stop: Callable[[], bool] | None = None,
) -> Batch:
    """All `prompts` in flight at once (one thread and connection each); the first failure is raised."""
    before = _settled(url, model)
    results: list[Completion | BaseException | None] = [None] * len(prompts)

    def one(i: int) -> None:
        conn = Connection(url, None, timeout_s)
        try:
            results[i] = complete(conn, model, prompts[i], sampling, top_logprobs if i == 0 else 0, timeout_s, stop)
        except BaseException as exc:  # handed to the caller's thread below
            results[i] = exc
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    for result in results:
        if isinstance(result, BaseException):
            raise result
    completions = [r for r in results if isinstance(r, Completion)]
    delta = _settled(url, model).minus(before)
    return Batch(completions, wall_s, delta.as_spec(sum(len(c.token_ids) for c in completions)))
