"""What a verdict asks of the deployment, as numbers: γ by batch size at the observed acceptance, or speculation off.

A "costing you" window was predicted below 1× at its batch. The schedule that answers it is the one predictor's
(engine.watch.verdict.predicted_speedup) over the batches the session's regime by batch judges: at each batch, the
γ from 1 to the deployed γ with the highest predicted gain at the window's acceptance, and 0 where none is
predicted above 1×. A schedule of zeros is speculation off, as is every "acceptance collapsed" window. Pure
functions of numbers; the files are written by the session's export format (engine.service.watch_actions).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.watch.verdict import Deployment, best_gamma

POWERS_UP_TO = 64  # the schedule covers every power of two up to this batch, beside the observed one


def schedule_batches(observed: int, session_batches: Sequence[int] = ()) -> list[int]:
    """The batches a schedule is derived at: every power of two up to POWERS_UP_TO (or twice the observed batch,
    the larger), the session's own schedule batches and the observed batch."""
    top = max(POWERS_UP_TO, 2 * observed)
    powers = [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    return sorted({*powers, *(int(b) for b in session_batches if int(b) >= 1), max(int(observed), 1)})


def derived_schedule(
    dep: Deployment, rates: Sequence[float], drafting: float | None, batches: Sequence[int]
) -> dict[int, int]:
    """{batch: γ} at each of `batches` (best_gamma), consecutive equal γs kept once, from the lowest batch."""
    schedule: dict[int, int] = {}
    for batch in sorted(set(batches)):
        gamma, _ = best_gamma(dep, rates, drafting, batch)
        if not schedule or schedule[max(schedule)] != gamma:
            schedule[batch] = gamma
    return schedule


def is_off(schedule: dict[int, int]) -> bool:
    """A schedule that drafts nothing with one request in flight, where drafting is cheapest: speculation off."""
    return not schedule or schedule[min(schedule)] == 0
