"""Endpoint sessions: queued from the dashboard (or the CLI), run by the worker against a running
OpenAI-compatible endpoint, every request stored as it finishes."""

from __future__ import annotations

import time
from typing import Any

from engine.errors import SettingsError
from engine.service.jobs import prompt_count

REQUEST_FLUSH_ROWS = 32
REQUEST_FLUSH_S = 0.5


def endpoint_spec(endpoint: dict[str, Any], max_new_tokens: int = 64, temperature: float = 0.0) -> Any:
    """The SessionSpec of an endpoint session: target = the model (or URL), drafts = the endpoint URLs."""
    from engine.endpoint.settings import EndpointSessionSettings
    from engine.engines import registry
    from engine.session.spec import SessionSpec

    settings = EndpointSessionSettings.from_dict(endpoint).validate(max_new_tokens, temperature)
    urls = [e.url for e in settings.endpoints()]
    spec = SessionSpec(
        target=settings.model or urls[0], drafts=urls, gammas=[], temperatures=[float(temperature)],
        max_new_tokens=int(max_new_tokens), engine="endpoint", endpoint=settings.to_dict(), chat_template=False,
        measure_verify_cost=False, detect_regime=False,
    )  # fmt: skip
    return registry.validate(spec)


def submit_endpoint_session(
    store: Any,
    endpoint: dict[str, Any],
    prompt_set_id: int,
    n_prompts: int | None = None,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    name: str | None = None,
) -> int:
    """Validate and queue an endpoint session (no request is sent until a worker runs it)."""
    spec = endpoint_spec(endpoint, max_new_tokens, temperature)
    count = prompt_count(store, prompt_set_id, n_prompts)
    if count < 1:
        raise SettingsError("the prompt set is empty: upload or choose prompts first")
    named = {"name": name.strip()} if name and name.strip() else {"name": f"endpoint {spec.target}"[:200]}
    return store.create_session(**named, **spec.to_row(), prompt_set_id=prompt_set_id, n_prompts=count)


def run_endpoint_session(store: Any, session: dict[str, Any], spec: Any, prompts: list[Any], hooks: Any) -> str:
    """Run a claimed endpoint session to its end state (every request stored as it finishes)."""
    from engine.endpoint.load import Sweep
    from engine.endpoint.report import sweep_report
    from engine.endpoint.settings import EndpointSessionSettings
    from engine.service.store_hooks import TERMINATING

    session_id = session["id"]
    temperature = spec.temperatures[0] if spec.temperatures else 0.0
    settings = EndpointSessionSettings.from_dict(spec.endpoint).validate(spec.max_new_tokens, temperature)
    limits = settings.limits(spec.max_new_tokens, temperature)
    endpoints = settings.endpoints()
    store.set_hardware(session_id, "remote endpoint: " + ", ".join(e.url for e in endpoints))
    pending: list[dict[str, Any]] = []
    last_flush = [time.monotonic()]

    def flush() -> None:
        if pending:
            store.add_endpoint_requests(session_id, pending)
            pending.clear()
        last_flush[0] = time.monotonic()

    def on_request(result: Any) -> None:
        pending.append(result.row())
        if len(pending) >= REQUEST_FLUSH_ROWS or time.monotonic() - last_flush[0] >= REQUEST_FLUSH_S:
            flush()

    def on_phase(name: str, done: int, total: int) -> None:
        hooks.phase(name, done, total, None)
        hooks.progress(done, total)

    sweep = Sweep(endpoints, limits, [p.text for p in prompts], on_request=on_request,
                  should_stop=hooks.should_stop, on_level=lambda level: flush(), on_phase=on_phase)  # fmt: skip
    try:
        result = sweep.run()
    finally:
        flush()
    report = sweep_report(result, settings.ttft_slo_s, settings.tpot_slo_s)
    summary = {"engine": "endpoint", "endpoint": report, "runs": []}
    hooks.phase("done", 1, 1, 0.0)
    if result.cancelled:
        if hooks.lost:
            return "failed"
        if TERMINATING.is_set():
            error = f"the worker was stopped; what it measured is kept (python -m engine requeue {session_id})"
            store.finish_session(session_id, "interrupted", error=error, summary=summary)
            return "interrupted"
        store.finish_session(session_id, "cancelled", error="cancelled by the user", summary=summary)
        return "cancelled"
    if result.stopped:
        store.finish_session(session_id, "failed", error=result.stopped, summary=summary)
        return "failed"
    store.finish_session(session_id, "done", summary=summary)
    return "done"
