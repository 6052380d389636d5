"""What every page, the CLI and the report say of how a session measured: its floor, its loop and its threads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.measure.first_pass import first_pass_sentence
from engine.measure.noise import MeasurementFloor, MeasurementOverhead


@dataclass(frozen=True)
class FloorNote:
    """The measurement floor's sentence, and whether it marks the session's speedups too noisy to tell."""

    text: str
    off: bool


def floor_note(summary: Mapping[str, Any] | None) -> FloorNote | None:
    """The session's measurement floor (the A/A check) as a sentence; None for a session measured without one."""
    floor = MeasurementFloor.from_dict((summary or {}).get("measurement_floor"))
    if floor is None:
        return None
    return FloorNote(floor.sentence(), not floor.holds)


def loop_note(summary: Mapping[str, Any] | None) -> str | None:
    """'Decoded in the compiled loop (…why…); threads: ….' and what its eager prime measured (first_pass_sentence)
    for a session in spectune's loop, else None."""
    summary = summary or {}
    loop = summary.get("loop")
    if not loop:
        return None
    text = f"Decoded in the {loop} loop ({summary.get('loop_basis') or 'as set'})"
    if summary.get("compile_s"):
        text += f"; compiling took {float(summary['compile_s']):.0f} s"
    if summary.get("threads_basis"):
        text += f"; threads: {summary['threads_basis']}"
    primed = first_pass_sentence(summary.get("first_pass"))
    return text + "." + (f" {primed}" if primed else "")


def overhead_note(summary: Mapping[str, Any] | None) -> str | None:
    """What the prime and the A/A check cost beside the decoding (MeasurementOverhead.sentence); None without it."""
    found = MeasurementOverhead.from_dict((summary or {}).get("measurement_overhead"))
    return None if found is None else found.sentence()
