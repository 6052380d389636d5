"""The compiled loop: a model's short forwards compiled over one static KV cache (after gpt-fast's generate.py).

Every forward of width 1..`widest` (a draft's one-token decode, the target's verify of γ+1 tokens) runs one compiled
call: torch.compile over transformers' StaticCache, on a GPU in "reduce-overhead" mode, which captures a CUDA graph
per width, so a step costs its kernels rather than their launches. Longer forwards (a prompt's prefill) run eagerly
into the same cache. A rollback after a rejection moves the cache's position back; nothing is copied. Greedy output
in float32 is token-identical to the eager loop's (tests/test_compiled_loop.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from engine.core.model import LoadedModel

CACHE_GRANULE = 256  # static caches come in powers of two from this many positions: sessions share compiled calls
RECOMPILE_LIMIT = 64  # a worker compiles a few widths for each model it keeps; torch's default of 8 is too few


def cache_length(need: int) -> int:
    """The static cache for `need` positions: the next power of two from CACHE_GRANULE (few distinct shapes)."""
    length = CACHE_GRANULE
    while length < need:
        length *= 2
    return length


def compile_mode(device: str) -> str:
    """torch.compile's mode: CUDA graphs on a GPU (launches are the cost there), fused kernels on a CPU."""
    return "reduce-overhead" if str(device).startswith("cuda") else "default"


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


class CompiledLoop:
    """One model's compiled forward and its static KV cache, for sequences up to `cache_len` positions and forwards
    of width up to `widest`. `active` turns it off without dropping what was compiled."""

    def __init__(self, model: LoadedModel, cache_len: int, widest: int) -> None:
        from transformers import StaticCache

        _raise_recompile_limit()
        self.model = model
        self.cache_len = cache_len
        self.widest = widest
        self.active = True
        self.mode = compile_mode(model.device)
        self.compile_s = 0.0
        self.compiled_widths: set[int] = set()
        self._caches: dict[str, Any] = {}  # one static cache per sequence in flight: "target", "draft"
        self._new_cache = lambda: StaticCache(config=model.model.config, max_cache_len=cache_len)
        self._call = torch.compile(model.model.__call__, mode=self.mode, dynamic=None, fullgraph=False)
        self._cuda = str(model.device).startswith("cuda")

    def fits(self, need: int) -> bool:
        """Whether sequences of `need` positions fit this loop's static cache."""
        return need <= self.cache_len

    def owns(self, cache: object) -> bool:
        return any(cache is mine for mine in self._caches.values())

    def covers(self, width: int) -> bool:
        return 1 <= width <= self.widest

    @torch.inference_mode()  # the cache's tensors are inference tensors: moved in place only in inference mode
    def empty_cache(self, slot: str = "target") -> Any:
        """The static cache of `slot` (the model as a target, or as its own draft), rolled back to no positions; its
        buffers stay where the compiled calls expect them."""
        cache = self._caches.get(slot)
        if cache is None:
            cache = self._caches[slot] = self._initialised(self._new_cache())
        current = int(cache.get_seq_length())
        if current > 0:
            cache.crop(-current)
        return cache

    @torch.inference_mode()
    def _initialised(self, cache: Any) -> Any:
        """`cache` with its buffers allocated by one eager forward, outside any compiled region: allocated there,
        they would not be marked as static addresses, and CUDA graphs would be skipped for the in-place updates."""
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.model.device)
        self.model.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return cache

    def forward(self, ids: torch.Tensor, cache: object, keep: int) -> torch.Tensor:
        """The compiled forward of `ids` (1, width) appended to the cache; the last `keep` positions' logits, a copy
        (a CUDA graph's output buffer is overwritten by its next replay)."""
        if self._cuda:
            torch.compiler.cudagraph_mark_step_begin()
        out = self._call(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=0)
        return out.logits[0, -keep:].clone()

    @torch.inference_mode()
    def compile(self, widths: Iterable[int]) -> float:
        """Compile (on a GPU: capture) each width now, on a scratch sequence, so that no timed step pays for it;
        returns the seconds it took (a phase of its own in the live view)."""
        todo = sorted({w for w in widths if self.covers(w)} - self.compiled_widths)
        if not todo:
            return 0.0
        start = time.perf_counter()
        filler = torch.zeros((1, max(todo)), dtype=torch.long, device=self.model.device)
        for width in todo:
            for _ in range(3):  # compile, then (CUDA graphs) warm up and record, then replay once
                cache = self.empty_cache()
                self.forward(filler[:, :width], cache, 1)
            self.compiled_widths.add(width)
        self.empty_cache()
        if self._cuda:
            torch.cuda.synchronize(self.model.device)
        elapsed = time.perf_counter() - start
        self.compile_s += elapsed
        return elapsed


def use_compiled(model: LoadedModel, need: int, widest: int) -> CompiledLoop:
    """Make `model` decode in its compiled loop, for sequences of `need` positions and forwards up to `widest`
    tokens: the loop it already has when that fits, else a new one (a larger static cache compiles anew)."""
    loop = model.compiled
    if loop is None or not loop.fits(need):
        loop = CompiledLoop(model, cache_length(need), widest)
        model.compiled = loop
    loop.widest = max(loop.widest, widest)  # a new width compiles on its first call (CompiledLoop.compile)
    loop.active = True
    return loop


def use_eager(model: LoadedModel) -> None:
    """Make `model` decode in the eager loop (what it compiled is kept for a later session)."""
    if model.compiled is not None:
        model.compiled.active = False
