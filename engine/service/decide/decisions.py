"""The one decision per query: made once from the stored sessions, stored, and read by every page and command.

A query (objective, serving batch, temperature, budget, price, regime override, engine) over some finished sessions
leads to one configuration (a draft at a fixed γ, a drafting policy, or speculation off), and that decision is kept
in the store with what it rests on: its prediction, the run that measured it (or "not measured"), the runner-up,
the regime, the measurement floor and the analysis it was made from (engine.service.decide.analysis). The worker
makes it
when a session ends; a query nobody asked before is decided once, on first read, and stored then. A run stored or
changed since makes a decision stale: it is made again.

The choice is the one a quick session confirms: the best drafting policy where it beats the recommender's fixed γ
and the engine runs it, else the fixed γ of the recommendation (engine.service.decide.evidence.recommend_from_store),
else off.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.core.policy import parse_policy
from engine.engines import registry
from engine.errors import SpectuneError
from engine.service.decide.analysis import Analysis, analyse
from engine.service.report.measurement_notes import floor_note
from engine.service.report.runs import configuration_run, run_verdict
from engine.session.spec import session_engine
from engine.session.summarise import run_speedup, stored_speedup_flag
from store.errors import StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecisionQuery:
    """What a decision answers: the Recommend page's inputs (None: the default, or what the sessions measured)."""

    objective: str = "latency"
    batch_size: int = 1
    temperature: float | None = None
    budget: float | None = None
    price_per_hour: float | None = None
    regime_override: str | None = None
    engine: str | None = None

    @classmethod
    def of_session(cls, serving_batch: int, temperature: float) -> DecisionQuery:
        """What a session answers when it ends: the default objective at its serving batch and one temperature."""
        return cls(batch_size=int(serving_batch), temperature=float(temperature))

    def key(self) -> str:
        """The query as one stable string (the store's key)."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class Decision:
    """A stored decision: the configuration (None: speculation off) and everything every reader shows of it."""

    query: dict[str, Any]
    configuration: str | None  # 'ngram γ=2', 'qwen2.5-coder-0.5b confidence:0.6:4:0'; None when off
    draft: str | None
    gamma: int  # the fixed γ, or a policy's closest fixed γ; 0 when off
    policy: str | None
    temperature: float
    predicted_speedup: float | None
    measured: dict[str, Any] | None  # the run that measured it: run_id, session_id, speedup, verdict, flag, noisy
    runner_up: dict[str, Any] | None  # configuration and predicted_speedup of the next best
    regime: str
    floor: dict[str, Any] | None  # holds, sentence (every session's floor; holds only when all hold)
    notes: list[str] = field(default_factory=list)

    @property
    def off(self) -> bool:
        """Is the decision speculation off?"""
        return self.configuration is None

    def measured_words(self) -> str:
        """'measured 1.23× over the whole run (faster)', or 'not measured'."""
        m = self.measured
        if not m or m.get("speedup") is None:
            return "not measured: no run of this configuration is stored"
        if m.get("flag"):
            return f"measured {m['speedup']:.2f}×, impossible (a measurement error), not used"
        verdict = "too noisy to tell" if m.get("noisy") else (m.get("verdict") or "")
        return f"measured {m['speedup']:.2f}× over the whole run" + (f" ({verdict})" if verdict else "")

    def headline(self) -> str:
        """The decision in one sentence, the same on every page, in the CLI, the report and the exports."""
        at = f"T={self.temperature:g}"
        if self.off:
            best = self.runner_up
            why = (
                f"; the best candidate, {best['configuration']}, predicts {best['predicted_speedup']:.2f}×"
                if best and best.get("predicted_speedup") is not None
                else ""
            )
            return f"Speculation off at {at}: serve the target alone{why}."
        predicted = f"predicted {self.predicted_speedup:.2f}×" if self.predicted_speedup is not None else ""
        return f"{self.configuration} at {at}: {predicted}, {self.measured_words()}."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})  # type: ignore[arg-type]


def decision_for(
    store: Any,
    session_ids: Sequence[int],
    query: DecisionQuery,
    in_progress: int | None = None,
    recommended: tuple[Any, Any, Any] | None = None,
) -> Decision:
    """The stored decision for the query over these sessions (decided(), its analysis left aside). SpectuneError
    when the sessions give nothing to decide from."""
    decision, _ = decided(store, session_ids, query, in_progress, recommended)
    if decision is None:
        raise SpectuneError("nothing to decide from: no draft was measured in these sessions")
    return decision


def decided(
    store: Any,
    session_ids: Sequence[int],
    query: DecisionQuery,
    in_progress: int | None = None,
    recommended: tuple[Any, Any, Any] | None = None,
) -> tuple[Decision | None, Analysis]:
    """The stored decision for the query over these sessions and the analysis it was made from; both made and
    stored when none is, or when a run was stored since they were made. Sessions not yet finished (`in_progress`,
    or any not done) are decided, never stored: their runs are still coming. `recommended`: the (recommendation,
    evidence, regime report) a caller already made for this very query, used instead of making it again. A store
    that cannot be written (read-only, or another reader stored the same decision a moment before) still gets the
    decision, unstored. The decision is None when the analysis names no draft to decide on (nothing is stored
    then). SpectuneError when the sessions give nothing to recommend from."""
    ids = sorted({int(i) for i in session_ids})
    query = canonical(store, ids, query)
    seen, rows = store.newest_run_id(ids), evidence_key(store, ids)
    if in_progress is None and (kept := _stored(store, ids, query, seen, rows)) is not None:
        return kept
    analysis = analyse(store, ids, query, in_progress, recommended)
    decision = decide(store, ids, query, analysis) if analysis.policies.recommendation is not None else None
    if (
        decision is not None
        and in_progress is None
        and not getattr(store, "read_only", False)
        and _all_finished(store, ids)
    ):
        kept = decision.to_dict() | {"analysis": analysis.to_dict(), "evidence_key": rows}
        try:
            store.save_decision(ids, query.key(), seen, kept)
        except StoreError as exc:
            log.warning("decision for sessions %s not stored: %s", ids, exc)
    return decision, analysis


def evidence_key(store: Any, ids: Sequence[int]) -> str:
    """A digest of every stored row a decision rests on (the sessions and their runs, as stored now): a row changed
    since (a run marked too noisy, a regime measured, costs recorded) makes a stored decision stale."""
    digest = hashlib.sha256()
    for sid in sorted({int(i) for i in ids}):
        rows = [store.get_session(sid), *store.list_runs(sid)]
        digest.update(json.dumps(rows, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _stored(
    store: Any, ids: Sequence[int], query: DecisionQuery, seen: int, rows: str
) -> tuple[Decision, Analysis] | None:
    """The decision and analysis stored for the query, when made from the rows stored now and readable."""
    stored = store.get_decision(ids, query.key())
    if stored is None or int(stored["runs_seen"]) != seen or stored["payload"].get("evidence_key") != rows:
        return None
    try:
        return Decision.from_dict(stored["payload"]), Analysis.from_dict(stored["payload"]["analysis"])
    except (TypeError, KeyError, ValueError) as exc:  # stored by another version of the records: made again
        log.info("decision for sessions %s made again: its stored analysis does not read (%s)", ids, exc)
        return None


def canonical(store: Any, ids: Sequence[int], query: DecisionQuery) -> DecisionQuery:
    """The query as the sessions resolve it, so one question has one key: the engine whose measurements count
    (evidence.choose_engine), the sessions' single temperature where none was given."""
    from engine.service.decide.evidence import choose_engine

    engine = choose_engine(store, list(ids), query.engine)
    temperature = query.temperature
    if temperature is None:
        found = {float(t) for sid in ids for t in ((store.get_session(sid) or {}).get("temperatures") or [0.0])}
        temperature = found.pop() if len(found) == 1 else None
    return replace(query, engine=engine, temperature=None if temperature is None else float(temperature))


