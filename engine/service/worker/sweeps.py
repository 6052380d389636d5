"""The sweeps a session runs in the worker, quick or full, and the confirmation that closes either.

- **Quick:** the probe is measured and stored; the one model (the same recommendation and policy replay the
  Recommend and Policies pages show) decides what to confirm, and the confirmation runs live beside the target
  alone (engine.session.quick).
- **Full:** the grid, then, with `confirm` set, the headline the one model recommends from the stored grid runs
  live beside the target alone where the grid did not measure it (an extrapolated γ). Up to two rounds
  (`confirm_after`): what a round measured is stored like any run, and where it changes the decision to an
  unmeasured configuration, that one runs too.
"""

from __future__ import annotations

import time
from typing import Any

from engine.core.policy import parse_policy
from engine.engines import registry
from engine.engines.entry import EngineEntry
from engine.errors import SpectuneError
from engine.measure.noise import floor_off
from engine.models.pool import ModelPool
from engine.session.hooks import Hooks
from engine.session.quick import Choice, ConfirmChoices, confirm_plan, confirm_reserve, merged, probe_plan
from engine.session.runner import PromptText, RunKey
from engine.session.spec import SessionSpec
from engine.session.sweep import SweepReport


def _choices(
    store: Any, session_id: int, spec: SessionSpec, entry: EngineEntry, temperature: float, decision: ConfirmChoices
) -> None:
    """The recommended configuration (a policy when one beats every fixed γ) and the best fixed γ at
    `temperature`, judged for the session's serving batch. The fixed γ is the headline's — the recommendation
    over every draft, n-gram lookup included — and only when that is off the chosen draft's best γ (confirmed to
    show what off means)."""
    from engine.service.decide.policies import recommendation_for, session_policies

    report = session_policies(
        store,
        [session_id],
        batch_size=spec.serving_batch,
        engine=spec.engine,
        temperature=temperature,
        in_progress=session_id,
    )
    headline = report.recommendation
    rec = headline if headline is not None and not headline.off else recommendation_for(report)
    if rec is None or rec.draft_name is None or rec.gamma < 1:
        decision.notes.append(f"T={temperature:g}: nothing to confirm ({'; '.join(report.notes) or 'no draft'})")
        return
    decision.off[temperature] = bool(headline is not None and headline.off)
    fixed = Choice("best fixed γ", rec.draft_name, rec.gamma, temperature, rec.predicted_speedup)
    best = report.best
    policy = parse_policy(best.policy) if best is not None else None
    runnable = (
        policy is not None and entry.runs_policies and (entry.runs_policy is None or entry.runs_policy(best.policy))
    )
    better = best is not None and best.predicted_speedup > rec.predicted_speedup
    if best is not None and policy is not None and policy.fixed_gamma() is None and best.feasible and better:
        assert report.chosen is not None
        if runnable:
            decision.choices.append(
                Choice("recommended", report.chosen.draft, 0, temperature, best.predicted_speedup, policy)
            )
        else:
            decision.notes.append(
                f"T={temperature:g}: the best policy, {best.policy}, does not run in "
                f"{entry.label}: its best fixed γ is confirmed instead"
            )
    decision.choices.append(fixed)


def choices_to_confirm(store: Any, session_id: int, spec: SessionSpec, entry: EngineEntry) -> ConfirmChoices:
    """What the probe's stored runs lead to, per temperature of the session in engine `entry`."""
    decision = ConfirmChoices()
    for temperature in spec.temperatures:
        try:
            _choices(store, session_id, spec, entry, temperature, decision)
        except SpectuneError as exc:
            decision.notes.append(f"T={temperature:g}: nothing to confirm ({exc})")
    return decision


