"""The compiled loop: a model's short forwards over one static KV cache, one CUDA graph per width on a GPU.

Every forward of width 1..`widest` (a draft's one-token decode, the target's verify of γ+1 tokens) runs one static
step: the tokens are copied into a static input buffer, the cache position is a device tensor moved in place, and the
step's kernels (torch.compile, fullgraph, no CUDA graphs of its own; or eager) read and write only static buffers.
On a GPU each (sequence, width) step is captured once as a CUDA graph (warm-up on a side stream, one memory pool per
model, after vLLM and SGLang), and a forward is a copy into the input buffer, `graph.replay()` and a read of the
static output. On a CPU the very same step runs without the capture. Longer forwards (a prompt's prefill) run
eagerly into the same cache. A rollback after a rejection writes the position in place; no tensor is reassigned or
copied. Greedy output in float32 is token-identical to the eager loop's (tests/test_compiled_loop.py); what keeps
the step capturable is checked by tests/test_graph_capture.py."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from engine.core.model import LoadedModel

CACHE_GRANULE = 256  # static caches come in powers of two from this many positions: sessions share compiled calls
RECOMPILE_LIMIT = 64  # per loop (each has its own step, see own_copy): a few widths; torch's default of 8 is too few
KERNELS = "SPECTUNE_COMPILE_MODE"  # the step's kernels: a torch.compile mode ("default", ...) or "eager"
STEP_BUFFER = 16  # a sequence's input buffer holds at least this many tokens: a wider γ later needs no new cache
DYNAMIC_BATCH = True  # the batch sweep compiles one step for all its batch sizes (cheaper on a CPU; docs/gpu.md)
WARM_UPS = 2  # runs of a step on a side stream before its capture (lazy allocations, autotuning)
log = logging.getLogger("spectune.compiled")


def cache_length(need: int) -> int:
    """The static cache for `need` positions: the next power of two from CACHE_GRANULE (few distinct shapes)."""
    length = CACHE_GRANULE
    while length < need:
        length *= 2
    return length


def compile_mode(device: str) -> str:
    """How the step's kernels are built: torch.compile "default" on every device (the CUDA graph is captured here, not
    by torch.compile), or as SPECTUNE_COMPILE_MODE says ("max-autotune-no-cudagraphs", or "eager" for no compile)."""
    del device  # the same kernels everywhere; the capture alone depends on the device
    return os.environ.get(KERNELS, "").strip() or "default"


class Uncapturable(RuntimeError):
    """A model whose step cannot run as one static graph (a graph break, a host sync, a failed capture)."""


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Dynamo's and inductor's warnings silenced for a compile attempt: a failure is reported once, by the caller."""
    loggers = [logging.getLogger(name) for name in ("torch._dynamo", "torch._inductor", "torch.fx")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


HOST_READS = frozenset({"item", "tolist", "_local_scalar_dense", "nonzero", "unique", "masked_select"})


class HostRead(RuntimeError):
    """A traced step holds an op that reads the device from the host or has a data-dependent shape."""


def host_reads(gm: torch.fx.GraphModule) -> list[str]:
    """The ops of `gm` that cannot be captured in a CUDA graph: host reads (.item(), .tolist()) and data-dependent
    shapes (nonzero and its kin), by name, in graph order."""
    found = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        if HOST_READS & set(str(name).split(".")):
            found.append(str(name))
    return found


def checked(backend: Any) -> Callable[[torch.fx.GraphModule, list[Any]], Any]:
    """`backend` (a callable or a registered name) behind a check of each traced graph: one with a host read raises
    HostRead before compiling."""
    if isinstance(backend, str):
        backend = torch._dynamo.lookup_backend(backend)

    def compile_checked(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        reads = host_reads(gm)
        if reads:
            raise HostRead(f"its forward reads the device from the host ({', '.join(dict.fromkeys(reads))})")
        return backend(gm, inputs)

    return compile_checked


def _first_line(exc: BaseException) -> str:
    """The reason a one-line report gives: a HostRead's message where the chain holds one, else the exception's
    first non-empty line, shortened."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, HostRead):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    guard = next((part for line in lines for part in line.split(". ") if "data-dependent" in part), None)
    if guard is not None:
        return f"its forward branches on a value read from the device ({guard.rstrip('.')})"[:200]
    return (lines[0] if lines else type(exc).__name__)[:200]


class StaticSequence:
    """`batch` rows of one length in a static KV cache (transformers' StaticCache), the position a device tensor.

    Every buffer keeps its address for the sequence's life: the K/V tensors (batch, heads, cache_len, dim), allocated
    by the first forward, `position` (int64 scalar, shared by the rows), the input ids (batch, widest) and the
    position offsets. `length` is the host's count of cached positions, kept for the caller's bookkeeping; the step
    itself reads only `position`. A decode is one row; the batch sweep times a step of several."""

    def __init__(self, config: Any, cache_len: int, widest: int, device: str, batch: int = 1) -> None:
        from transformers import StaticCache

        self.cache = StaticCache(config=config, max_cache_len=cache_len)
        self.cache_len = cache_len
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.ids = torch.zeros((batch, widest), dtype=torch.long, device=device)
        self.offsets = torch.arange(widest, dtype=torch.long, device=device)
        self.length = 0
        for buffer in (self.position, self.ids, self.offsets):
            torch._dynamo.mark_static_address(buffer)

    @property
    def layers(self) -> list[Any]:
        return self.cache.layers

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    def get_seq_length(self) -> int:
        """Cached positions, as the host counts them (no device read)."""
        return self.length

    def rollback(self, length: int) -> None:
        """Keep the first `length` positions: one in-place write of the position, no copy, no reassignment."""
        if length < self.length:
            with torch.inference_mode():  # the buffers are inference tensors, moved in place only in inference mode
                self.position.fill_(length)
            self.length = length

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop by a negative count, as a rollback."""
        self.rollback(self.length - abs(tokens_to_remove))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the step reads or writes in place (each must keep its data_ptr)."""
        own = [self.position, self.ids, self.offsets]
        return own + [t for layer in self.layers for t in (layer.keys, layer.values, layer.cumulative_length)]


def static_step(model: Any, seq: StaticSequence, width: int) -> torch.Tensor:
    """One forward of `seq.ids[:, :width]` at `seq.position`, appended to the cache; its logits (batch, width, V).

    Only static buffers and device arithmetic: the position is never read on the host, so a step compiles once per
    width and a CUDA graph of it replays at any position. The layers' own counters are set from the position first
    (a rollback writes the position alone)."""
    for layer in seq.cache.layers:
        layer.cumulative_length.copy_(seq.position)
    positions = (seq.position + seq.offsets[:width]).unsqueeze(0).expand(seq.ids.shape[0], width)
    out = model(input_ids=seq.ids[:, :width], position_ids=positions, cache=seq.cache, use_cache=True, logits_to_keep=0)
    seq.position.add_(width)
    return out.logits


def own_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a new function over a new code object, so that torch.compile keeps a cache of its own for it.

    Dynamo stores compiled entries, and counts recompiles against the limit, on the code object: every loop compiling
    the one `static_step` would share one budget across all models and widths. A copy's budget is its own."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    return copy


class CompiledLoop:
    """One model's static steps and its static KV caches, for sequences up to `cache_len` positions and forwards
    of width up to `widest`. `active` turns it off without dropping what was compiled or captured.

    `backend` is torch.compile's backend (None: inductor in compile_mode's mode; "eager" kernels skip compiling);
    tests pass a recording or counting one."""

    def __init__(self, model: LoadedModel, cache_len: int, widest: int, backend: Any = None) -> None:
        _raise_recompile_limit()
        self.model = model
        self.cache_len = cache_len
        self.widest = widest
        self.active = True
        self.mode = compile_mode(model.device)
        self.compile_s = 0.0
        self.compiled_widths: set[int] = set()
        self._caches: dict[str, StaticSequence] = {}  # one per sequence in flight: "target", "draft"
        self._batches: dict[int, StaticSequence] = {}  # the batch sweep's, by rows: a 1-token step each
        self._cuda = str(model.device).startswith("cuda")
        self._graphs: dict[tuple[str, int], tuple[Any, torch.Tensor]] = {}  # (slot, width): graph, its output
        self._pool = torch.cuda.graph_pool_handle() if self._cuda else None
        self._step = self._compiled_step(backend)

    def _compiled_step(self, backend: Any) -> Callable[[Any, StaticSequence, int], torch.Tensor]:
        """This loop's own copy of static_step compiled whole (fullgraph: a graph break raises), one graph per width
        (dynamic=False), each graph checked for host reads first; "eager" kernels trace it with the same check and
        run it eagerly. The copy keeps this loop's compiles and recompile budget apart from every other loop's."""
        if backend is None:
            backend = "eager" if self.mode == "eager" else torch._TorchCompileInductorWrapper(self.mode, None, False)
        return torch.compile(own_copy(static_step), backend=checked(backend), dynamic=False, fullgraph=True)

    def fits(self, need: int) -> bool:
        """Whether sequences of `need` positions fit this loop's static cache."""
        return need <= self.cache_len

    def owns(self, cache: object) -> bool:
        """Whether `cache` is one of this loop's static sequences."""
        return any(cache is mine for mine in self._caches.values())

    def covers(self, width: int) -> bool:
        """Whether a forward of `width` tokens runs as a static step (wider ones run eagerly)."""
        return 1 <= width <= self.widest

    @torch.inference_mode()  # the cache's tensors are inference tensors: moved in place only in inference mode
    def empty_cache(self, slot: str = "target") -> StaticSequence:
        """The static sequence of `slot` (the model as a target, or as its own draft), rolled back to no positions;
        its buffers stay where the steps expect them. A new slot runs (on a GPU: captures) every compiled width."""
        seq = self._caches.get(slot)
        if seq is None:
            seq = self._caches[slot] = self._initialised(self._new_sequence())
            for width in sorted(self.compiled_widths):
                self._prepare(slot, width)
        seq.rollback(0)
        return seq

    @property
    def buffer_width(self) -> int:
        """The widest step its sequences' input buffers hold."""
        return max(self.widest, STEP_BUFFER)

    def _new_sequence(self, batch: int = 1, cache_len: int | None = None, widest: int | None = None) -> StaticSequence:
        return StaticSequence(
            self.model.model.config, cache_len or self.cache_len, widest or self.buffer_width, self.model.device, batch
        )

    def _initialised(self, seq: StaticSequence) -> StaticSequence:
        """`seq` with its K/V buffers allocated by one eager forward, outside any compiled region and before any
        capture (allocated inside one, their addresses would belong to it)."""
        self._eager(torch.zeros((seq.batch, 1), dtype=torch.long), seq, 1)
        seq.rollback(0)
        return seq

    def prefill(self, ids: torch.Tensor, seq: StaticSequence, keep: int = 1) -> torch.Tensor:
        """An eager forward of `ids` (1, n) of any width into `seq` at its position; the last `keep` logits."""
        return self._eager(ids, seq, keep)[0]

    def _eager(self, ids: torch.Tensor, seq: StaticSequence, keep: int) -> torch.Tensor:
        """An eager forward of `ids` (rows, n) into `seq` at its position; the last `keep` logits (rows, keep, V)."""
        width = ids.shape[1]
        for layer in seq.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(seq.length)
        ids = ids.to(self.model.device)
        positions = torch.arange(seq.length, seq.length + width, device=self.model.device).unsqueeze(0)
        out = self.model.model(
            input_ids=ids, position_ids=positions, cache=seq.cache, use_cache=True, logits_to_keep=keep
        )
        seq.position.add_(width)
        seq.length += width
        return out.logits

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: StaticSequence, keep: int) -> torch.Tensor:
        """The forward of `ids` (1, width) appended to `cache`; the last `keep` positions' logits, a copy (a CUDA
        graph's output buffer is overwritten by its next replay). A covered width runs its static step."""
        width = ids.shape[1]
        if not self.covers(width):
            return self.prefill(ids, cache, keep)[-keep:]
        cache.ids[:, :width].copy_(ids)
        return self._run(self._slot(cache), cache, width)[0, -keep:].clone()

    def _run(self, slot: str, seq: StaticSequence, width: int) -> torch.Tensor:
        """`width`'s step on `seq`: a replay of its CUDA graph where one was captured, else the compiled step; the
        static logits (batch, width, V)."""
        graph = self._graphs.get((slot, width))
        if graph is not None:
            graph[0].replay()
            logits = graph[1]
        else:
            logits = self._step(self.model.model, seq, width)
        seq.length += width
        return logits

    def _slot(self, cache: StaticSequence) -> str:
        return next(slot for slot, mine in self._caches.items() if mine is cache)

    def _prepare(self, slot: str, width: int, seq: StaticSequence | None = None) -> None:
        """Run `width`'s step on `slot` (its sequence, or `seq`) once, compiling it, and on a GPU capture it; the
        position is restored."""
        seq = seq if seq is not None else self._caches[slot]
        with _quiet_dynamo():
            try:
                self._step(self.model.model, seq, width)
            except Exception as exc:
                raise Uncapturable(f"{self.model.ref} cannot run as one static graph: {_first_line(exc)}") from exc
        seq.position.fill_(seq.length)
        if self._cuda and (slot, width) not in self._graphs:
            try:
                self._graphs[(slot, width)] = self._capture(seq, width)
            except Exception as exc:
                raise Uncapturable(f"{self.model.ref} cannot be captured as a CUDA graph: {_first_line(exc)}") from exc

    def _capture(self, seq: StaticSequence, width: int) -> tuple[Any, torch.Tensor]:
        """`width`'s step captured as a CUDA graph after warm-ups on a side stream; the graph and its output."""
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            for _ in range(WARM_UPS):
                self._step(self.model.model, seq, width)
                seq.position.fill_(seq.length)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):  # samplers run beside
            output = self._step(self.model.model, seq, width)
        seq.position.fill_(seq.length)  # a capture records the step without running it; this keeps it that way
        return graph, output

    @torch.inference_mode()
    def compile(self, widths: Iterable[int]) -> float:
        """Compile each width now and, on a GPU, capture it for every sequence slot, so that no timed step pays for
        it; returns the seconds it took (a phase of its own in the live view). Raises Uncapturable, in one line,
        for a model whose step breaks into several graphs or cannot be captured."""
        todo = sorted({w for w in widths if self.covers(w)} - self.compiled_widths)
        if not todo:
            return 0.0
        start = time.perf_counter()
        self.empty_cache()
        for width in todo:
            for slot in list(self._caches):
                self._caches[slot].rollback(0)
                self._prepare(slot, width)
            self.compiled_widths.add(width)
        for seq in self._caches.values():
            seq.rollback(0)
        if self._cuda:
            torch.cuda.synchronize(self.model.device)
        elapsed = time.perf_counter() - start
        self.compile_s += elapsed
        return elapsed

    def graph_count(self) -> int:
        """How many CUDA graphs this loop holds (0 on a CPU)."""
        return len(self._graphs)

    @torch.inference_mode()
    def batch_sequence(self, ids: torch.Tensor) -> StaticSequence:
        """A static sequence of `ids` (rows, n) for the batch sweep: prefilled eagerly, each row's next token in its
        input buffer, its 1-token step compiled (one graph per row count) and on a GPU captured, like a width.

        Its cache holds n + 1 positions, so a step attends over what the eager sweep's does. It is kept (with its
        graph) until release_batches, so a sweep's rounds reuse it; time it with batch_step, rolling back to n."""
        rows, length = ids.shape
        seq = self._batches.get(rows)
        if seq is None or seq.cache_len != length + 1:
            self._release_batch(rows)
            seq = self._batches[rows] = self._initialised(self._new_sequence(rows, length + 1, 1))
        seq.rollback(0)
        logits = self._eager(ids.to(self.model.device), seq, 1)
        seq.ids.copy_(logits[:, -1].argmax(-1, keepdim=True))
        if DYNAMIC_BATCH and rows > 1:
            mark_batch_dynamic(seq)
        self._prepare(batch_slot(rows), 1, seq)
        if self._cuda:
            torch.cuda.synchronize(self.model.device)
        return seq

    @torch.inference_mode()
    def batch_step(self, seq: StaticSequence) -> torch.Tensor:
        """One 1-token step of every row of a batch_sequence at its position (the caller rolls it back); the static
        logits (rows, 1, V), overwritten by the next step."""
        return self._run(batch_slot(seq.batch), seq, 1)

    def release_batches(self) -> None:
        """Drop the batch sweep's sequences and their CUDA graphs (their memory); what was compiled stays."""
        for rows in list(self._batches):
            self._release_batch(rows)

    def _release_batch(self, rows: int) -> None:
        self._batches.pop(rows, None)
        self._graphs.pop((batch_slot(rows), 1), None)