def _all_finished(store: Any, ids: Sequence[int]) -> bool:
    rows = [store.get_session(i) for i in ids]
    return all(row is not None and row.get("status") in ("done", "failed", "cancelled", "interrupted") for row in rows)


def make_decision(
    store: Any,
    session_ids: Sequence[int],
    query: DecisionQuery,
    in_progress: int | None = None,
    recommended: tuple[Any, Any, Any] | None = None,
) -> Decision:
    """Decide once, unstored: the analysis of the query (engine.service.decide.analysis.analyse), then decide()."""
    ids = list(session_ids)
    return decide(store, ids, query, analyse(store, ids, query, in_progress, recommended))


def decide(store: Any, session_ids: Sequence[int], query: DecisionQuery, analysis: Analysis) -> Decision:
    """The decision an analysis leads to: the recommender's fixed γ or a replayed policy, the best that pays and
    runs in the engine chosen, with what measured it."""
    from engine.service.decide.policies import recommendation_for

    ids = list(session_ids)
    report = analysis.policies
    rec = report.recommendation
    if rec is None:
        raise SpectuneError("nothing to decide from: no draft was measured in these sessions")
    fixed = None if rec.off else _option(rec.draft_name, rec.gamma, None, rec.predicted_speedup)
    policy = _runnable_policy(report, store, ids)
    chosen, runner_up = fixed, None
    if policy is not None and (fixed is None or policy["predicted_speedup"] > fixed["predicted_speedup"]):
        chosen, runner_up = policy, fixed
    elif fixed is not None:
        runner_up = policy or _next_draft(rec)
    else:
        best = recommendation_for(report)
        runner_up = (
            None
            if best is None or best.draft_name is None
            else _option(best.draft_name, best.gamma, None, best.predicted_speedup)
        )
    temperature = float(rec.temperature)
    runs = [r for sid in ids for r in store.list_runs(sid)]
    return Decision(
        query=asdict(query),
        configuration=None if chosen is None else chosen["configuration"],
        draft=None if chosen is None else chosen["draft"],
        gamma=0 if chosen is None else int(chosen["gamma"]),
        policy=None if chosen is None else chosen["policy"],
        temperature=temperature,
        predicted_speedup=None if chosen is None else chosen["predicted_speedup"],
        measured=None if chosen is None else measured_run(store, runs, chosen, temperature),
        runner_up=runner_up,
        regime=report.regime,
        floor=sessions_floor(store, ids),
        notes=list(rec.notes),
    )


