"""Watching a deployment against a stored session: the deployed configuration, then each window judged and kept.

The session gives the draft's measurement (engine.service.decide.evidence.gather), the γ deployed (given, or the
session's recommendation for that draft), the α band it measured and the regime by batch (judge_regime, the one
judgement). Every window is stored, a failed one too, with its verdict or state (store.watch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from engine.analysis.regime import judge_regime
from engine.analysis.theory import alpha_from_mean_accepted
from engine.errors import SettingsError, SpectuneError
from engine.service.decide.evidence import gather, recommend_from_store
from engine.serving.transport import EndpointError
from engine.watch.exporter import Exporter
from engine.watch.prometheus import PrometheusSource
from engine.watch.scrape import MetricsSource
from engine.watch.verdict import Deployment, Verdict, judge
from engine.watch.watcher import metrics_windows, prometheus_windows
from engine.watch.window import Window

Source = MetricsSource | PrometheusSource
RETENTION_DAYS = 30.0  # stored windows older than this are deleted as new ones are written


@dataclass(frozen=True)
class Judged:
    """One window, its verdict and its stored id."""

    window: Window
    verdict: Verdict
    window_id: int


def _alpha_of(run: dict[str, Any]) -> float | None:
    if run.get("alpha") is not None:
        return float(run["alpha"])
    summary = run.get("summary") or {}
    if summary.get("alpha_from_acceptance_length") is not None:
        return float(summary["alpha_from_acceptance_length"])
    mal, gamma = summary.get("mean_acceptance_length"), int(run.get("gamma") or 0)
    return alpha_from_mean_accepted(min(float(mal), gamma + 1.0), gamma) if mal and gamma >= 1 else None


def alpha_band(store: Any, session_id: int, draft: str) -> tuple[float, float] | None:
    """The lowest and highest α the session measured for this draft (over its finished speculative runs)."""
    alphas = [
        a
        for r in store.list_runs(session_id)
        if r.get("status") == "done"
        and r.get("kind") == "speculative"
        and r.get("draft") == draft
        and (a := _alpha_of(r)) is not None
    ]
    return (min(alphas), max(alphas)) if alphas else None


def deployment_for(store: Any, session_id: int, draft: str | None = None, gamma: int | None = None) -> Deployment:
    """The deployed configuration as session `session_id` measured it: `draft` (default: its only draft) at `gamma`
    (default: the γ the session recommends for that draft); SettingsError for one the session did not measure."""
    try:
        ev = gather(store, [session_id])
    except SpectuneError as exc:
        raise SettingsError(f"session {session_id}: {exc}") from exc
    names = [m.name for m in ev.measurements]
    if draft is None and len(names) != 1:
        raise SettingsError(
            f"session {session_id} measured {len(names)} drafts ({', '.join(names)}): name one with --draft"
        )
    chosen = next((m for m in ev.measurements if m.name == (draft or names[0])), None)
    if chosen is None:
        raise SettingsError(f"session {session_id} did not measure draft {draft!r} (it measured {', '.join(names)})")
    if gamma is None:
        rec = recommend_from_store(store, [session_id])[0]
        measured = sorted(chosen.measured_speedup) or [4]
        gamma = rec.gamma if rec.draft_name == chosen.name and rec.gamma >= 1 else measured[-1]
    if gamma < 1:
        raise SettingsError(f"γ {gamma}: a deployment that speculates drafts at least 1 token")
    band = alpha_band(store, session_id, chosen.name) or (chosen.alpha, chosen.alpha)
    return Deployment(
        chosen,
        int(gamma),
        band,
        lambda batch, gamma: judge_regime(ev.regime, batch, gamma, ev.verify_cost).label,
        session_id=session_id,
    )


def deployed_gamma(source: Source) -> tuple[int | None, str]:
    """The γ the server drafts, as its per-position acceptance counters say (vLLM counts every position from the
    start, llama-server each position once it has drafted there), and where it came from; (None, why) where the
    server says nothing yet or cannot be read."""
    try:
        counted = source.positions()
    except EndpointError as exc:
        return None, f"the server could not be read for its γ ({exc})"
    if counted is None:
        return None, "the server counts no draft position yet"
    return counted, f"the server's per-position acceptance counters ({counted} positions)"


def record(window: Window, verdict: Verdict, dep: Deployment | None = None) -> dict[str, Any]:
    """What is stored of a window: its figures, the predicted speedup, the verdict's reasons and the deployed
    configuration it was judged as (what its action file is made from: engine.service.watch_actions)."""
    deployed = {} if dep is None else {"session": dep.session_id, "draft": dep.measurement.name, "gamma": dep.gamma}
    return {
        **window.figures(),
        "start": window.start,
        "state": window.state,
        "message": window.message,
        "predicted_speedup": verdict.predicted_speedup,
        "alpha": verdict.alpha,
        "batch": verdict.batch,
        "regime": verdict.regime,
        "action": verdict.action,
        "why": verdict.why,
        **deployed,
    }


def watch(
    store: Any,
    source: Source,
    dep: Deployment,
    deployment: str,
    seconds: float,
    count: int | None,
    retention_days: float | None = RETENTION_DAYS,
    polls: int = 5,
    sleep: Callable[[float], None] = time.sleep,
    exporter: Exporter | None = None,
) -> Iterator[Judged]:
    """Watch `source` for `count` windows of `seconds` (None: until stopped), judging and storing each (`sleep`
    waits between reads); `exporter` shows each window's verdict as Prometheus metrics."""
    windows = (
        metrics_windows(source, seconds, count, polls, sleep)
        if isinstance(source, MetricsSource)
        else prometheus_windows(source, seconds, count, sleep)
    )
    earlier: list[float | None] = []
    for window in windows:
        verdict = judge(window, dep, earlier)
        earlier.append(verdict.predicted_speedup)
        ended = datetime.fromtimestamp(window.end, UTC)
        kept = store.save_watch_window(
            deployment, ended, window.seconds, verdict.verdict, record(window, verdict, dep), retention_days
        )
        if exporter is not None:
            exporter.update(deployment, window, verdict)
        yield Judged(window, verdict, kept)
