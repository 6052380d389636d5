"""The file a watch verdict offers: γ by batch size for "costing you", speculation off for "acceptance collapsed".

Made from a stored window (its figures name the session, draft and γ it was judged as) by the export format of the
engine the window's counters came from (else the session's engine's own format), through that format's plug-in:
- "costing you": the schedule engine.watch.actions derives at the window's acceptance over the session's regime by
  batch, exported as a batch-schedule policy. Where the engine runs γ by batch size (vLLM's
  num_speculative_tokens_per_batch_size) that is the file; where it cannot, or the schedule drafts nothing with one
  request in flight, the file turns speculation off and says why.
- "acceptance collapsed": speculation off. A vLLM off file names the speculation it replaces, so that check-export
  measures the two side by side (engine.service.export_check).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.analysis.export import engine_file, export_format, export_policy, format_names, recommended
from engine.analysis.recommend import Recommendation
from engine.core.policy import BatchSchedule
from engine.engines import registry
from engine.errors import SettingsError, SpectuneError
from engine.service.decide.evidence import recommend_from_store
from engine.service.watch import deployment_for
from engine.session.spec import session_engine
from engine.watch.actions import derived_schedule, is_off, schedule_batches
from engine.watch.verdict import COLLAPSED, COSTING, Deployment

ACTIONS = (COSTING, COLLAPSED)  # the verdicts that offer a file


@dataclass(frozen=True)
class ActionFile:
    """The file a verdict offers, in one engine's format, and what it does."""

    verdict: str
    fmt: str
    filename: str
    text: str
    says: str  # what the file does, in one sentence
    session_id: int  # the session it was derived from (what check-export measures a vLLM file against)
    checkable: bool  # check-export measures it (a vLLM file)

    @property
    def language(self) -> str:
        """How a page highlights it."""
        return export_format(self.fmt).language

    @property
    def mime(self) -> str:
        return export_format(self.fmt).mime


def action_file(store: Any, verdict: str, figures: Mapping[str, Any]) -> ActionFile | None:
    """The file stored window `figures` with `verdict` offers; None for a verdict that offers none, or a window
    stored without its deployed configuration. SettingsError when its session can no longer make it."""
    if verdict not in ACTIONS or figures.get("session") is None:
        return None
    session_id = int(figures["session"])
    dep = deployment_for(store, session_id, figures.get("draft"), figures.get("gamma"))
    fmt = _format(store, session_id, figures.get("engine"))
    watched, target = _watched(store, dep)
    why = str(figures.get("why") or verdict)
    if verdict == COLLAPSED:
        return _off(watched, fmt, target, f"acceptance collapsed: {why}", session_id, verdict)
    rates = [float(r) for r in figures.get("per_position_acceptance") or []]
    if not rates and figures.get("alpha") is not None:
        rates = [float(figures["alpha"])]
    batch = int(figures.get("batch") or 1)
    schedule = derived_schedule(
        dep, rates, figures.get("drafting_fraction"), schedule_batches(batch, sorted(watched.schedule or {}))
    )
    if is_off(schedule):
        return _off(
            watched,
            fmt,
            target,
            f"costing you: {why}; no γ is predicted above 1× even with one request in flight at this acceptance",
            session_id,
            verdict,
        )
    policy = BatchSchedule(tuple(schedule.items()))
    made = export_policy(watched, policy, fmt, target=target)
    if not made.exact:
        lost = "; ".join(made.lost)
        return _off(
            watched,
            fmt,
            target,
            f"costing you: {why}; the schedule {policy.spec()} cannot run here ({lost})",
            session_id,
            verdict,
        )
    gammas = set(schedule.values())
    shape = (
        f"γ {gammas.pop()} at every batch"
        if len(gammas) == 1
        else "γ by batch size " + ", ".join(f"from {b}: {g}" for b, g in schedule.items())
    )
    says = (
        f"{shape} for {watched.draft_name} (deployed at γ={dep.gamma}), at the acceptance this window "
        f"observed; the engine runs {made.runs}"
    )
    return ActionFile(verdict, fmt, made.filename, made.text, says, session_id, _checkable(fmt))


def _format(store: Any, session_id: int, engine_seen: str | None) -> str:
    """The export format of the engine whose counters the window read, else of the session's engine."""
    session = store.get_session(session_id) or {}
    for engine in (engine_seen, session_engine(session)):
        if engine is None:
            continue
        if engine in format_names():
            return engine
        entry = registry.find(engine)
        if entry is not None and entry.export_format is not None:
            return entry.export_format
    raise SettingsError(
        f"session {session_id} was measured in an engine with no deployable file of its own, and the "
        "window does not say which engine served it"
    )


def _watched(store: Any, dep: Deployment) -> tuple[Recommendation, str | None]:
    """The session's recommendation made over to the watched draft and γ, and the sessions' target."""
    assert dep.session_id is not None
    try:
        rec, ev, _ = recommend_from_store(store, [dep.session_id])
    except SpectuneError as exc:
        raise SettingsError(f"session {dep.session_id}: {exc}") from exc
    m = dep.measurement
    watched = replace(
        rec,
        draft_name=m.name,
        method=m.method,
        model_ref=m.model_ref,
        measurement=m,
        gamma=dep.gamma,
        notes=[],
        schedule=None,
        measured_check=None,
    )
    return watched, ev.target


def _off(
    watched: Recommendation, fmt: str, target: str | None, reason: str, session_id: int, verdict: str
) -> ActionFile:
    """Speculation off, in `fmt`, naming the speculation it replaces."""
    off = replace(watched, gamma=0, explanation=f"spectune watch: {reason}. Serve the target alone.")
    dep = replace(recommended(off, {}, target=target), replaces=recommended(watched, {}, target=target))
    says = f"speculation off (it replaces {watched.draft_name} at γ={watched.gamma}): {reason}"
    text = engine_file(dep, fmt).render()
    return ActionFile(verdict, fmt, export_format(fmt).filename, text, says, session_id, _checkable(fmt))


def _checkable(fmt: str) -> bool:
    """Whether check-export measures a file of this format."""
    from engine.service.export_check import VLLM_FORMAT

    return fmt == VLLM_FORMAT
