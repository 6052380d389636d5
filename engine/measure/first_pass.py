"""Whether a loop's first pass over a prompt costs more than a later one, measured in the session that would pay it.

A loop whose shapes grow with the sequence (the eager loop) may run a prompt's first decode slower than every later
one: a kernel built per new shape, memory first touched. A prime (the target alone over the prompt, untimed) absorbs
that cost; where there is none, the prime is one more decode per prompt for nothing. So the prime is measured:
each primed prompt's prime (its first pass) per step beside the same prompt's timed target-alone decode (a later pass
over the same lengths), per step. Once FIRST_PASS_PROMPTS prompts are in and their median first ÷ later pass is within
FIRST_PASS_TOLERANCE of 1, the rest of the session decodes unprimed; otherwise every prompt is primed. The A/A floor
still checks the session either way (engine.session.aa_check)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

FIRST_PASS_PROMPTS = 3  # prompts primed and compared before the prime may stop: the median of 3 outlasts one outlier
FIRST_PASS_TOLERANCE = 0.05  # a first pass at most this much slower than a later one costs nothing worth a prime


@dataclass
class FirstPass:
    """Each primed prompt's first ÷ later pass, per step, and whether the next prompt still needs its prime."""

    prime_ms: dict[int, float] = field(default_factory=dict)  # per primed prompt: its prime's ms per step
    ratios: dict[int, float] = field(default_factory=dict)  # per primed prompt since timed: first ÷ later, per step

    @property
    def settled(self) -> bool:
        """FIRST_PASS_PROMPTS prompts are in and their median is within tolerance: no prompt is primed any more
        (so no ratio comes in after, and it stays settled)."""
        return len(self.ratios) >= FIRST_PASS_PROMPTS and self.median() <= 1.0 + FIRST_PASS_TOLERANCE

    def needs_prime(self) -> bool:
        """Whether the next prompt is primed: always, until the first pass is measured to cost nothing."""
        return not self.settled

    def primed(self, index: int, ms_per_step: float) -> None:
        """Prompt `index`'s prime took `ms_per_step` per step."""
        if ms_per_step > 0:
            self.prime_ms[index] = ms_per_step

    def timed(self, index: int, ms_per_step: float) -> None:
        """Prompt `index`'s target alone, timed after its prime, took `ms_per_step` per step (once per prompt)."""
        first = self.prime_ms.get(index)
        if first is None or ms_per_step <= 0 or index in self.ratios:
            return
        self.ratios[index] = first / ms_per_step

    def median(self) -> float:
        return median(self.ratios.values()) if self.ratios else float("nan")

    def sentence(self, n_prompts: int) -> str | None:
        """first_pass_sentence of this record; None before any ratio."""
        return first_pass_sentence(self.to_dict(n_prompts))

    def to_dict(self, n_prompts: int) -> dict[str, object]:
        return {
            "primed": len(self.prime_ms),
            "prompts": n_prompts,
            "settled": self.settled,
            "first_over_later": [round(r, 4) for r in self.ratios.values()],
        }


def first_pass_sentence(stored: Mapping[str, Any] | None) -> str | None:
    """'Primed 3 of 10 prompts: a prompt's first pass took 1.00× (0.99–1.02×, 3 prompts) the time of a later one,
    within 5%, so the rest decoded unprimed …' from a FirstPass record (to_dict, as a report keeps it); None before
    any ratio."""
    values = [float(r) for r in (stored or {}).get("first_over_later") or []]
    if not values:
        return None
    spread = f"{median(values):.2f}× ({min(values):.2f}–{max(values):.2f}×, {len(values)} prompts)"
    primed = f"Primed {stored['primed']} of {stored['prompts']} prompts: a prompt's first pass took {spread} the time"
    if stored.get("settled"):
        return (
            f"{primed} of a later one, within {FIRST_PASS_TOLERANCE:.0%}, so the rest decoded unprimed "
            f"(the A/A floor checks them too)."
        )
    return f"{primed} of a later one, so every prompt was primed before its timed decodes."
