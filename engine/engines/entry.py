"""An engine's registry entry: its names, how a session in it is validated and measured, and what it can do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.core.engine_options import EngineOptions
from engine.session.runner import RunKey, Runner, plan_runs
from engine.session.spec import SessionSpec


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

    def levels(self, spec: SessionSpec) -> list[int]:
        """The concurrency levels a session's configurations are measured at in this engine."""
        return list(spec.concurrency) if self.batches else [1]
