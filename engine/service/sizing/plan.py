"""What a session plans to measure, counted: its configurations and its prompt decodes, as the progress bar counts.

The estimate, the time budget's sizing and the store's progress total read these, so all three count one plan."""

from __future__ import annotations

from engine.engines import registry
from engine.engines.entry import EngineEntry
from engine.session.aa_check import sweep_decodes
from engine.session.quick import confirm_reserve, confirm_runs, probe_plan
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec


def planned_configurations(spec: SessionSpec) -> int:
    """The most runs the session will measure: its engine's plan, or a quick session's probe and confirmation."""
    return len(planned_runs(spec)) + (_confirmations(spec) if spec.mode == "quick" else optional_configurations(spec))


def optional_configurations(spec: SessionSpec) -> int:
    """The runs a full session confirming its headline adds only when the grid lacks it (a quick one always
    confirms)."""
    return _confirmations(spec) if spec.mode != "quick" and spec.confirm else 0


def _confirmations(spec: SessionSpec) -> int:
    return confirm_runs(spec, registry.levels_of(spec))


def planned_decodes(spec: SessionSpec, n_prompts: int) -> int:
    """The prompt decodes a session plans, as its progress bar counts them: each planned run's and its A/A check's
    (engine.session.aa_check), a confirmation at its most; 0 for a deployment, whose requests are capped by time."""
    entry = registry.get(spec.engine)
    if entry.deployment:
        return 0
    later = confirm_reserve(spec, n_prompts, entry.levels(spec)) if spec.mode == "quick" or spec.confirm else 0
    return sweep_decodes(planned_runs(spec, entry), n_prompts) + later


def planned_runs(spec: SessionSpec, entry: EngineEntry | None = None) -> list[RunKey]:
    """The configurations the session measures before any confirmation: its grid, or a quick session's probe.
    `entry`: its engine's entry, where the caller has it."""
    entry = entry or registry.get(spec.engine)
    levels = entry.levels(spec)
    return probe_plan(spec, levels, entry.two_width_probe) if spec.mode == "quick" else entry.plan(spec, levels)
