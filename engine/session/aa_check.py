"""Which prompts a sweep measures the target alone on twice (the A/A check), in what order each prompt's decodes run,
and how many decodes a sweep makes.

The A/A check costs one more decode of the target alone on each prompt it covers, so it covers a subset: one whole
rotation at least (below), more only as far as AA_SHARE of the sweep's configuration decodes allows, stratified by
category and spread evenly through the set. A session checks in its first sweep only: a confirmation that follows is
judged by that floor (engine.service.worker.sweeps).

Whatever the first decode after a prompt's prime still pays must land on each configuration in turn, the A/A twin
included, or it biases the speedups and the floor alike. So each prompt's decodes run in an order rotated by one from
the last: the prompts the check covers rotate over every configuration and the twin, the others over the
configurations alone, and the check covers a whole number of rotations (a multiple of the configurations plus one),
so that the baseline and its twin come first equally often. The count is rounded down to whole rotations: a sweep
of the target alone and one draft checks 3 prompts, of four configurations 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.session.runner import RunKey

MIN_AA_PROMPTS = 3  # the fewest prompts an A/A floor rests on (fewer only when the set has fewer)
AA_SHARE = 0.10  # the A/A decodes aimed at, as a share of the sweep's configuration decodes


def aa_count(n_prompts: int, runs: int) -> int:
    """How many of `n_prompts` prompts the A/A check covers in a sweep of `runs` configurations: MIN_AA_PROMPTS or
    AA_SHARE of the configuration decodes, whichever is more, rounded down to whole rotations of the runs and the
    twin (one at least), at most every prompt."""
    wanted = max(MIN_AA_PROMPTS, math.ceil(AA_SHARE * n_prompts * runs))
    rotation = runs + 1
    return min(n_prompts, max(1, wanted // rotation) * rotation)


def aa_prompts(categories: Sequence[str | None], runs: int) -> list[int]:
    """The prompt indices the A/A check covers, in order (`categories`: each prompt's, in order): each category's
    share taken in turn over the categories, as they first appear, and spread evenly through its prompts."""
    groups: dict[str | None, list[int]] = {}
    for index, category in enumerate(categories):
        groups.setdefault(category, []).append(index)
    quota = dict.fromkeys(groups, 0)
    for _ in range(aa_count(len(categories), runs)):
        open_groups = [c for c in groups if quota[c] < len(groups[c])]
        quota[min(open_groups, key=lambda c: quota[c])] += 1
    picked = [group[(2 * k + 1) * len(group) // (2 * quota[c])] for c, group in groups.items() for k in range(quota[c])]
    return sorted(picked)


def decode_orders(plan: Sequence[RunKey], n_prompts: int, checked: Sequence[int]) -> list[list[RunKey | None]]:
    """Per prompt, the order its decodes run in (None: the A/A twin of the target alone, on the prompts `checked`):
    the checked prompts rotate over the plan and the twin, the others over the plan, each one step from the last."""
    covered, orders = set(checked), []
    ranks = {True: 0, False: 0}
    for index in range(n_prompts):
        with_twin = index in covered
        order: list[RunKey | None] = [*plan, None] if with_twin else list(plan)
        shift = ranks[with_twin] % len(order) if order else 0
        ranks[with_twin] += 1
        orders.append([*order[shift:], *order[:shift]])
    return orders


def has_baseline(plan: Sequence[RunKey]) -> bool:
    return any(key.kind == "baseline" for key in plan)


def sweep_decodes(plan: Sequence[RunKey], n_prompts: int, aa_check: bool = True) -> int:
    """The prompt decodes a sweep of `plan` over `n_prompts` prompts makes, as its progress bar counts them: each
    configuration on every prompt, and the A/A check's decodes where it checks and the plan has a baseline."""
    checks = aa_check and has_baseline(plan)
    return n_prompts * len(plan) + (aa_count(n_prompts, len(plan)) if checks else 0)