def mark_batch_dynamic(seq: StaticSequence) -> None:
    """The row dimension of `seq`'s buffers marked dynamic: one compiled step serves every batch of two rows or more
    (one row is always its own graph), while the width stays static."""
    for tensor in (seq.ids, *(t for layer in seq.layers for t in (layer.keys, layer.values))):
        torch._dynamo.mark_dynamic(tensor, 0)


def batch_slot(rows: int) -> str:
    """The slot name of the batch sweep's sequence of `rows` rows (its CUDA graph's key, beside the decode slots)."""
    return f"batch of {rows}"


def reusable(model: LoadedModel, need: int, widest: int) -> CompiledLoop | None:
    """`model`'s compiled loop where it serves sequences of `need` positions and forwards up to `widest` tokens (its
    static cache and input buffers hold them); None where a new loop is needed."""
    loop = model.compiled
    if loop is None or not loop.fits(need) or loop.buffer_width < widest:
        return None
    return loop


def use_compiled(model: LoadedModel, need: int, widest: int) -> CompiledLoop:
    """Make `model` decode in its compiled loop, for sequences of `need` positions and forwards up to `widest`
    tokens: the loop it already has when that fits, else a new one (a larger static cache compiles anew)."""
    loop = reusable(model, need, widest)
    if loop is None:
        loop = CompiledLoop(model, cache_length(need), widest)
        model.compiled = loop
    loop.widest = max(loop.widest, widest)  # a new width compiles on its first call (CompiledLoop.compile)
    loop.active = True
    return loop


def use_eager(model: LoadedModel) -> None:
    """Make `model` decode in the eager loop (what it compiled is kept for a later session)."""
    if model.compiled is not None:
        model.compiled.active = False
