"""Micro-measurements on the real device: the verify cost curve v(k), a k-token forward ÷ a 1-token one.

v(k) is the time of a k-token target forward over a warm KV cache divided by a 1-token one: near 1
for small k means verifying γ+1 positions is nearly free (memory-bound), near k means it is billed.
Measured in interleaved rounds: here in spectune's loop; an engine that times its own k-token batches (llama.cpp's
llama-bench) turns its rounds into v(k) with `from_rounds`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from engine.core.kvcache import crop_to, forward_step, sequence_cache, sync
from engine.core.model import LoadedModel


@dataclass(frozen=True)
class VerifyCost:
    """v(k) from interleaved rounds: `curve` k → v(k); `spread` k → (lowest, highest) ratio of one round."""

    curve: dict[int, float]
    spread: dict[int, tuple[float, float]]
    rounds: int


EVERY_K_UP_TO = 9  # v(k) is measured at every k this far (γ ≤ 8): a CPU GEMM's cost steps between widths


def verify_ks(max_k: int) -> list[int]:
    """The k's measured: every k up to EVERY_K_UP_TO (a k-token forward's time is not linear in k: on the bundled
    1.5B in float32 here, v(3) = 1.11 in the loop where a line from v(2) = 1.17 to v(4) = 2.11 says 1.64), then
    16, 32, … up to max_k, and max_k itself (the γ+1 actually verified)."""
    every = set(range(1, min(max_k, EVERY_K_UP_TO) + 1))
    return sorted(every | {k for k in (16, 32, 64) if k <= max_k} | {1, max_k})


def from_rounds(times: Mapping[int, Sequence[float]]) -> VerifyCost:
    """v(k) from per-round timings measured in alternating order: each side's fastest round over the other's.

    A busy machine only ever adds time, so the fastest of several interleaved rounds is the closest to the work
    itself; the per-round ratios give the spread. A k-token forward below one one-token forward is kept only when
    every round measured it below (the one-token kernel is the slower one: bfloat16 on a CPU with AVX-512 BF16);
    otherwise a ratio below 1 is timer noise and is clamped to 1."""
    base = min(times[1])
    rounds = min(len(samples) for samples in times.values())
    curve, spread = {}, {}
    for k, samples in sorted(times.items()):
        ratios = [t / t1 for t, t1 in zip(samples, times[1], strict=False)]
        cheaper = k > 1 and bool(ratios) and max(ratios) < 1.0
        curve[k] = min(samples) / base if cheaper else max(1.0, min(samples) / base)
        spread[k] = (min(ratios), max(ratios)) if cheaper else (max(1.0, min(ratios)), max(1.0, max(ratios)))
    return VerifyCost(curve, spread, rounds)


@torch.inference_mode()
def forward_times(model: LoadedModel, context_ids: list[int], ks: list[int], rounds: int = 5) -> dict[int, list[float]]:
    """Seconds of a k-token forward appended to a cache holding `context_ids`, one per round for each k, the
    rounds in alternating order (1, 2, 4, … then … 4, 2, 1) after a warm-up of every shape."""
    cache = sequence_cache(model)
    forward_step(model, context_ids, cache, 1)
    base = len(context_ids)
    filler = (context_ids * (max(ks) // max(1, len(context_ids)) + 2))[: max(ks)]

    def timed(k: int) -> float:
        sync(model.device)
        t0 = time.perf_counter()
        forward_step(model, filler[:k], cache, k)
        sync(model.device)
        elapsed = time.perf_counter() - t0
        crop_to(cache, base)
        return elapsed

    for k in ks:
        timed(k)  # warm-up for this shape
    times: dict[int, list[float]] = {k: [] for k in ks}
    for index in range(rounds):
        for k in sorted(ks, reverse=index % 2 == 1):
            times[k].append(timed(k))
    return times


def verify_cost_curve(model: LoadedModel, context_ids: list[int], max_k: int, reps: int = 5) -> dict[int, float]:
    """v(k) = t(k)/t(1) in spectune's loop for k = 1, 2, 4, … and max_k, from `reps` interleaved rounds."""
    return from_rounds(forward_times(model, context_ids, verify_ks(max_k), reps)).curve
