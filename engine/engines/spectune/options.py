"""spectune's loop options: which loop decodes (eager, compiled, or measured per machine) and its CPU threads."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.engine_options import EngineOptions
from engine.errors import SettingsError

LOOPS = ("auto", "eager", "compiled")  # engine.core.compiled


@dataclass
class LoopOptions(EngineOptions):
    """spectune's own loop: `kind` eager, compiled (a static KV cache, compiled forwards; CUDA graphs on a GPU) or
    auto (a measured probe per machine, target and dtype decides, engine.engines.spectune.loop); `threads` the CPU
    intra-op threads (None: the cores free when the session starts, engine.measure.threads)."""

    stored_as = "loop"

    kind: str = "auto"
    threads: int | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--loop",
            choices=LOOPS,
            default="auto",
            help="spectune's loop: eager, compiled (a static KV cache, compiled forwards; CUDA graphs on a GPU) "
            "or auto (a measured probe per machine, target and dtype decides; SPECTUNE_LOOP overrides it)",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="spectune's CPU threads (default: the cores other processes leave free at the start)",
        )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LoopOptions:
        return cls(values.get("loop") or "auto", values.get("threads"))

    def checked(self, spec: Any = None) -> LoopOptions:
        if self.kind not in LOOPS:
            raise SettingsError(f"loop '{self.kind}': choose {', '.join(LOOPS)}")
        if self.threads is not None and (isinstance(self.threads, bool) or not 1 <= int(self.threads) <= 1024):
            raise SettingsError(f"threads = {self.threads}: 1 to 1024, or none for the cores free at the start")
        return self
