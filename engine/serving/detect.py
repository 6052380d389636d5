"""Which engine serves an endpoint, its version and model, from the pages each engine documents.

- llama.cpp: GET /props has `build_info` (e.g. "b11434-unknown").
- SGLang 0.5.23: GET /server_info has `version` (`sglang/srt/entrypoints/http_server.py`, server_info()).
- vLLM 0.33: GET /version is {"version": …} (`vllm/entrypoints/serve/instrumentator/basic.py`); its
  /server_info exists only in dev mode and then holds `vllm_config`.
- otherwise the metric-name prefix on /metrics (vllm:, sglang:, llamacpp:), else a generic OpenAI server.

Only GETs to the endpoint's own root; a 401 or a refused connection is raised at once (one clear line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.serving.metrics import scrape
from engine.serving.transport import FATAL_KINDS, Connection, EndpointError, status_error


@dataclass
class ServerInfo:
    engine: str  # vllm | sglang | llama.cpp | openai
    version: str | None
    model: str | None  # the first model at /v1/models, when the server lists one
    detected_from: str  # which page told


def _json(conn: Connection, path: str, timeout_s: float) -> Any:
    """The JSON at `path`, or None when the page is absent or not JSON; 401/403 and refusals raise."""
    status, _, body = conn.get(path, timeout_s)
    if status in (401, 403):
        raise status_error(conn.url(path), status, "Unauthorized" if status == 401 else "Forbidden", body)
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def first_model(conn: Connection, timeout_s: float = 5.0) -> str | None:
    try:
        listing = _json(conn, "/v1/models", timeout_s)
    except EndpointError as exc:
        if exc.kind in FATAL_KINDS:
            raise
        return None
    data = listing.get("data") if isinstance(listing, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
        return str(data[0]["id"])
    return None


def _version_for(conn: Connection, engine: str, timeout_s: float) -> str | None:
    if engine == "llama.cpp":
        props = _json(conn, "/props", timeout_s)
        return str(props["build_info"]) if isinstance(props, dict) and props.get("build_info") else None
    if engine == "sglang":
        info = _json(conn, "/server_info", timeout_s)
        return str(info["version"]) if isinstance(info, dict) and info.get("version") else None
    if engine == "vllm":
        ver = _json(conn, "/version", timeout_s)
        return str(ver["version"]) if isinstance(ver, dict) and ver.get("version") else None
    return None


def detect(conn: Connection, kind: str = "auto", timeout_s: float = 5.0) -> ServerInfo:
    """The engine behind `conn` (or `kind` when the user named it), with its version and served model."""
    model = first_model(conn, timeout_s)
    if kind != "auto":
        return ServerInfo(kind, _version_for(conn, kind, timeout_s), model, "given")
    props = _json(conn, "/props", timeout_s)
    if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
        return ServerInfo("llama.cpp", str(props.get("build_info") or "") or None, model, "/props")
    info = _json(conn, "/server_info", timeout_s)
    if isinstance(info, dict) and "vllm_config" in info:
        return ServerInfo("vllm", _version_for(conn, "vllm", timeout_s), model, "/server_info")
    if isinstance(info, dict) and info.get("version"):
        return ServerInfo("sglang", str(info["version"]), model, "/server_info")
    ver = _json(conn, "/version", timeout_s)
    if isinstance(ver, dict) and ver.get("version"):
        return ServerInfo("vllm", str(ver["version"]), model, "/version")
    try:
        engines = scrape(conn, timeout_s=timeout_s).engines
    except EndpointError as exc:
        if exc.kind in FATAL_KINDS:
            raise
        engines = set()
    if len(engines) == 1:
        engine = engines.pop()
        return ServerInfo(engine, _version_for(conn, engine, timeout_s), model, "/metrics")
    return ServerInfo("openai", None, model, "none of /props, /server_info, /version, /metrics")
