"""Micro-benchmarks on the real device: copy bandwidth, matmul peak, and a batch sweep of decode steps."""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A step "grows about linearly" from b_prev to b when t(b)/t(b_prev) >= LINEAR_FRACTION * (b/b_prev).
# 0.8 of proportional growth: a memory-bound step grows far less (doubling rows adds a few percent:
# only activations and KV reads grow, not the weight stream), a compute-bound one grows almost fully
# proportionally; 0.8 leaves room for timing noise and for the fixed share that never vanishes.
LINEAR_FRACTION = 0.8


def growth_fractions(batch_sizes: Sequence[int], times: Sequence[float]) -> list[float]:
    return [(times[i + 1] / times[i]) / (batch_sizes[i + 1] / batch_sizes[i]) for i in range(len(times) - 1)]


def measure_copy_bandwidth(device: str = "cpu", nbytes: int | None = None, reps: int = 5) -> float:
    """Achievable memory bandwidth in bytes/s from a device-to-device tensor copy (read + write counted).

    Best of `reps` copies, after a warm-up. Defaults: 32 MiB on CPU (well under a second), 1 GiB on
    CUDA (large enough to defeat caches).
    """
    import torch

    from engine.core.kvcache import sync

    if nbytes is None:
        nbytes = (1 << 30) if str(device).startswith("cuda") else (32 << 20)
    n = max(nbytes // 4, 1)
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    best = float("inf")
    for _ in range(max(reps, 1)):
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n * 4 / best


def measure_matmul_flops(device: str = "cpu", n: int | None = None, reps: int = 3, dtype: Any = None) -> float:
    """Achievable FLOP/s from an n×n matmul (2n³ FLOPs), best of `reps` after a warm-up.

    Defaults: n=256 float32 on CPU (milliseconds), n=8192 bfloat16 on CUDA (tensor cores).
    """
    import torch

    from engine.core.kvcache import sync

    cuda = str(device).startswith("cuda")
    if n is None:
        n = 8192 if cuda else 256
    if dtype is None:
        dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    sync(device)
    best = float("inf")
    for _ in range(max(reps, 1)):
        start = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


@dataclass
class BatchSweep:
    """Raw timings from batch_sweep(); judge them with classify_batch_sweep()."""

    batch_sizes: list[int]
    step_times_s: list[float]
    input_len: int
    device: str
    reps: int
    stopped_early: bool
    spread_s: list[tuple[float, float]] = field(default_factory=list)  # (min, max) step time per batch over the rounds
    loop: str = "eager"  # the loop whose step was timed: "eager" (HF forward, DynamicCache) or "compiled"


def _timed_rounds(
    sizes: Sequence[int], reps: int, device: str, step: Callable[[int], None], reset: Callable[[int], None]
) -> dict[int, list[float]]:
    """`step(b)` timed at every batch in `reps` rounds after a warm-up round, the order rotating from round to round
    (so a burst of load lands on different batches, never on one alone); `reset(b)` after each step, untimed."""
    from engine.core.kvcache import sync

    times: dict[int, list[float]] = {b: [] for b in sizes}
    for rnd in range(reps + 1):  # round 0 is the warm-up
        shift = rnd % len(sizes)
        for b in list(sizes[shift:]) + list(sizes[:shift]):
            sync(device)
            start = time.perf_counter()
            step(b)
            sync(device)
            elapsed = time.perf_counter() - start
            reset(b)
            if rnd:
                times[b].append(elapsed)
    return times


def _swept(sizes: list[int], times: dict[int, list[float]], input_len: int, device: str, loop: str) -> BatchSweep:
    """The median step time per batch over the rounds, with its spread."""
    return BatchSweep(
        batch_sizes=sizes,
        step_times_s=[statistics.median(times[b]) for b in sizes],
        input_len=input_len,
        device=str(device),
        reps=len(times[sizes[0]]),
        stopped_early=False,
        spread_s=[(min(times[b]), max(times[b])) for b in sizes],
        loop=loop,
    )


def batch_sweep(
    model: Any,
    input_len: int = 32,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    reps: int = 5,
    device: str | None = None,
    seed: int = 0,
) -> BatchSweep:
    """Time one decode step of a HF causal LM at each batch size: `reps` interleaved rounds after a warm-up round.

    Each batch gets a random context of `input_len` tokens prefilled into a DynamicCache once; every round then
    times a 1-token step at every batch, in an order that rotates from round to round (so a burst of load lands
    on different batches, never on one alone), cropping the cache back so every round times the same shape.
    The median per batch is the step time; the spread across rounds is kept. The forward's cache keyword is
    `cache=` in transformers 5.x (`past_key_values=` before); it is read from the signature. compiled_batch_sweep
    times the compiled loop's step instead.
    """
    import torch

    from engine.core.kvcache import new_cache

    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    if device is None:
        device = str(next(model.parameters()).device)
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    sizes = sorted({int(b) for b in batch_sizes})
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}  # no (b, len, vocab) logits
    prepared: dict[int, tuple[Any, Any]] = {}
    with torch.inference_mode():
        for b in sizes:
            ids = torch.randint(0, vocab, (b, input_len), generator=generator).to(device)
            cache = new_cache(model.config)
            out = model(input_ids=ids, use_cache=True, **{cache_kw: cache}, **keep)
            for attr in ("cache", "past_key_values"):
                returned = getattr(out, attr, None)
                if returned is not None:
                    cache = returned
                    break
            prepared[b] = (cache, out.logits[:, -1:].argmax(-1))

        def step(b: int) -> None:
            cache, step_ids = prepared[b]
            model(input_ids=step_ids, use_cache=True, **{cache_kw: cache})

        def reset(b: int) -> None:
            cache = prepared[b][0]
            extra = cache.get_seq_length() - input_len
            if extra > 0:  # a negative crop removes that many tokens in every transformers version
                cache.crop(-extra)

        times = _timed_rounds(sizes, max(reps, 1), device, step, reset)
    return _swept(sizes, times, input_len, device, "eager")


def compiled_batch_sweep(
    loop: Any,
    input_len: int = 32,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    reps: int = 5,
    seed: int = 0,
) -> BatchSweep:
    """batch_sweep's rounds, timing the step of `loop` (an engine.core.compiled.CompiledLoop) instead of eager HF.

    Each batch is a static sequence of its own (engine.core.compiled.CompiledLoop.batch_sequence): the context
    prefilled eagerly, then the compiled 1-token step, one graph per batch size and on a GPU one CUDA graph per
    batch size, replayed. A step is rolled back in place after it, so every round times the same shape. The
    sequences and their CUDA graphs are released at the end."""
    import torch

    vocab = int(loop.model.model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    sizes = sorted({int(b) for b in batch_sizes})
    device = str(loop.model.device)
    try:
        seqs = {b: loop.batch_sequence(torch.randint(0, vocab, (b, input_len), generator=generator)) for b in sizes}
        times = _timed_rounds(
            sizes, max(reps, 1), device, lambda b: loop.batch_step(seqs[b]), lambda b: seqs[b].rollback(input_len)
        )
    finally:
        loop.release_batches()
    return _swept(sizes, times, input_len, device, "compiled")
