"""What every speculation policy shares: the protocol the decoding loop calls, the neutral words engines read of a
policy, and the record a policy kind registers (engine.core.policy holds the registry)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

GO, KEEP, DROP = "go", "keep", "drop"  # stop() answers: draft on; stop after this token; stop before it
MAX_DRAFT = 64  # no policy drafts more per step (the session's largest γ)

Stop = Callable[[int, float], str]  # (1-based drafted position, the draft's confidence) -> GO | KEEP | DROP


@dataclass(frozen=True)
class DraftControls:
    """A policy in the words of engines' own draft-length settings; what an engine or export format can run of a
    policy is read from here, never from the policy's class.

    `beyond` names what the policy does that no draft-length setting says, each as (what is missing, what the
    policy does instead), e.g. ("acceptance-driven γ", "SGLang's EMA rule")."""

    n_max: int  # the most tokens a step drafts (a schedule's starting length)
    n_min: int = 0  # drafts shorter than this are discarded
    p_min: float = 0.0  # stop at the first drafted token whose confidence is below it (0: never)
    keeps_unsure: bool = False  # the token below p_min is kept, drafting stops after it (else it is dropped)
    schedule: str | None = None  # a named draft-length schedule from n_max some engines run ("heuristic")
    beyond: tuple[tuple[str, str], ...] = ()

    @property
    def plain(self) -> bool:
        """Only a length cap, an n-min and a confidence stop that drops: what every draft-model engine runs."""
        return self.schedule is None and not self.beyond and not self.keeps_unsure


@dataclass(frozen=True)
class GridAsk:
    """What the policy replay asks each kind for: the settings it should try."""

    max_gamma: int = 32
    confidence: bool = True  # the draft reports its confidence (a draft model, not a lookup)
    schedule: Mapping[int, int] | None = None  # {serving batch: γ} measured by the session, when any
    serving_batch: int = 1


@dataclass(frozen=True)
class PolicyKind:
    """One kind of speculation policy, registered once: how its spec string is read, what it is, which settings
    the replay tries, and how simple it is (ties in a ranking go to the simpler kind, lower first)."""

    name: str
    grammar: str  # its spec string, e.g. "confidence:P[:NMAX[:NMIN[:keep]]]"
    summary: str  # what it does, in a few words
    parse: Callable[[str, int], SpeculationPolicy]  # (the text after "name:", the default γ) -> the policy
    grid: Callable[[GridAsk], list[SpeculationPolicy]]
    simplicity: int


class SpeculationPolicy(Protocol):
    kind: ClassVar[str]
    uses_confidence: ClassVar[bool]
    varies_per_step: ClassVar[bool]  # its γ can change from one step to the next (not only with the batch size)
    carries_state: ClassVar[bool]  # its γ depends on what earlier steps accepted (a replay must keep its order)

    def fixed_gamma(self) -> int | None:
        """The one γ it drafts at every step and every batch size; None where its γ varies."""

    def batch_schedule(self) -> dict[int, int] | None:
        """{serving batch: γ} where its γ is chosen by the batch size; None otherwise."""

    @property
    def min_draft(self) -> int:
        """Drafts shorter than this are discarded (0: keep every draft)."""

    def spec(self) -> str:
        """The spec string parse_policy reads back."""

    def max_draft(self) -> int:
        """The most tokens one step may draft."""

    def start(self) -> Any:
        """The state before the first step of a run."""

    def length(self, state: Any) -> int:
        """How many tokens to draft this step (at most)."""

    def stop(self, position: int, confidence: float) -> str:
        """After drafting token `position` (1-based) with this confidence: GO, KEEP or DROP."""

    def update(self, state: Any, drafted: int, accepted: int) -> Any:
        """The state after a step that drafted `drafted` tokens of which the target accepted `accepted`."""

    def describe(self) -> str:
        """A short human label for its setting ('p=0.6, n-max 16, n-min 2')."""

    def controls(self) -> DraftControls:
        """What it asks of an engine's own draft-length settings, in neutral words (engines and export formats
        read what they can express of it from here)."""


def go(position: int, confidence: float) -> str:
    """A stop rule that never stops: draft the full length."""
    return GO


def number(text: str, kind: type, what: str) -> Any:
    """``text`` read as ``kind`` (int or float), finite; ValueError naming ``what`` otherwise."""
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{what}: '{text}' is not a {'whole number' if kind is int else 'number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}: '{text}' is not finite")
    return value
