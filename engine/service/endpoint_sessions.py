"""Endpoint sessions: queued from the dashboard (or the CLI), run by the worker through the one sweep driver
against a running OpenAI-compatible endpoint (engine.engines.endpoint.runner), every request stored as it finishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import SettingsError
from engine.service.jobs import prompt_count


def endpoint_spec(endpoint: dict[str, Any], max_new_tokens: int = 64, temperature: float = 0.0) -> Any:
    """The SessionSpec of an endpoint session: target = the model (or URL), drafts = the endpoint URLs."""
    from engine.engines import registry
    from engine.engines.endpoint.settings import EndpointSessionSettings
    from engine.session.spec import SessionSpec

    settings = EndpointSessionSettings.from_dict(endpoint).validate(max_new_tokens, temperature)
    urls = [e.url for e in settings.endpoints()]
    spec = SessionSpec(
        target=settings.model or urls[0],
        drafts=urls,
        gammas=[],
        temperatures=[float(temperature)],
        max_new_tokens=int(max_new_tokens),
        engine="endpoint",
        engine_options=settings,
        chat_template=False,
        measure_verify_cost=False,
        detect_regime=False,
    )
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


def probe_endpoint(
    endpoint: dict[str, Any],
    prompts: list[str],
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    on_phase: Any = None,
) -> dict[str, Any]:
    """Sweep a running endpoint now, without a store (the `probe` command): its sweep report (what the Endpoints
    page shows), with `stopped` set when it stopped early; SettingsError for bad settings."""
    from engine.engines import registry
    from engine.session.hooks import Hooks
    from engine.session.runner import PromptText, RunFailed

    class Phases(Hooks):
        def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
            if on_phase is not None:
                on_phase(name, done, total)

    spec = endpoint_spec(endpoint, max_new_tokens, temperature)
    texts = [PromptText(str(i), text) for i, text in enumerate(prompts)]
    try:
        report = registry.sweep(spec, texts, Phases())
    except RunFailed as exc:  # the baseline endpoint could not be reached: nothing to compare with
        return {"endpoints": [], "stopped": str(exc), "comparison": None, "latency_target": {}}
    return report.engine_info["endpoint"] | {"stopped": report.stopped}


@dataclass(frozen=True)
class EndpointCheck:
    """What one look at an endpoint found: its engine, version and model, and whether its /metrics speaks.

    `speculation_counters` is True (exposed), False (/metrics answered without them) or None (/metrics could not be
    read; `metrics` says why). `detected_from` says how the engine was told ("given": the one the user chose)."""

    engine: str
    version: str | None
    model: str | None
    metrics: str
    speculation_counters: bool | None
    detected_from: str

    def to_dict(self) -> dict[str, Any]:
        """The raw answer, as the page folds it away."""
        return {
            "engine": self.engine,
            "version": self.version,
            "model": self.model,
            "metrics": self.metrics,
            "speculation counters": self.speculation_counters,
            "detected from": self.detected_from,
        }


def check_endpoint(url: str, api_key_env: str, kind: str) -> EndpointCheck:
    """One look at the endpoint (GETs only, to the URL given): engine, version, model, whether /metrics speaks."""
    from engine.engines.endpoint.settings import Endpoint, api_key
    from engine.serving.detect import detect
    from engine.serving.metrics import scrape
    from engine.serving.transport import Connection, EndpointError

    endpoint = Endpoint(url, "", api_key_env, kind)
    conn = Connection(endpoint.url, api_key(endpoint.api_key_env), 5.0)
    speculates: bool | None = None
    try:
        info = detect(conn, endpoint.kind)
        try:
            counters = scrape(conn, info.model or "")
            speculates = bool(counters.speculates)
            metrics = "speculation counters found" if speculates else "no speculation counters (yet)"
        except EndpointError as exc:
            metrics = str(exc)
    finally:
        conn.close()
    return EndpointCheck(info.engine, info.version, info.model, metrics, speculates, info.detected_from)
