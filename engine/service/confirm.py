"""A full session's headline measured before the session ends.

The one model may recommend a γ the grid did not measure (an extrapolation). With `confirm` set, the worker asks it for
its recommendation from the stored grid (what a quick session confirms, engine.service.quick.choices_to_confirm) and,
when that configuration was not measured, runs it live beside the target alone at every level of the session. Up to two
rounds (engine.service.quick.confirm_after): what a round measured is stored like any run, and where it changes the
decision to an unmeasured configuration, that one runs too."""

from __future__ import annotations

import time
from typing import Any

from engine.engines import registry
from engine.models.pool import ModelPool
from engine.service.quick import confirm_after, decision_record, mark_floor
from engine.session.hooks import Hooks
from engine.session.quick import confirm_reserve
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec
from engine.session.sweep import SweepReport


def run_full(
    store: Any, session_id: int, spec: SessionSpec, prompts: list[PromptText], hooks: Hooks, pool: ModelPool
) -> SweepReport:
    """The grid, then (with `spec.confirm`) the headline confirmed where the grid did not measure it; the report's
    `confirmation` says what was chosen, whether it ran, and how it measured."""
    started = time.perf_counter()
    if spec.confirm:
        hooks.reserve(confirm_reserve(spec, len(prompts), registry.levels_of(spec)))
    grid = registry.sweep(spec, prompts, hooks, pool)
    if not spec.confirm or grid.stopped:
        return grid
    hooks.phase("checking the recommendation against the grid", 0, 1, None)
    checked = time.perf_counter()
    report, decision, plan = confirm_after(store, session_id, spec, grid, prompts, hooks, pool)
    mark_floor(store, session_id, report)
    report.confirmation = {
        "ran": [k.label() for k in plan if k.kind != "baseline"],
        **decision_record(report, decision),
        "grid_s": round(checked - started, 1),
        "confirm_s": round(time.perf_counter() - checked, 1),
    }
    return report
