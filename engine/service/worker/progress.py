"""A session's progress bar across its sweeps, and the time its prompt decodes have left.

A session may run several sweeps (a quick session's probe, then its confirmation in up to two rounds; a full grid
and its confirmation). The bar's total is what was planned when the first sweep started: its decodes and the most
the confirmation can add (the reserve). Later sweeps draw on the reserve; what they did not need counts as done once
the session's decoding is over (the bar fills), so the total never changes. The time left is the session's own pace
(seconds of decoding per decode so far, every sweep together, taken at each prompt's start) times the decodes left,
so it carries on from one sweep to the next rather than starting again, and counts down within a prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DECODING_PHASES = ("decoding", "priming")  # the phases whose time the decodes' pace counts


def _now() -> float:
    return time.monotonic()


def is_decoding_phase(name: str) -> bool:
    """Whether a phase named `name` is part of the prompt decodes ('decoding prompt 3 of 8', 'priming prompt 3…')."""
    return name.startswith(DECODING_PHASES)


class SessionProgress:
    """The bar's (done, total) over every sweep of a session, and the decodes' time left."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or _now
        self._before = (0, 0)  # what earlier sweeps counted, on the bar
        self._sweep = (0, 0)  # the running sweep's own (done, total)
        self._reserved = 0  # decodes later sweeps may add and have not drawn yet (a confirmation not yet decided)
        self._drawing = False  # the running sweep came after the reserve was made: it draws on it
        self._decoding_since: float | None = None  # when the running decoding phase began
        self._decoding_s = 0.0  # seconds spent in decoding phases before it
        self._decoded = 0  # decodes finished while the clock ran
        self._pace: float | None = None  # seconds a decode takes, its share of a prime included

    def reserve(self, decodes: int) -> None:
        """At most `decodes` more decodes follow this sweep: the total counts them from now on."""
        self._reserved = decodes

    def next_sweep(self) -> None:
        """A later sweep starts: what this one counted stays on the bar, and it draws on the reserve."""
        done, total = self._sweep
        if self._drawing:
            self._reserved = max(0, self._reserved - total)
        self._before = (self._before[0] + done, self._before[1] + total)
        self._sweep, self._drawing = (0, 0), True

    def all_decoded(self) -> tuple[int, int]:
        """No sweep follows: the reserve not drawn counts as done; the bar's (done, total)."""
        self.next_sweep()
        self._before = (self._before[0] + self._reserved, self._before[1] + self._reserved)
        self._reserved = 0
        return self.bar()

    def update(self, done: int, total: int) -> tuple[int, int]:
        """The running sweep reports `done` of its `total` decodes; the bar's (done, total)."""
        if done > self._sweep[0] and self._decoding_since is not None:
            self._decoded += done - self._sweep[0]
        self._sweep = (done, total)
        return self.bar()

    def bar(self) -> tuple[int, int]:
        """(done, total) as the bar shows them: a sweep that draws on the reserve adds to the total only beyond it."""
        done, total = self._sweep
        later = max(total, self._reserved) if self._drawing else total + self._reserved
        return self._before[0] + done, self._before[1] + later

    def phase(self, name: str) -> None:
        """A phase starts: the decoding clock runs only while prompts decode, and the pace is taken afresh at each
        prompt's start (its prime), over every decode so far, the primes' time included."""
        now = self._clock()
        if self._decoding_since is not None:
            self._decoding_s += now - self._decoding_since
            self._decoding_since = None
        if is_decoding_phase(name):
            self._decoding_since = now
        if name.startswith("priming") and self._decoded:
            self._pace = self._decoding_s / self._decoded

    def eta_s(self) -> float | None:
        """Seconds the decodes left will take at the session's pace; None until a whole prompt has decoded."""
        if self._pace is None:
            return None
        done, total = self.bar()
        return self._pace * max(0, total - done)
