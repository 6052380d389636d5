"""The Endpoints page's logic: the endpoint-session form, the one-shot endpoint check, and the results as frames.

A session's levels come from its summary once it has finished (with the server's counters); while it runs
they are computed from the stored requests (engine.engines.endpoint.report, the same figures without counters).
Measured and predicted points are kept apart by a `kind` column the charts draw differently.
The API key is never read or shown here: only the *name* of its environment variable travels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.service.api import (
    APIS,
    ENGINE_KINDS,
    MAX_CONCURRENCY,
    EndpointCheck,
    StoredSession,
    compare,
    parse_levels,
    registry,
    request_stats,
)

KIND_LABELS = {"auto": "detect", "vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp",
               "openai": "other OpenAI-compatible"}  # fmt: skip
KINDS = ENGINE_KINDS
API_CHOICES = APIS
MAX_LEVELS_HELP = f"Comma-separated, each 1 to {MAX_CONCURRENCY}, e.g. 1,2,4,8."
CHUNK_GAP = "chunk gap"  # what the engine's report calls itl: the time between two streamed chunks
TIME_PER_TOKEN = "time per output token"
CHUNK_GAP_HELP = (
    "Gap between streamed chunks: the seconds between two successive chunks of a streamed response (server-sent "
    "events), the median (p50) or 95th percentile (p95) over every gap of every request. A chunk can carry several "
    "tokens (a speculative step accepts several at once) and servers may flush tiny or empty chunks, so this is not "
    "the time per token: it can read far below it."
)
TIME_PER_TOKEN_HELP = (
    "Time per output token (TPOT): per request, (time of the last token − time of the first token) ÷ "
    "(tokens − 1), the median over requests: the decode speed a reader sees once the first token arrived."
)
LATENCY_NOTE = (
    f"{CHUNK_GAP.capitalize()}: the time between two streamed chunks (a chunk can carry several tokens, or none, "
    f"so it is not a per-token time); {TIME_PER_TOKEN}: (last token − first token) ÷ (tokens − 1) of each request."
)
LEVEL_NUMBERS = {
    "tokens/s": "%.2f", "req/s": "%.3f", "TTFT p50 s": "%.3f", "TTFT p95 s": "%.3f",
    f"{CHUNK_GAP} p50 s": "%.4f", f"{CHUNK_GAP} p95 s": "%.4f", f"{TIME_PER_TOKEN} p50 s": "%.4f",
    "goodput req/s": "%.3f", "acceptance": "%.3f", "mean acceptance length": "%.2f",
}  # fmt: skip
LEVEL_HELPS = {
    f"{CHUNK_GAP} p50 s": CHUNK_GAP_HELP,
    f"{CHUNK_GAP} p95 s": CHUNK_GAP_HELP,
    f"{TIME_PER_TOKEN} p50 s": TIME_PER_TOKEN_HELP,
    "TTFT p50 s": "Time to the first token, median over requests.",
    "TTFT p95 s": "Time to the first token, 95th percentile over requests.",
}
REQUEST_NUMBERS = {"TTFT s": "%.3f", "tokens/s": "%.2f", f"{TIME_PER_TOKEN} s": "%.4f", "duration s": "%.3f"}
REQUEST_HELPS = {f"{TIME_PER_TOKEN} s": TIME_PER_TOKEN_HELP}
CHARTS = [  # (level fields → series labels, y axis, title), drawn two per row
    ({"tokens_per_s": "tokens/s"}, "tokens/s", "Throughput (output tokens/s, all requests)"),
    ({"ttft_p50_s": "TTFT p50", "ttft_p95_s": "TTFT p95"}, "seconds", "Time to first token"),
    (
        {"itl_p50_s": f"{CHUNK_GAP} p50", "itl_p95_s": f"{CHUNK_GAP} p95"},
        "seconds",
        "Gap between streamed chunks (not per token)",
    ),
    ({"goodput_rps": "goodput"}, "requests/s", "Goodput (requests/s within the latency target)"),
]


def endpoint_settings(
    url: str,
    model: str,
    api_key_env: str,
    kind: str,
    api: str,
    baseline_url: str,
    levels: str,
    max_requests: int,
    max_duration_s: float,
    request_timeout_s: float,
    ignore_eos: bool,
    ttft_slo_s: float,
    tpot_slo_s: float,
) -> dict[str, Any]:
    """The form's values as the session's endpoint options (validated later by the engine, one clear line)."""
    return {
        "url": url.strip(),
        "model": model.strip(),
        "api_key_env": api_key_env.strip(),
        "kind": kind,
        "api": api,
        "baseline_url": baseline_url.strip(),
        "concurrency": parse_levels(levels),
        "max_requests": int(max_requests),
        "max_duration_s": float(max_duration_s),
        "request_timeout_s": float(request_timeout_s),
        "ignore_eos": bool(ignore_eos),
        "ttft_slo_s": float(ttft_slo_s),
        "tpot_slo_s": float(tpot_slo_s),
    }


def submit(
    store: Any, endpoint: dict[str, Any], prompt_set_id: int | None, n_prompts: int, max_new_tokens: int, name: str
) -> int:
    from engine.errors import SettingsError
    from engine.service.api import submit_endpoint_session

    if prompt_set_id is None:
        raise SettingsError("choose a prompt set first (import one on the Prompts page)")
    return submit_endpoint_session(store, endpoint, prompt_set_id, n_prompts, max_new_tokens, 0.0, name)


def check_headline(found: EndpointCheck) -> str:
    """One sentence on a checked endpoint: `vLLM 0.33.0 serves Qwen/…; it exposes speculation counters.`"""
    engine = KIND_LABELS.get(found.engine, found.engine or "an unknown engine")
    if found.engine == "openai":
        engine = "An OpenAI-compatible server (engine not recognised)"
    version = f" {found.version}" if found.version else ""
    model = f"serves {found.model}" if found.model else "lists no model"
    counters = {
        True: "it exposes speculation counters",
        False: "it exposes no speculation counters (yet: some engines show them after the first request)",
        None: "its /metrics could not be read",
    }[found.speculation_counters]
    return f"{engine}{version} {model}; {counters}."


def check_facts(found: EndpointCheck) -> list[tuple[str, str]]:
    """(what, value) lines of a checked endpoint, for a short list under the headline."""
    counters = found.speculation_counters
    return [
        ("Engine", KIND_LABELS.get(found.engine, found.engine or "—")),
        ("Version", found.version or "not reported"),
        ("Model", found.model or "none listed at /v1/models"),
        (
            "Speculation counters",
            "exposed on /metrics"
            if counters
            else "not exposed on /metrics (yet)"
            if counters is False
            else f"unknown: {found.metrics}",
        ),
        ("Detected from", "the engine you chose" if found.detected_from == "given" else found.detected_from or "—"),
    ]


def is_endpoint_session(session: Mapping[str, Any]) -> bool:
    return registry.get(StoredSession.of(session).engine).deployment


def endpoint_sessions(sessions: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [s for s in sessions if is_endpoint_session(s)]


def endpoint_options(session: Mapping[str, Any]) -> dict[str, Any]:
    return StoredSession.of(session).engine_options


# ------------------------------------------------------------------------------------------------------------------
# results


def level_entries(session: Mapping[str, Any], requests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every (endpoint, concurrency) level: the summary's entries once finished, else computed from requests."""
    entries = [dict(level) for e in StoredSession.of(session).measured_endpoints for level in e.levels]
    if entries:
        return entries
    options = endpoint_options(session)
    slo = float(options.get("ttft_slo_s") or 0.0), float(options.get("tpot_slo_s") or 0.0)
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for row in requests:
        groups.setdefault((str(row["endpoint"]), int(row["concurrency"])), []).append(row)
    return [
        {
            "endpoint": ep,
            "concurrency": c,
            **request_stats(rows, None, *slo),
            "draft_acceptance_rate": None,
            "mean_acceptance_length": None,
            "acceptance_source": None,
        }
        for (ep, c), rows in sorted(groups.items())
    ]