def _option(draft: str | None, gamma: int, policy: str | None, predicted: float) -> dict[str, Any]:
    label = f"{draft} {policy}" if policy else f"{draft} γ={gamma}"
    return {
        "configuration": label,
        "draft": draft,
        "gamma": int(gamma),
        "policy": policy,
        "predicted_speedup": round(float(predicted), 4),
    }


def _runnable_policy(report: Any, store: Any, ids: Sequence[int]) -> dict[str, Any] | None:
    """The best replayed policy when it is a policy (not a fixed γ), may be recommended, and runs in the engine the
    sessions measured with; else None."""
    best, chosen = report.best, report.chosen
    if best is None or chosen is None or not best.feasible:
        return None
    policy = parse_policy(best.policy)
    if policy.fixed_gamma() is not None:
        return None
    entry = registry.get(session_engine(store.get_session(int(ids[0])) or {}))
    if not entry.runs_policies or (entry.runs_policy is not None and not entry.runs_policy(best.policy)):
        return None
    closest = int(report.best_fixed.policy.split(":")[1]) if report.best_fixed is not None else 0
    return _option(chosen.draft, closest, policy.spec(), best.predicted_speedup)


def _next_draft(rec: Any) -> dict[str, Any] | None:
    """The best other draft of the recommender's comparison that pays, as the runner-up."""
    others = [s for s in rec.comparison if s.name != rec.draft_name and s.pays and s.best_gamma >= 1]
    if not others:
        return None
    best = max(others, key=lambda s: s.best_speedup)
    return _option(best.name, best.best_gamma, None, best.best_speedup)


def measured_run(
    store: Any, runs: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any], temperature: float
) -> dict[str, Any] | None:
    """The newest stored run of the chosen configuration, as every page shows it; None when none was measured. A
    session whose floor does not hold makes it too noisy to tell."""
    run = configuration_run(runs, str(chosen["draft"]), int(chosen["gamma"]), temperature, chosen.get("policy"))
    if run is None:
        return None
    speedup = run_speedup(run)
    note = floor_note((store.get_session(int(run["session_id"])) or {}).get("summary"))
    verdict = run_verdict(run)
    noisy = bool(note is not None and note.off) or bool(verdict and verdict.startswith("too noisy"))
    return {
        "run_id": int(run["id"]),
        "session_id": int(run["session_id"]),
        "speedup": None if speedup is None else round(float(speedup), 4),
        "verdict": verdict,
        "flag": stored_speedup_flag(run),
        "noisy": noisy,
    }


def sessions_floor(store: Any, ids: Sequence[int]) -> dict[str, Any] | None:
    """The sessions' measurement floors: each one's sentence, and whether they all hold (None: none measured)."""
    notes = [n for sid in ids if (n := floor_note((store.get_session(int(sid)) or {}).get("summary"))) is not None]
    if not notes:
        return None
    return {"holds": not any(n.off for n in notes), "sentence": " ".join(n.text for n in notes)}


def queue_confirmation(store: Any, session_ids: Sequence[int], decision: Decision) -> int:
    """Queue a session that measures the decision's configuration alone beside the target alone, on the first
    session's prompts and settings; the decision over these sessions and the new one then rests on a measurement.
    Returns the new session's id. SpectuneError when there is nothing to confirm (off) or it was measured."""
    from engine.service.jobs import submit_session
    from engine.session.spec import SessionSpec

    if decision.off or decision.draft is None:
        raise SpectuneError("speculation off: there is no configuration to confirm")
    if decision.measured is not None:
        raise SpectuneError(f"{decision.configuration} is measured already (run {decision.measured['run_id']})")
    session = store.get_session(int(session_ids[0]))
    if session is None or session.get("prompt_set_id") is None:
        raise SpectuneError(f"session {session_ids[0]} and its prompts are gone: nothing to confirm on")
    spec = SessionSpec.from_row(session)
    spec.drafts = [decision.draft]
    spec.gammas = [] if decision.policy else [decision.gamma]
    spec.policies = [decision.policy] if decision.policy else []
    spec.temperatures = [decision.temperature]
    spec.mode, spec.confirm, spec.detect_regime = "full", False, False
    name = f"confirm {decision.configuration} (from {', '.join(f'#{i}' for i in session_ids)})"
    return submit_session(store, spec, int(session["prompt_set_id"]), session.get("n_prompts"), name)
