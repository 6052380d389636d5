"""Micro-measurements on the real device: the verify cost curve v(k) and a draft's cost ratio c.

v(k) is the time of a k-token target forward over a warm KV cache divided by a 1-token one: near 1
for small k means verifying γ+1 positions is nearly free (memory-bound), near k means it is billed.
"""

from __future__ import annotations

import time
from statistics import median

import torch

from engine.core.kvcache import crop_to, forward_step, new_cache, sync
from engine.core.model import LoadedModel


@torch.inference_mode()
def forward_times(model: LoadedModel, context_ids: list[int], ks: list[int], reps: int = 3) -> dict[int, float]:
    """Median seconds of a k-token forward appended to a cache holding `context_ids`, for each k."""
    cache = new_cache(model.model.config)
    forward_step(model, context_ids, cache, 1)
    base = len(context_ids)
    filler = (context_ids * (max(ks) // max(1, len(context_ids)) + 2))[: max(ks)]
    times: dict[int, float] = {}
    for k in ks:
        forward_step(model, filler[:k], cache, k)  # warm-up for this shape
        crop_to(cache, base)
        samples = []
        for _ in range(reps):
            sync(model.device)
            t0 = time.perf_counter()
            forward_step(model, filler[:k], cache, k)
            sync(model.device)
            samples.append(time.perf_counter() - t0)
            crop_to(cache, base)
        times[k] = median(samples)
    return times


def verify_cost_curve(model: LoadedModel, context_ids: list[int], max_k: int, reps: int = 5) -> dict[int, float]:
    """v(k) = t(k)/t(1) for k = 1, 2, 4, … and max_k (the γ+1 actually verified)."""
    ks = sorted({k for k in (1, 2, 4, 8, 16) if k <= max_k} | {1, max_k})
    times = forward_times(model, context_ids, ks, reps)
    # a k-token forward does at least the work of a 1-token one; ratios below 1 are timer noise
    # (sub-millisecond forwards of tiny models), so they are clamped rather than believed
    return {k: max(1.0, times[k] / times[1]) for k in ks}
