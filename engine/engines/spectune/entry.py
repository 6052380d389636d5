"""spectune's registry entry: its PyTorch loop runs in this process, runs every policy, and reads its own options."""

from __future__ import annotations

from typing import Any

from engine.engines.entry import EngineEntry
from engine.engines.spectune.options import LoopOptions
from engine.session.spec import SessionSpec, validate

NOTE = "Exact β per position, top logits and fp32 fidelity verdicts; speed of the PyTorch loop."


def _runner() -> Any:
    from engine.engines.spectune.runner import SpectuneRunner

    return SpectuneRunner


def _setup_note(spec: SessionSpec, hardware: str) -> str | None:
    from engine.engines.spectune.loop import setup_note

    return setup_note(spec, hardware)


ENTRY = EngineEntry(
    "spectune", "spectune", "spectune (PyTorch loop)", validate, _runner, in_process=True, runs_policies=True,
    options=LoopOptions, availability=lambda: (True, NOTE), setup_note=_setup_note,
)  # fmt: skip
