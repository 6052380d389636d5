"""The engine registry: one entry per engine, one spelling each, and the only place an engine is chosen by name.

Adding an engine: a Runner module beside this one and one `register(EngineEntry(...))` line below.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.engine_options import EngineOptions
from engine.engines.endpoint.settings import EndpointSessionSettings
from engine.engines.spectune.options import LoopOptions
from engine.engines.vllm.options import VllmOptions
from engine.errors import SettingsError
from engine.models.pool import ModelPool
from engine.session.hooks import Hooks
from engine.session.runner import PromptText, RunKey, Runner, plan_runs
from engine.session.spec import SessionSpec, register_engine_options
from engine.session.spec import validate as validate_common
from engine.session.sweep import SweepReport, run_sweep


@dataclass(frozen=True)
class EngineEntry:
    """One engine: its stored name, its CLI spelling, how a session in it is validated and measured."""

    name: str  # SessionSpec.engine and the store's spelling
    cli: str  # the --engine choice
    label: str  # what the UI calls it
    validate: Callable[[SessionSpec, int | None], None]
    runner: Callable[[], type[Runner]]  # its Runner class (imported on use)
    in_process: bool = False  # the target runs in this process: the batch sweep and roofline can measure it
    runs_policies: bool = False
    fixed_weights: str | None = None  # what it runs instead of a chosen dtype (llama.cpp: the GGUF as it is)
    export_format: str | None = None  # the export format of this engine itself (its sessions measured that engine)
    runs_policy: Callable[[str], bool] | None = None  # which policies it runs live (None: every one)
    availability: Callable[[], tuple[bool, str]] = lambda: (True, "")  # (usable here, one line saying so)
    batches: bool = False  # batches requests continuously: each configuration is measured at the spec's concurrency
    plan: Callable[[SessionSpec, Sequence[int]], list[RunKey]] = plan_runs  # the configurations a session runs
    deployment: bool = False  # measures a running deployment as it is: no draft or γ of ours to recommend from
    # its loop's step overhead (engine.analysis.step_overhead: what a drafting step costs beyond its forwards, fitted
    # from every engine's runs) grows with the verified width (llama-server's sampler at every position): a quick
    # session probes each draft model at two widths to fit both terms, where one width fits the per-step term
    two_width_probe: bool = False
    # what a session's processes will hold at most, and one sentence saying how (None: its models' weights say it)
    memory: Callable[[SessionSpec, list[RunKey]], tuple[int, str]] | None = None
    # a sentence the estimate adds about the session's setup on this machine (hardware line) before decoding (None)
    setup_note: Callable[[SessionSpec, str], str | None] = lambda spec, hardware: None
    # stops every process of this engine the worker started and says how many (servers): None where it starts none
    stop_processes: Callable[[], int] | None = None
    processes: str = "server(s)"  # what those processes are called, for the worker's log
    options: type[EngineOptions] | None = None  # the type of its own options a spec holds (None: it has none)


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


def get(name: str) -> EngineEntry:
    """The entry for a stored name or a CLI spelling; SettingsError naming the choices otherwise."""
    for entry in _ENTRIES.values():
        if name in (entry.name, entry.cli):
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
    chosen = None
    for entry in _ENTRIES.values():
        if entry.options is not None and not entry.deployment:
            options = entry.options.from_values(values).checked(None)
            chosen = options if entry is get(name) else chosen
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


def replays_like_llamacpp(name: str) -> bool:
    """Whether the engine drafts in llama-server's loop (the policy replay models that loop for its sessions)."""
    return get(name).runner().replays_like_llamacpp


def levels_of(spec: SessionSpec) -> list[int]:
    """The concurrency levels a session's configurations are measured at in its engine."""
    return list(spec.concurrency) if get(spec.engine).batches else [1]


def sweep(
    spec: SessionSpec, prompts: Sequence[PromptText], hooks: Hooks | None = None, pool: ModelPool | None = None,
    plan: list[RunKey] | None = None, verify_cost: dict[int, float] | None = None, traces: bool = True,
    aa_check: bool = True,
) -> SweepReport:  # fmt: skip
    """Validate `spec` for its engine and run its sweep there: the engine's plan, or `plan` (a quick session's
    probe or confirmation); `verify_cost` measured before in the session is not measured again, nor the traces
    when `traces` is False, nor the A/A check when `aa_check` is False."""
    validate(spec, len(prompts))
    entry = get(spec.engine)
    levels = levels_of(spec)
    chosen = plan if plan is not None else entry.plan(spec, levels)
    return run_sweep(runner_for(spec, pool), spec, prompts, hooks, levels, chosen, verify_cost, traces, aa_check)


