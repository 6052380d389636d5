"""Each output judged against its baseline's as soon as both are decoded, the target's top asked for on demand.

An output identical to its baseline's costs nothing to judge. Where a greedy output leaves the baseline's, the engine
is asked once for the target's top logits at that position (Runner.reference_at: one forward over the prompt and the
shared prefix), and the margin between the two tokens says whether it is a numerical near-tie or a bug
(engine.measure.fidelity). That time is measuring's, not a configuration's: `spent_s` keeps it."""

from __future__ import annotations

import time
from typing import Any

from engine.core.records import PromptOutput
from engine.measure.fidelity import TargetTop, classify, scorable_divergence
from engine.session.hooks import Hooks
from engine.session.runner import Decoded, RunFailed, RunKey, Runner
from engine.session.summarise import RunTally


class Judge:
    """Fidelity verdicts for a sweep's outputs, asking `runner` for the target's top only where one diverges."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.tops: dict[tuple[int, tuple[int, ...]], TargetTop | None] = {}
        self.spent_s = 0.0  # wall seconds spent asking for the target's top

    def divergence(self, index: int, baseline: PromptOutput, output: PromptOutput, greedy: bool) -> dict[str, Any]:
        """How `output` of prompt `index` departs from `baseline` (engine.core.records.Divergence, as a dict)."""
        pos = scorable_divergence(baseline, output, greedy)
        top = self._top(index, baseline.token_ids[:pos]) if pos is not None else None
        return classify(baseline, output, self.runner.dtype, greedy, top).__dict__

    def _top(self, index: int, prefix: list[int]) -> TargetTop | None:
        key = (index, tuple(prefix))
        if key not in self.tops:
            started = time.perf_counter()
            try:
                self.tops[key] = self.runner.reference_at(index, prefix)
            except RunFailed:
                self.tops[key] = None
            self.spent_s += time.perf_counter() - started
        return self.tops[key]

    def ready(
        self,
        tallies: dict[RunKey, RunTally],
        index: int,
        hooks: Hooks,
        waiting: list[tuple[RunKey, Decoded]],
        last: bool = False,
    ) -> list[tuple[RunKey, Decoded]]:
        """Judge each waiting output of prompt `index` against its baseline's and hand it to the hooks, in the order
        decoded; those whose baseline has not decoded the prompt yet keep waiting (`last`: the round is over, the rest
        go without a verdict). Returns what still waits."""
        still: list[tuple[RunKey, Decoded]] = []
        for key, decoded in waiting:
            tally = tallies[key]
            reference = _baseline_output(tallies, key, index)
            if key.kind != "baseline" and reference is None and not last and _baseline_pending(tallies, key, index):
                still.append((key, decoded))
                continue
            divergence = None
            if key.kind != "baseline" and reference is not None and "fidelity" not in self.runner.unavailable:
                divergence = self.divergence(index, reference, decoded.output, key.temperature == 0)
            tally.divergences.append(divergence)
            hooks.output(tally.handle, decoded.output, divergence)
        return still


def _baseline_pending(tallies: dict[RunKey, RunTally], key: RunKey, index: int) -> bool:
    """Whether `key`'s baseline may still decode prompt `index` in this round (it has not, and has not failed)."""
    base = tallies.get(key.baseline())
    return base is not None and base.failed is None and base.enough is None and index not in base.decoded


def _baseline_output(tallies: dict[RunKey, RunTally], key: RunKey, index: int) -> PromptOutput | None:
    """The baseline's output of prompt `index` (None where it has none)."""
    base = tallies.get(key.baseline())
    if base is None or base.failed is not None:
        return None
    return base.by_index.get(index)