def confirmed_rows(report: SweepReport, decision: ConfirmChoices) -> list[dict[str, Any]]:
    """Each choice with what was measured for it (the confirmation's run, else the probe's): the median of its
    per-prompt ratios (what every page shows), and measured ÷ predicted like with like: its speedup over the whole
    run (tokens/s over every prompt ÷ the baseline's) ÷ the prediction, which is a whole run's (tokens over summed
    step costs)."""
    rows = []
    for choice in decision.choices:
        key = choice.key().as_dict()
        run = next(
            (
                r
                for r in reversed(report.runs)
                if all(r.get(k) == v for k, v in key.items()) and r.get("concurrency", 1) == 1
            ),
            None,
        )
        figures = ((run or {}).get("policy_live") or {}) if choice.policy is not None else (run or {})
        measured, whole = figures.get("speedup_measured"), figures.get("speedup_whole_run")
        ratio = whole / choice.predicted_speedup if whole and choice.predicted_speedup else None
        rows.append(
            choice.to_dict()
            | {
                "measured_speedup": measured,
                "measured_whole_run": whole,
                "measured_over_predicted": ratio,
                "noisy": (run or {}).get("speedup_noisy"),
                "flag": (run or {}).get("speedup_flag"),
            }
        )
    return rows


def measured_keys(report: SweepReport) -> list[RunKey]:
    """The configurations a report measured, as a plan names them (a policy run under its policy)."""
    return [
        RunKey(
            r["draft"],
            r["gamma"],
            r["temperature"],
            parse_policy(r["policy"]) if r.get("policy") else None,
            r.get("concurrency", 1),
        )
        for r in report.runs
    ]


def run_quick(
    store: Any,
    session_id: int,
    spec: SessionSpec,
    entry: EngineEntry,
    prompts: list[PromptText],
    hooks: Hooks,
    pool: ModelPool,
) -> SweepReport:
    """Probe, decide, confirm in engine `entry`; one merged report whose `quick` says what was chosen, why, and
    how it measured."""
    started = time.perf_counter()
    levels = entry.levels(spec)
    plan = probe_plan(spec, levels, entry.two_width_probe)
    hooks.reserve(confirm_reserve(spec, len(prompts), levels))
    probe = registry.sweep(spec, prompts, hooks, pool, plan=plan)
    probed = time.perf_counter()
    hooks.phase("predicting the grid from the probe", 0, 1, None)
    report, decision, _ = confirm_after(store, session_id, spec, entry, probe, prompts, hooks, pool)
    mark_floor(store, session_id, report)
    report.quick = {
        "probe": [k.label() for k in plan],
        **decision_record(report, decision),
        "probe_s": round(probed - started, 1),
        "time_to_confirmed_s": round(time.perf_counter() - started, 1),
    }
    return report


CONFIRM_ROUNDS = 2  # a confirmation that changes the decision confirms the new one, at most this many rounds in all


def confirm_after(
    store: Any,
    session_id: int,
    spec: SessionSpec,
    entry: EngineEntry,
    first: SweepReport,
    prompts: list[PromptText],
    hooks: Hooks,
    pool: ModelPool,
) -> tuple[SweepReport, ConfirmChoices, list[RunKey]]:
    """What the one model decides from the runs `first` stored, and those of its choices `first` did not measure
    run live beside a fresh target alone at every level; then, where what they measured changes the decision to a
    configuration no run measured, that one too, up to CONFIRM_ROUNDS rounds: (one merged report, the decision, every
    confirmation's plan — empty when `first` measured every choice). A confirmation measures no A/A check of its own:
    `first`'s floor is the session's."""
    decision = choices_to_confirm(store, session_id, spec, entry)
    levels = entry.levels(spec)
    plan = confirm_plan(spec, decision, measured_keys(first), levels)
    report, ran = first, list(plan)
    for round_no in range(1, CONFIRM_ROUNDS + 1):
        hooks.next_sweep()
        if not plan:
            hooks.progress(0, 0)  # nothing to confirm: the decodes reserved for it go, and the bar is full
            break
        confirm = registry.sweep(
            spec, prompts, hooks, pool, plan=plan, verify_cost=first.verify_cost, traces=False, aa_check=False
        )  # judged by the floor the first sweep measured
        report = merged(report, confirm)
        if round_no == CONFIRM_ROUNDS or report.stopped:
            break
        plan = changed_plan(store, session_id, spec, decision, measured_keys(report), levels)
        ran += plan
    return report, decision, ran


