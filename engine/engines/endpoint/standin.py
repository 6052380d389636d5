"""A stand-in OpenAI-compatible server on 127.0.0.1 (standard library): for tests, the benchmark and demos.

It streams `tokens` chunks per request at once (or after `delay_s` per chunk) over HTTP/1.1 keep-alive,
and speaks one engine's documented extras (`flavor`):

- "vllm": GET /version; /metrics with vLLM 0.33's spec-decode counters (the names, labels and `_total`
  exposition of `vllm/v1/spec_decode/metrics.py`), rendered by prometheus_client.
- "sglang": GET /server_info with a version; the last chunk's `sglext.spec_tokens_details` when the request
  asks `return_spec_tokens_details` (`sglang/srt/entrypoints/openai/protocol.py`); /metrics with
  `sglang:spec_verify_calls_total` and the `spec_accept_length`/`spec_accept_rate` gauges.
- "llama.cpp": GET /props with build_info; the last chunk's `timings.draft_n`/`draft_n_accepted`; /metrics
  with the `llamacpp:spec_decode_*` counters.
- "openai": none of those.

Every request drafts in steps of GAMMA tokens with a fixed acceptance pattern, so each flavor's counters
agree with its per-request figures. `mode` makes it misbehave: "unauthorized" (401), "rate_limited" (429
with Retry-After: 0 for the first `fail_first` POSTs, every POST when 0), "garbage" (a stream that is not
SSE of JSON), "truncated" (no [DONE]), "not_streaming" (a JSON body), "error_event" (an error mid-stream),
"slow" (sleeps `delay_s` before answering). `metrics`: "prometheus", "missing" (404), "html", "garbage".
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

GAMMA = 3
ACCEPT_PATTERN = (3, 1, 2, 0)  # accepted drafts per step, cycled (as in /work/drafts' vLLM sample)
MODEL = "standin-model"


def spec_figures(tokens: int) -> dict[str, Any]:
    """Drafting for one request of `tokens` output tokens: steps, draft tokens, accepted, per position."""
    steps = drafted = accepted = emitted = 0
    per_pos = [0] * GAMMA
    while emitted < tokens:
        a = ACCEPT_PATTERN[steps % len(ACCEPT_PATTERN)]
        steps += 1
        drafted += GAMMA
        accepted += a
        for p in range(a):
            per_pos[p] += 1
        emitted += a + 1
    return {"steps": steps, "draft_tokens": drafted, "accepted": accepted, "per_pos": per_pos}


class _Counters:
    def __init__(self, flavor: str) -> None:
        self.flavor = flavor
        self.registry = CollectorRegistry()
        self.lock = threading.Lock()
        if flavor in ("vllm", "llama.cpp"):
            prefix = "vllm" if flavor == "vllm" else "llamacpp"
            labels = ["model_name", "engine"] if flavor == "vllm" else []
            self.drafts = Counter(
                f"{prefix}:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=self.registry
            )
            self.draft_tokens = Counter(
                f"{prefix}:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=self.registry
            )
            self.accepted = Counter(
                f"{prefix}:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                labels,
                registry=self.registry,
            )
            self.per_pos = Counter(
                f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*labels, "position"],
                registry=self.registry,
            )
            self.labels = {"model_name": MODEL, "engine": "0"} if flavor == "vllm" else {}
            if self.labels:  # like vLLM, which binds its labels at start-up: the counters show 0 from the start
                for counter in (self.drafts, self.draft_tokens, self.accepted):
                    counter.labels(**self.labels)
                for p in range(GAMMA):
                    self.per_pos.labels(**self.labels, position=str(p))
        elif flavor == "sglang":
            labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
            self.labels = {
                "model_name": MODEL,
                "engine_type": "unified",
                "tp_rank": "0",
                "pp_rank": "0",
                "moe_ep_rank": "0",
            }
            self.verify = Counter(
                "sglang:spec_verify_calls",
                "Number of speculative decoding verification calls.",
                ["model_name", "engine_type"],
                registry=self.registry,
            )
            self.length = Gauge(
                "sglang:spec_accept_length",
                "Mean acceptance length of speculative decoding.",
                labels,
                registry=self.registry,
            )
            self.rate = Gauge("sglang:spec_accept_rate", "Speculative acceptance rate.", labels, registry=self.registry)
        self.requests = Counter("standin:requests", "Requests answered.", registry=self.registry)

    def record(self, fig: dict[str, Any]) -> None:
        with self.lock:
            self.requests.inc()
            if self.flavor in ("vllm", "llama.cpp"):
                lab = self.labels
                (self.drafts.labels(**lab) if lab else self.drafts).inc(fig["steps"])
                (self.draft_tokens.labels(**lab) if lab else self.draft_tokens).inc(fig["draft_tokens"])
                (self.accepted.labels(**lab) if lab else self.accepted).inc(fig["accepted"])
                for p, n in enumerate(fig["per_pos"]):
                    self.per_pos.labels(**lab, position=str(p)).inc(n)
            elif self.flavor == "sglang":
                self.verify.labels(model_name=MODEL, engine_type="unified").inc(fig["steps"])
                self.length.labels(**self.labels).set((fig["accepted"] + fig["steps"]) / fig["steps"])
                self.rate.labels(**self.labels).set(fig["accepted"] / fig["draft_tokens"])

    def render(self) -> bytes:
        with self.lock:
            return generate_latest(self.registry)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the listen backlog: 64 clients connecting at once must not be reset (default 5)

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client hanging up is not news
        pass


class StandIn:
    """`with StandIn(flavor="vllm") as server:` → server.url (http://127.0.0.1:PORT)."""

    def __init__(
        self,
        mode: str = "ok",
        flavor: str = "openai",
        tokens: int = 8,
        delay_s: float = 0.0,
        metrics: str = "prometheus",
        fail_first: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.mode, self.flavor, self.tokens, self.delay_s = mode, flavor, tokens, delay_s
        self.metrics, self.fail_first, self.api_key = metrics, fail_first, api_key
        self.counters = _Counters(flavor)
        self.posts = 0
        self.paths: list[str] = []
        self.auth_headers: list[str | None] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StandIn:
        handler = type("Handler", (_Handler,), {"standin": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    standin: StandIn

    def setup(self) -> None:
        super().setup()
        # small SSE writes must leave at once (as real servers do), not wait for Nagle and a delayed ACK
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any, **headers: str) -> None:
        self._send(status, json.dumps(value).encode(), **headers)

    def _authorized(self) -> bool:
        s = self.standin
        auth = self.headers.get("Authorization")
        with s._lock:
            s.paths.append(self.path)
            s.auth_headers.append(auth)
        if s.mode == "unauthorized" or (s.api_key and auth != f"Bearer {s.api_key}"):
            self._json(401, {"error": {"message": "Invalid API key", "type": "authentication_error", "code": 401}})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        s = self.standin
        if not self._authorized():
            return
        if self.path == "/metrics":
            if s.metrics == "missing":
                self._json(404, {"error": {"message": "File Not Found", "code": 404}})
            elif s.metrics == "html":
                self._send(200, b"<!doctype html><html><body>metrics dashboard</body></html>", "text/html")
            elif s.metrics == "garbage":
                self._send(200, b"this is not prometheus text\n", "text/plain")
            else:
                self._send(200, s.counters.render(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/version" and s.flavor == "vllm":
            self._json(200, {"version": "0.33.0"})
        elif self.path == "/server_info" and s.flavor == "sglang":
            self._json(200, {"version": "0.5.23", "frontend": "python"})
        elif self.path == "/props" and s.flavor == "llama.cpp":
            self._json(200, {"build_info": "b11434-standin", "total_slots": 4})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "File Not Found", "code": 404}})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_POST(self) -> None:  # noqa: N802
        s = self.standin
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "body is not JSON"}})
            return
        if not self._authorized():
            return
        with s._lock:
            s.posts += 1
            n = s.posts
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if s.mode == "rate_limited" and (s.fail_first == 0 or n <= s.fail_first):
            self._json(429, {"error": {"message": "rate limit reached, slow down"}}, Retry_After="0")
            return
        if s.mode == "slow":
            time.sleep(s.delay_s)
        if s.mode == "not_streaming":
            self._json(200, {"choices": [{"text": "hello", "finish_reason": "stop"}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._stream(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _stream(self, body: dict[str, Any]) -> None:
        s = self.standin
        chat = "messages" in body
        tokens = min(int(body.get("max_tokens") or s.tokens), s.tokens)
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        if s.mode == "garbage":
            self._chunk(b"data: {this is not json\n\n")
            self._chunk(b"")
            return
        if s.mode == "error_event":
            self._chunk(b'data: {"error": {"message": "CUDA out of memory", "code": 500}}\n\n')
            self._chunk(b"")
            return
        for i in range(tokens):
            if s.delay_s and s.mode != "slow":
                time.sleep(s.delay_s)
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": f" t{i}"}
            else:
                choice["text"] = f" t{i}"
            event: dict[str, Any] = {
                "id": "cmpl-standin",
                "object": "text_completion",
                "model": MODEL,
                "choices": [choice],
            }
            if continuous:
                event["usage"] = {"prompt_tokens": 4, "completion_tokens": i + 1, "total_tokens": 5 + i}
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            if s.mode == "truncated" and i == 1:
                self._chunk(b"")
                return
        fig = spec_figures(tokens)
        s.counters.record(fig)
        final: dict[str, Any] = {
            "id": "cmpl-standin",
            "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "length", **({"delta": {}} if chat else {"text": ""})}],
            "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens},
        }
        if s.flavor == "llama.cpp":
            final["timings"] = {
                "predicted_n": tokens,
                "draft_n": fig["draft_tokens"],
                "draft_n_accepted": fig["accepted"],
            }
        if s.flavor == "sglang" and body.get("return_spec_tokens_details"):
            final["sglext"] = {
                "spec_tokens_details": {
                    "spec_accept_rate": fig["accepted"] / fig["draft_tokens"],
                    "spec_accept_length": (fig["accepted"] + fig["steps"]) / fig["steps"],
                    "spec_num_correct_drafts": fig["accepted"],
                    "spec_num_proposed_drafts": fig["draft_tokens"],
                    "spec_verify_ct": fig["steps"],
                }
            }
        self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")