def _spectune() -> Any:
    from engine.engines.spectune.runner import SpectuneRunner

    return SpectuneRunner


def _llamacpp() -> Any:
    from engine.engines.llamacpp.runner import LlamaCppRunner

    return LlamaCppRunner


def _llamacpp_runs(policy: str) -> bool:
    from engine.engines.llamacpp.policy_flags import llamacpp_fields

    return llamacpp_fields(policy) is not None


def _llamacpp_memory(spec: SessionSpec, plan: list[RunKey]) -> tuple[int, str]:
    from engine.engines.llamacpp.runner import memory_before

    return memory_before(spec, plan)


def _validate_llamacpp(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.llamacpp.runner import validate_llamacpp

    validate_llamacpp(spec, n_prompts)


def _vllm() -> Any:
    from engine.engines.vllm.runner import VllmRunner

    return VllmRunner


def _validate_vllm(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.vllm.runner import validate_vllm

    validate_vllm(spec, n_prompts)


def _vllm_availability() -> tuple[bool, str]:
    from engine.engines.vllm.binaries import vllm_status

    found, line = vllm_status()
    if found is None:
        return False, f"vLLM is not available: {line}"
    return True, f"{line}: tokens/s, TTFT and acceptance at each concurrency; β per position is not reported."


def _endpoint() -> Any:
    from engine.engines.endpoint.runner import EndpointRunner

    return EndpointRunner


def _validate_endpoint(spec: SessionSpec, n_prompts: int | None = None) -> None:
    from engine.engines.endpoint.runner import validate_endpoint

    validate_endpoint(spec, n_prompts)


def _plan_endpoint(spec: SessionSpec, levels: Sequence[int]) -> list[RunKey]:
    from engine.engines.endpoint.runner import plan_endpoint

    return plan_endpoint(spec, levels)


SPECTUNE_NOTE = "Exact β per position, top logits and fp32 fidelity verdicts; speed of the PyTorch loop."


def _spectune_setup(spec: SessionSpec, hardware: str) -> str | None:
    from engine.engines.spectune.loop import setup_note

    return setup_note(spec, hardware)


def _llamacpp_stop_all() -> int:
    from engine.engines.llamacpp.server import stop_all

    return stop_all()


def _vllm_stop_all() -> int:
    from engine.engines.vllm.server import stop_all

    return stop_all()


def _llamacpp_availability() -> tuple[bool, str]:
    from engine.engines.llamacpp.binaries import llama_status

    build, line = llama_status()
    if build is None:
        return False, f"llama.cpp is not available: {line}"
    return True, f"{line}: c, v(k) and speed as llama.cpp measures them; β per position is not reported."


register(EngineEntry(
    "spectune", "spectune", "spectune (PyTorch loop)", validate_common, _spectune, in_process=True,
    runs_policies=True, options=LoopOptions,
    availability=lambda: (True, SPECTUNE_NOTE), setup_note=_spectune_setup,
))  # fmt: skip
register(EngineEntry(
    "llama.cpp", "llamacpp", "llama.cpp (llama-server)", _validate_llamacpp, _llamacpp, runs_policies=True,
    fixed_weights="GGUF as it is (quantised)", availability=_llamacpp_availability, export_format="llamacpp",
    runs_policy=_llamacpp_runs, two_width_probe=True, memory=_llamacpp_memory, stop_processes=_llamacpp_stop_all,
    processes="llama-server process(es)",
))  # fmt: skip
register(EngineEntry(
    "vllm", "vllm", "vLLM (managed server)", _validate_vllm, _vllm, availability=_vllm_availability,
    export_format="vllm", batches=True, stop_processes=_vllm_stop_all, processes="vLLM server(s)", options=VllmOptions,
))  # fmt: skip
register(EngineEntry(
    "endpoint", "endpoint", "a running endpoint (OpenAI-compatible)", _validate_endpoint, _endpoint,
    plan=_plan_endpoint, deployment=True, options=EndpointSessionSettings,
))  # fmt: skip
