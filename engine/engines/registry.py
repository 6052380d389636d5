"""The engine registry: one entry per engine, one spelling each, and the only place an engine is chosen by name.

Adding an engine: a package beside this module (engine/engines/NAME/: its runner, its parts, its `entry.py` holding
its EngineEntry) and its entry in ENGINES below, in the order the UI lists them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from engine.analysis.prediction import DraftingLoop
from engine.core.engine_options import EngineOptions
from engine.engines.endpoint.entry import ENTRY as ENDPOINT
from engine.engines.entry import EngineEntry
from engine.engines.llamacpp.entry import ENTRY as LLAMACPP
from engine.engines.spectune.entry import ENTRY as SPECTUNE
from engine.engines.vllm.entry import ENTRY as VLLM
from engine.errors import SettingsError
from engine.models.pool import ModelPool
from engine.session.hooks import Hooks
from engine.session.runner import PromptText, RunKey, Runner
from engine.session.spec import SessionSpec, register_engine_options
from engine.session.sweep import SweepReport, run_sweep

_ENTRIES: dict[str, EngineEntry] = {}


def register(entry: EngineEntry) -> None:
    _ENTRIES[entry.name] = entry
    if entry.options is not None:
        register_engine_options(entry.name, entry.options)


def stop_all_processes() -> dict[str, int]:
    """Stop every process any engine started, the worker's last act: what they are -> how many."""
    stopped = {}
    for entry in _ENTRIES.values():
        if entry.stop_processes is not None and (count := entry.stop_processes()):
            stopped[entry.processes] = count
    return stopped


def names() -> tuple[str, ...]:
    """Every engine's stored name, in registration order."""
    return tuple(_ENTRIES)


def sweep_engines() -> tuple[str, ...]:
    """The engines that sweep drafts and γ themselves (a recommendation can come from their measurements)."""
    return tuple(name for name, entry in _ENTRIES.items() if not entry.deployment)


def sweep_cli_choices() -> tuple[str, ...]:
    """The --engine choices of the commands that run or recommend from a sweep."""
    return tuple(entry.cli for entry in _ENTRIES.values() if not entry.deployment)


def find(name: str) -> EngineEntry | None:
    """The entry for a stored name or a CLI spelling; None for a name no engine registers (a row from elsewhere)."""
    return next((entry for entry in _ENTRIES.values() if name in (entry.name, entry.cli)), None)


def get(name: str) -> EngineEntry:
    """The entry for a stored name or a CLI spelling; SettingsError naming the choices otherwise."""
    entry = find(name)
    if entry is not None:
        return entry
    raise SettingsError(f"engine '{name}': choose one of {', '.join(names())}")


def engine_from_cli(choice: str) -> str:
    """The stored name for a CLI --engine choice (llamacpp → llama.cpp)."""
    return get(choice).name


def validate(spec: SessionSpec, n_prompts: int | None = None) -> SessionSpec:
    """The spec checked by its engine (the engine named first), its own options typed and checked last."""
    entry = get(spec.engine)
    entry.validate(spec, n_prompts)
    spec.engine_options = options_of(entry, spec)
    return spec


def options_of(entry: EngineEntry, spec: SessionSpec) -> EngineOptions | None:
    """The spec's options as `entry`'s type, checked; SettingsError for another engine's options."""
    given = spec.engine_options
    if entry.options is None:
        if given:
            raise SettingsError(f"{entry.label} takes no options of its own, not {type(given).__name__}")
        return None
    if given is not None and not isinstance(given, entry.options | Mapping):
        raise SettingsError(f"{entry.label} takes {entry.options.__name__}, not {type(given).__name__}")
    return entry.options.of(spec).checked(spec)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Every sweeping engine's own flags, on `run` and `submit`."""
    for options in dict.fromkeys(e.options for e in _ENTRIES.values() if e.options and not e.deployment):
        options.add_arguments(parser)


def options_from_values(name: str, values: Mapping[str, Any]) -> EngineOptions | None:
    """The options of a session in engine `name`, from the CLI's arguments or the Run form's values by name. Every
    sweeping engine's own values are checked, so a bad one is refused even where another engine runs."""
    wanted, chosen = get(name), None
    for entry in _ENTRIES.values():
        if entry.options is not None and not entry.deployment:
            options = entry.options.from_values(values).checked(None)
            chosen = options if entry is wanted else chosen
    return chosen


def runner_for(spec: SessionSpec, pool: ModelPool | None = None) -> Runner:
    return get(spec.engine).runner()(pool=pool or ModelPool())


DEFAULT_LEVELS = (1, 2, 4, 8)


def concurrency_for(name: str, levels: Sequence[int] | None) -> list[int]:
    """The concurrency levels a session in engine `name` is measured at: those given, else 1, 2, 4, 8 for an engine
    that batches and 1 elsewhere; levels above 1 for one that does not batch are refused."""
    entry = get(name)
    chosen = list(levels) if levels else list(DEFAULT_LEVELS if entry.batches else (1,))
    if not entry.batches and chosen != [1]:
        raise SettingsError(f"{entry.label} decodes one request at a time: concurrency levels need vLLM")
    return chosen


def engine_for_format(fmt: str) -> str | None:
    """The session engine whose own export format `fmt` is (its sessions measured what that file runs), if any."""
    return next((name for name, entry in _ENTRIES.items() if entry.export_format == fmt), None)


def drafting_loop(name: str) -> DraftingLoop:
    """How the engine's drafting loop reads confidence and counts calls (the policy replay models it)."""
    return get(name).runner().drafting_loop


def levels_of(spec: SessionSpec) -> list[int]:
    """The concurrency levels a session's configurations are measured at in its engine."""
    return get(spec.engine).levels(spec)


def sweep(
    spec: SessionSpec,
    prompts: Sequence[PromptText],
    hooks: Hooks | None = None,
    pool: ModelPool | None = None,
    plan: list[RunKey] | None = None,
    verify_cost: dict[int, float] | None = None,
    traces: bool = True,
    aa_check: bool = True,
) -> SweepReport:
    """Validate `spec` for its engine and run its sweep there: the engine's plan, or `plan` (a quick session's
    probe or confirmation); `verify_cost` measured before in the session is not measured again, nor the traces
    when `traces` is False, nor the A/A check when `aa_check` is False."""
    validate(spec, len(prompts))
    entry = get(spec.engine)
    levels = levels_of(spec)
    chosen = plan if plan is not None else entry.plan(spec, levels)
    return run_sweep(runner_for(spec, pool), spec, prompts, hooks, levels, chosen, verify_cost, traces, aa_check)


ENGINES: tuple[EngineEntry, ...] = (SPECTUNE, LLAMACPP, VLLM, ENDPOINT)
for _entry in ENGINES:
    register(_entry)