def changed_plan(
    store: Any, session_id: int, spec: SessionSpec, decision: ConfirmChoices, measured: list[RunKey], levels: list[int]
) -> list[RunKey]:
    """What the decision became once the confirmation's runs were stored, where no run measured it: the new choice
    (added to `decision`, with why) and its plan; [] where the decision stands or is measured."""
    from engine.service.decide.decisions import DecisionQuery, make_decision

    fresh: list[Choice] = []
    for temperature in spec.temperatures:
        query = DecisionQuery.of_session(spec.serving_batch, temperature)
        try:
            now = make_decision(store, [session_id], query, in_progress=session_id)
        except SpectuneError:
            continue
        if now.off or now.measured is not None or now.draft is None or now.predicted_speedup is None:
            continue
        policy = parse_policy(now.policy) if now.policy else None
        choice = Choice("recommended", now.draft, now.gamma, temperature, now.predicted_speedup, policy)
        was = [c.key().label() for c in decision.choices if c.temperature == temperature]
        decision.notes.append(
            f"T={temperature:g}: what the confirmation measured ({', '.join(was)}) changed the "
            f"decision to {now.configuration} (predicted {now.predicted_speedup:.2f}×), which no "
            "run had measured: it was confirmed live too"
        )
        fresh.append(choice)
    decision.choices.extend(fresh)
    return confirm_plan(spec, ConfirmChoices(choices=fresh), measured, levels)


def decision_record(report: SweepReport, decision: ConfirmChoices) -> dict[str, Any]:
    """What a session's summary keeps of a confirmation: each choice as measured, off per temperature, the notes."""
    return {
        "confirmed": confirmed_rows(report, decision),
        "off": {str(t): off for t, off in decision.off.items()},
        "notes": decision.notes,
    }


def mark_floor(store: Any, session_id: int, report: SweepReport) -> None:
    """Where the session's floor over all its sweeps does not hold, every speedup of the session is too noisy to
    tell: the stored runs and the report say so, those a sweep whose own floor held stored included."""
    if not floor_off(report.measurement_floor):
        return
    for run in report.runs:
        _too_noisy(run)
        run["speedup_noisy"] = True
    for run in store.list_runs(session_id):
        summary = dict(run.get("summary") or {})
        if run.get("kind") != "speculative" or not _too_noisy(summary):
            continue
        store.update_run(int(run["id"]), summary=summary)


def _too_noisy(figures: dict[str, Any]) -> bool:
    """Mark a run's spread (a live policy's too) too noisy to tell; whether it had one to mark."""
    marked = False
    for where in (figures, figures.get("policy_live") or {}):
        spread = where.get("speedup_spread")
        if isinstance(spread, dict) and spread.get("verdict") != "too noisy to tell":
            where["speedup_spread"] = {**spread, "verdict": "too noisy to tell"}
            marked = True
    return marked


def run_full(
    store: Any,
    session_id: int,
    spec: SessionSpec,
    entry: EngineEntry,
    prompts: list[PromptText],
    hooks: Hooks,
    pool: ModelPool,
) -> SweepReport:
    """The grid, then (with `spec.confirm`) the headline confirmed where the grid did not measure it; the report's
    `confirmation` says what was chosen, whether it ran, and how it measured."""
    started = time.perf_counter()
    if spec.confirm:
        hooks.reserve(confirm_reserve(spec, len(prompts), entry.levels(spec)))
    grid = registry.sweep(spec, prompts, hooks, pool)
    if not spec.confirm or grid.stopped:
        return grid
    hooks.phase("checking the recommendation against the grid", 0, 1, None)
    checked = time.perf_counter()
    report, decision, plan = confirm_after(store, session_id, spec, entry, grid, prompts, hooks, pool)
    mark_floor(store, session_id, report)
    report.confirmation = {
        "ran": [k.label() for k in plan if k.kind != "baseline"],
        **decision_record(report, decision),
        "grid_s": round(checked - started, 1),
        "confirm_s": round(time.perf_counter() - checked, 1),
    }
    return report