def comparison(session: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    stored = StoredSession.of(session).endpoint_comparison
    if stored is not None:
        return dict(stored)
    spec = [e for e in entries if e["endpoint"] == "speculative"]
    base = [e for e in entries if e["endpoint"] == "baseline"]
    return compare(spec, base) if spec and base else None


def levels_frame(entries: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = [
        {
            "endpoint": e["endpoint"],
            "concurrency": e["concurrency"],
            "requests": e.get("requests"),
            "errors": e.get("errors"),
            "tokens/s": e.get("tokens_per_s"),
            "req/s": e.get("requests_per_s"),
            "TTFT p50 s": e.get("ttft_p50_s"),
            "TTFT p95 s": e.get("ttft_p95_s"),
            f"{CHUNK_GAP} p50 s": e.get("itl_p50_s"),
            f"{CHUNK_GAP} p95 s": e.get("itl_p95_s"),
            f"{TIME_PER_TOKEN} p50 s": e.get("tpot_p50_s"),
            "goodput req/s": e.get("goodput_rps"),
            "acceptance": e.get("draft_acceptance_rate"),
            "mean acceptance length": e.get("mean_acceptance_length"),
            "from": e.get("acceptance_source") or "—",
        }
        for e in entries
    ]
    return pd.DataFrame(rows)


def metric_long(entries: Sequence[Mapping[str, Any]], fields: Mapping[str, str]) -> pd.DataFrame:
    """Long frame for a metric-vs-concurrency chart: one row per (endpoint, field) point, all measured."""
    rows = [
        {"concurrency": e["concurrency"], "series": f"{e['endpoint']} {label}", "value": e.get(key), "kind": "measured"}
        for e in entries
        for key, label in fields.items()
        if e.get(key) is not None
    ]
    return pd.DataFrame(rows, columns=["concurrency", "series", "value", "kind"])


def speedup_long(comp: Mapping[str, Any] | None) -> pd.DataFrame:
    """Measured speedup per level and Theorem 3.8's prediction (memory-bound, c fitted at the lowest level)."""
    rows: list[dict[str, Any]] = []
    for p in (comp or {}).get("points") or []:
        rows.append(
            {"concurrency": p["concurrency"], "series": "measured speedup", "value": p["speedup"], "kind": "measured"}
        )
        if p.get("predicted_speedup") is not None:
            rows.append(
                {
                    "concurrency": p["concurrency"],
                    "series": "predicted (memory-bound theory)",
                    "value": p["predicted_speedup"],
                    "kind": "predicted",
                }
            )
    return pd.DataFrame(rows, columns=["concurrency", "series", "value", "kind"])


def requests_frame(requests: Sequence[Mapping[str, Any]], limit: int = 500) -> pd.DataFrame:
    rows = [
        {
            "endpoint": r["endpoint"],
            "concurrency": r["concurrency"],
            "#": r["request_index"] + 1,
            "prompt": r["prompt_index"] + 1,
            "ok": "yes" if r.get("ok") else "no",
            "TTFT s": r.get("ttft_s"),
            "tokens": r.get("output_tokens"),
            "tokens/s": r.get("tokens_per_s"),
            f"{TIME_PER_TOKEN} s": r.get("tpot_s"),
            "duration s": r.get("duration_s"),
            "retries": r.get("retries"),
            "drafted": r.get("draft_n"),
            "accepted": r.get("draft_n_accepted"),
            "error": r.get("error") or "",
        }
        for r in list(requests)[-limit:]
    ]
    return pd.DataFrame(rows)


def warnings_of(session: Mapping[str, Any]) -> list[str]:
    return [f"{e.label}: {w}" for e in StoredSession.of(session).measured_endpoints for w in e.warnings]


def servers_of(session: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "endpoint": e.label,
            "url": e.url,
            "model": e.model,
            "engine": e.engine,
            "version": e.server_version,
            "API": e.api,
        }
        for e in StoredSession.of(session).measured_endpoints
    ]
