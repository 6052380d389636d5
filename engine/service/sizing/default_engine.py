"""The engine a new session decodes in unless the user picks one: the fastest faithful engine this machine has.

On a GPU, spectune's own loop (exact β per position, CUDA graphs). Without one, an engine that serves the target's
quantised GGUF as it is (llama.cpp's llama-server) where it is installed and the target has a GGUF: on a CPU it
decodes several times faster than the PyTorch loop (bench/README.md, the engine bench). No engine is named here: the
registry's entries say which runs in this process and which serves fixed GGUF weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.analysis.export.refs import prepared_gguf
from engine.engines import registry
from engine.models.bundled import BUNDLED


@dataclass(frozen=True)
class EngineDefault:
    """The default engine's stored name, and one sentence on why when it is not spectune's loop ("" otherwise)."""

    engine: str
    why: str = ""


def has_gguf(target: str) -> bool:
    """Whether the target has a GGUF an engine serving GGUF weights can load: a bundled model (its GGUF is
    assembled on first use), or a .gguf file that exists."""
    return target in BUNDLED or (target.lower().endswith(".gguf") and prepared_gguf(target) is not None)


def own_loop() -> str:
    """spectune's own loop: the engine whose target runs in this process."""
    return next(name for name in registry.sweep_engines() if registry.get(name).in_process)


def default_engine(target: str, hardware: Mapping[str, Any]) -> EngineDefault:
    """The engine a session of `target` defaults to on this machine (`hardware`: engine.measure.hardware's
    description): spectune's loop on a GPU, else the first installed engine serving the target's GGUF."""
    if hardware.get("kind", "cpu") != "cpu" or not has_gguf(target):
        return EngineDefault(own_loop())
    for name in registry.sweep_engines():
        entry = registry.get(name)
        if entry.fixed_weights and entry.availability()[0]:
            return EngineDefault(name, _why(entry.label, Path(target).name))
    return EngineDefault(own_loop())


def _why(label: str, target: str) -> str:
    return (
        f"{label} is the default here: without a GPU it serves {target}'s GGUF several times faster than "
        "spectune's PyTorch loop (bench/README.md), which measures exact β per position."
    )
