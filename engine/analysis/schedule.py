"""The γ-by-batch schedule: the γ the recommender would choose for one draft at each serving batch size."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.analysis.choice import best_row, check_args, judge_for
from engine.analysis.curve import gamma_curve
from engine.analysis.recommend_types import DEFAULT_GAMMAS, SCHEDULE_BATCHES, DraftMeasurement
from engine.analysis.theory import MEMORY_BOUND


def schedule_batches_for(schedule_batches: Sequence[int], batch_size: int, knee_batch: int | None) -> list[int]:
    """The batches a recommendation's schedule covers: `schedule_batches`, the serving batch and the knee."""
    return sorted({*schedule_batches, batch_size, *([knee_batch] if knee_batch else [])})


def gamma_schedule(
    measurement: DraftMeasurement,
    batch_sizes: Sequence[int] = SCHEDULE_BATCHES,
    knee_batch: int | None = None,
    gammas: Iterable[int] = DEFAULT_GAMMAS,
    objective: str = "latency",
    budget: float | None = None,
    regime: str = MEMORY_BOUND,
) -> dict[int, int]:
    """γ per serving batch size: at each batch, the choice recommend() makes there for this measurement.

    The same objective and budget at every batch; the regime per γ follows from the knee at the
    verify width b·(γ+1) (memory-bound below it, compute-bound at or past it), or is `regime`
    everywhere when there is no knee (e.g. a regime set by hand, or decided by v(k) alone).
    The rules are engine.analysis.feasibility's, the ones the headline and the policy table use; γ is 0
    (off) where nothing may be recommended at that batch.
    """
    check_args(objective, regime, budget)
    rows = gamma_curve(measurement, gammas)
    schedule: dict[int, int] = {}
    for b in sorted({int(x) for x in batch_sizes}):
        if b < 1:
            raise ValueError(f"batch sizes must be >= 1, got {b}")
        best, pays = best_row(rows, judge_for(measurement, objective, budget, regime, b, knee_batch))
        schedule[b] = best.gamma if best is not None and pays else 0
    return schedule
