"""A sweep's callbacks (the worker maps them onto the store) and the clock that names its phases."""

from __future__ import annotations

import time
from typing import Any

from engine.core.records import PromptOutput, StepRecord
from engine.session.summary import RunSummary


class Hooks:
    """Callbacks for a sweep; the defaults do nothing."""

    def run_started(self, key: dict[str, Any]) -> Any:
        return None

    def step(self, run: Any, record: StepRecord) -> None:
        pass

    def output(self, run: Any, output: PromptOutput, divergence: dict | None) -> None:
        pass

    def run_finished(self, run: Any, summary: RunSummary) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass

    def next_sweep(self) -> None:
        """A second sweep of the same session follows (a confirmation): its progress counts on from this one's,
        within the decodes reserved for it."""

    def reserve(self, decodes: int) -> None:
        """At most `decodes` more prompt decodes may follow this sweep (a confirmation not yet decided): the
        progress total counts them from now on and never changes; those the later sweeps do not need count as
        done once the session's sweeps are over (all_decoded)."""

    def all_decoded(self) -> None:
        """The session's sweeps are over: the decodes reserved for a later sweep and not needed count as done."""

    def should_stop(self) -> bool:
        return False

    def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
        """What the sweep does now ("loading models", "decoding prompt 3 of 8", "agreement pass", …), its own
        progress (done of total) and an estimate of the seconds it has left (None when unknown)."""

    def requests(self, run: Any, rows: list[dict[str, Any]]) -> None:
        """A deployment's requests, one row each (engine.engines.endpoint.results.RequestResult), as they finish."""

    def run_failed(self, run: Any, message: str) -> None:
        """One configuration could not be measured (e.g. its server crashed); the sweep goes on."""


class PhaseClock:
    """Tells the hooks what the sweep is doing now and keeps how long each kind of phase took."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._since = time.perf_counter()

    def start(self, name: str, done: int, total: int, eta_s: float | None = None) -> None:
        self._close()
        self._name, self._since = _phase_key(name), time.perf_counter()
        self.hooks.phase(name, done, total, eta_s)

    def _close(self) -> None:
        if self._name is not None:
            self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._since
            self._name = None

    def finish(self) -> dict[str, float]:
        self._close()
        return {name: round(seconds, 3) for name, seconds in self.times.items()}


def _phase_key(name: str) -> str:
    """'decoding prompt 3 of 8' → 'decoding', 'starting llama-server 2 of 5' → 'starting llama-server'."""
    for kind in ("decoding", "starting llama-server"):
        if name.startswith(kind):
            return kind
    return name
