"""A re-queued session resumed, not restarted: its earlier runs reopened and what they measured handed back.

When a session whose worker died (or was stopped) runs again, each run its plan starts is matched to the earlier
run of the same configuration (the n-th start of a configuration to its n-th earlier run, so a quick session's
probe and confirmation each find their own). The earlier run is reopened instead of a new one being created, and
every prompt it finished (its output stored) is handed to the sweep as measured: its output, divergence and step
records, which the sweep counts as if decoded now and does not decode again. Steps of a prompt cut off mid-decode
are deleted: that prompt is decoded again, whole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.core.counters import SpecCounters
from engine.core.records import PromptOutput, StepRecord
from engine.session.runner import Decoded

_OUTPUT_FIELDS = ("prompt_index", "prompt_id", "prompt_tokens", "token_ids", "text", "from_draft", "wall_time_s",
                  "steps")  # fmt: skip


@dataclass
class Measured:
    """One prompt an earlier attempt finished in a run: what the sweep counts instead of decoding it again."""

    decoded: Decoded
    divergence: dict[str, Any] | None
    records: list[StepRecord]
    wall_s: float


def run_identity(draft: str, gamma: int, temperature: float, kind: str) -> tuple[str, int, float, str]:
    """What matches a run to an earlier one of the same session: its configuration as the runs table keeps it."""
    return draft, int(gamma), float(temperature), kind


class EarlierRuns:
    """The session's runs from earlier attempts, handed out once each, in the order they were created."""

    def __init__(self, store: Any, session_id: int) -> None:
        self.store = store
        self._left: dict[tuple[str, int, float, str], deque[int]] = {}
        for run in sorted(store.list_runs(session_id), key=lambda r: r["id"]):
            ident = run_identity(run["draft"], run["gamma"], run["temperature"], run["kind"])
            self._left.setdefault(ident, deque()).append(run["id"])

    def take(self, key: dict[str, Any]) -> int | None:
        """The earlier run of this configuration not yet reopened, reopened ('running', its unfinished prompt's
        steps dropped); None when there is none."""
        left = self._left.get(run_identity(key["draft"], key["gamma"], key["temperature"], key["kind"]))
        if not left:
            return None
        run_id = left.popleft()
        self.store.drop_unfinished_prompts(run_id)
        self.store.update_run(run_id, status="running")
        return run_id


def measured_prompts(store: Any, run_id: int) -> dict[int, Measured]:
    """Per prompt index, what an earlier attempt measured in the run (prompts with a stored output only)."""
    steps: dict[int, list[StepRecord]] = {}
    for row in store.run_steps(run_id):
        steps.setdefault(row["prompt_index"], []).append(_step(row))
    outputs = store.get_outputs(run_id)
    return {row["prompt_index"]: _measured(row, steps.get(row["prompt_index"], [])) for row in outputs}


def _step(row: dict[str, Any]) -> StepRecord:
    """A stored step as the record the loop logged (emitted token ids are not stored)."""
    return StepRecord(
        row["prompt_index"],
        row["step_index"],
        row["gamma"],
        row["accepted"],
        list(row["accept_mask"]),
        list(row["beta"]),
        row["draft_time_s"],
        row["verify_time_s"],
        row["draft_forwards"],
        row["emitted"],
        target_calls=row.get("target_calls") or 1,
    )


def _measured(row: dict[str, Any], records: list[StepRecord]) -> Measured:
    """A stored output and its steps as a decode: counters from the steps, its decode time the stored wall time."""
    output = PromptOutput(**{name: row[name] for name in _OUTPUT_FIELDS})
    output.steps = output.steps or len(records)
    counters = SpecCounters()
    for record in records:
        counters.add_step(record.gamma, record.accepted, record.emitted, record.accept_mask, record.target_calls)
    decoded = Decoded(output, counters, float(row["wall_time_s"]))
    return Measured(decoded, row.get("divergence"), records, float(row["wall_time_s"]))
