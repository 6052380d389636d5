"""The γ-by-batch schedule: the γ the recommender would choose for one draft at each serving batch size."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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


def break_even_share(on: float, off: float) -> float:
    """The share of tokens a γ schedule must decode where it speculates (speedup `on` > 1) for it to beat serving
    without any speculative config, when its off ranges still cost `off` < 1 (an engine that keeps its speculative
    path running at K 0). Per token, relative to the target alone, the schedule takes p/on + (1 − p)/off; it wins
    when that is below 1: p > (1/off − 1) / (1/off − 1/on). 0 when the off ranges cost nothing (off ≥ 1), 1 when
    speculating does not pay (on ≤ 1)."""
    if off >= 1.0:
        return 0.0
    if on <= 1.0:
        return 1.0
    return (1.0 / off - 1.0) / (1.0 / off - 1.0 / on)


def off_range_line(on: Mapping[int, float], off: Mapping[int, float]) -> str:
    """What a schedule with off ranges is worth against no speculative config: the speedup where it speculates
    (`on`, batch -> speedup) and the cost of each off range (`off`), and the share of tokens it needs where it
    speculates (break_even_share), from the most favourable pairing to the least."""
    best, worst = (max(on.values()), max(off.values())), (min(on.values()), min(off.values()))
    shares = [break_even_share(*best), break_even_share(*worst)]
    share = (
        f"{shares[0] * 100:.0f}%"
        if abs(shares[1] - shares[0]) < 0.005
        else (f"{min(shares) * 100:.0f}–{max(shares) * 100:.0f}%")
    )
    return (
        f"the schedule turns speculation off where every measured γ lost ({_batches(off)}, the best γ measured "
        f"there), but an engine that keeps its speculative path running at K 0 (vLLM) still pays about that there: "
        f"the schedule beats serving without a speculative config only when at least {share} of the tokens are "
        f"decoded where it speculates ({_batches(on)}); below that, serve without speculation"
    )


def _batches(speedups: Mapping[int, float]) -> str:
    return ", ".join(f"batch {b}: {s:.2f}×" for b, s in sorted(speedups.items()))
