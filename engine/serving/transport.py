"""HTTP to one endpoint, standard library only: GETs, and streamed POSTs read as server-sent events.

Requests go only to the root URL given (paths are appended to it; redirects are never followed). Every
failure becomes one EndpointError whose `kind` says what happened and whose message is one clear line
with what the server said: a refused connection, 401/403, 404, 429, 5xx, a timeout, a malformed stream.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from engine.errors import SpectuneError

USER_AGENT = "spectune-endpoint/1"
MAX_ERROR_BODY = 300  # characters of an error reply kept in the message
MAX_LINE = 1 << 20  # one SSE line; longer is a malformed stream

# kinds that stop a sweep at once (retrying cannot help), and the ones retried with back-off
FATAL_KINDS = frozenset({"refused", "unauthorized", "not_found", "dns"})
RETRY_KINDS = frozenset({"rate_limited", "unavailable"})


class EndpointError(SpectuneError):
    """One failed exchange with an endpoint; `kind` classifies it, `status` is the HTTP status if any."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s


def _said(body: bytes) -> str:
    """What the server said in an error body: the JSON error message when there is one, else the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        err = value.get("error", value.get("detail", value.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err
        if err:
            text = str(err)
    flat = " ".join(text.split())
    return flat[:MAX_ERROR_BODY] + ("…" if len(flat) > MAX_ERROR_BODY else "") if flat else "(empty reply)"


def status_error(url: str, status: int, reason: str, body: bytes, headers: Any = None) -> EndpointError:
    said = _said(body)
    if status in (401, 403):
        return EndpointError(
            "unauthorized",
            f"{url} answered {status} {reason}: {said} — check the API key (its environment variable)",
            status,
        )
    if status == 404:
        return EndpointError("not_found", f"{url} answered 404 Not Found: {said} — check the URL and the model", status)
    retry_after = None
    if headers is not None and headers.get("Retry-After"):
        try:
            retry_after = float(headers.get("Retry-After"))
        except ValueError:
            retry_after = None
    if status == 429:
        return EndpointError(
            "rate_limited", f"{url} answered 429 Too Many Requests (rate limited): {said}", status, retry_after
        )
    if status == 503:
        return EndpointError("unavailable", f"{url} answered 503 Service Unavailable: {said}", status, retry_after)
    return EndpointError("http", f"{url} answered {status} {reason}: {said}", status)


def connection_error(url: str, exc: BaseException, timeout_s: float) -> EndpointError:
    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, ConnectionRefusedError):
        return EndpointError("refused", f"connection to {url} refused: nothing is listening there (is the server up?)")
    if isinstance(exc, TimeoutError | socket.timeout):
        return EndpointError("timeout", f"no reply from {url} within {timeout_s:g} s (timed out)")
    if isinstance(exc, socket.gaierror):
        return EndpointError("dns", f"cannot resolve the host of {url}: {exc.strerror or exc}")
    if isinstance(exc, ssl.SSLError):
        return EndpointError("tls", f"TLS with {url} failed: {exc}")
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError):
        return EndpointError("disconnected", f"{url} closed the connection without a complete reply")
    if isinstance(exc, http.client.HTTPException):
        return EndpointError("malformed", f"{url} sent a reply that is not valid HTTP: {type(exc).__name__}")
    return EndpointError("connection", f"cannot reach {url}: {exc}")


class Connection:
    """One keep-alive connection to the endpoint's root (one per load-generator thread)."""

    def __init__(self, root: str, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        parts = urlsplit(root)
        self.root = root
        self.prefix = parts.path.rstrip("/")
        self.host = parts.hostname or ""
        self.port = parts.port
        self.https = parts.scheme == "https"
        self.timeout_s = timeout_s
        self.headers = {"User-Agent": USER_AGENT, "Accept": "application/json, text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=timeout_s)
        self._conn.timeout = timeout_s
        if self._conn.sock is None:
            self._conn.connect()
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn.sock.settimeout(timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, method: str, path: str, body: bytes | None, timeout_s: float) -> http.client.HTTPResponse:
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        url = self.url(path)
        for attempt in (0, 1):  # a kept-alive connection the server closed meanwhile is reopened once
            fresh = self._conn is None or self._conn.sock is None
            try:
                conn = self._connect(timeout_s)
                conn.request(method, self.prefix + path, body=body, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if fresh or attempt:
                    raise connection_error(url, exc, timeout_s) from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise connection_error(url, exc, timeout_s) from exc
        raise AssertionError("unreachable")

    def get(self, path: str, timeout_s: float | None = None) -> tuple[int, str, bytes]:
        """(status, content type, body) of a GET; only connection failures raise."""
        timeout = timeout_s or self.timeout_s
        url = self.url(path)
        resp = self._send("GET", path, None, timeout)
        try:
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise connection_error(url, exc, timeout) from exc
        if resp.will_close:
            self.close()
        return resp.status, resp.getheader("Content-Type") or "", body

    def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        """The JSON body of a 200 reply; EndpointError for any other status or a body that is not JSON."""
        status, _, body = self.get(path, timeout_s)
        url = self.url(path)
        if status != 200:
            raise status_error(url, status, http.client.responses.get(status, ""), body)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise EndpointError("malformed", f"{url} did not answer JSON: {body[:80]!r}") from exc

    def stream(
        self, path: str, payload: dict[str, Any], timeout_s: float, stop: Callable[[], bool] | None = None
    ) -> Iterator[tuple[float, dict[str, Any]]]:
        """POST `payload` and yield (perf_counter time, event) for each JSON server-sent event until [DONE].

        `timeout_s` bounds the wait for every read and the whole request. A non-200 reply, an event that is
        not JSON, an `error` event or a stream cut short raises EndpointError; `stop()` ends it early.
        """
        url = self.url(path)
        started = time.perf_counter()
        resp = self._send("POST", path, json.dumps(payload).encode(), timeout_s)
        if resp.status != 200:
            try:
                body = resp.read(64 * 1024)
            except (OSError, http.client.HTTPException):
                body = b""
            self.close()
            raise status_error(url, resp.status, resp.reason, body, resp.headers)
        kind = (resp.getheader("Content-Type") or "").split(";")[0].strip()
        if kind and kind != "text/event-stream":
            body = resp.read(200)
            self.close()
            raise EndpointError("malformed", f"{url} did not stream (Content-Type {kind}): {body[:80]!r}")
        done = False
        data: list[bytes] = []
        try:
            while True:
                if time.perf_counter() - started > timeout_s:
                    raise EndpointError("timeout", f"{url}: the reply took longer than {timeout_s:g} s (timed out)")
                if stop is not None and stop():
                    self.close()
                    return
                line = resp.readline(MAX_LINE)
                if not line:
                    break
                if not line.endswith(b"\n") and len(line) >= MAX_LINE:
                    raise EndpointError("malformed", f"{url}: a stream line longer than {MAX_LINE} bytes")
                line = line.rstrip(b"\r\n")
                if line:
                    if line.startswith(b":"):  # a comment (keep-alive)
                        continue
                    field, _, value = line.partition(b":")
                    if field == b"data":
                        data.append(value[1:] if value.startswith(b" ") else value)
                    elif field not in (b"event", b"id", b"retry"):
                        raise EndpointError("malformed", f"{url} sent a malformed stream: {line[:80]!r}")
                    continue
                if not data:
                    continue
                raw, data = b"\n".join(data), []
                if raw.strip() == b"[DONE]":
                    done = True
                    break
                yield time.perf_counter(), _event(url, raw)
            if data:  # a last event without its blank line
                raw = b"\n".join(data)
                if raw.strip() == b"[DONE]":
                    done = True
                else:
                    yield time.perf_counter(), _event(url, raw)
        except EndpointError:
            self.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise connection_error(url, exc, timeout_s) from exc
        if not done:
            self.close()
            raise EndpointError("truncated", f"{url}: the stream ended without [DONE]")
        if resp.will_close:
            self.close()
        else:
            resp.read()  # drain the chunked terminator so the connection can be reused


def _event(url: str, raw: bytes) -> dict[str, Any]:
    try:
        event = json.loads(raw)
    except ValueError as exc:
        raise EndpointError("malformed", f"{url} sent a stream event that is not JSON: {raw[:80]!r}") from exc
    if not isinstance(event, dict):
        raise EndpointError("malformed", f"{url} sent a stream event that is not a JSON object: {raw[:80]!r}")
    if event.get("error"):
        said = _said(json.dumps(event).encode())
        raise EndpointError("server", f"{url} reported an error mid-stream: {said}")
    return event
