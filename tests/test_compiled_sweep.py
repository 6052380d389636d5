"""The batch sweep behind the regime runs in the loop the session decoded in, and the regime record says which.

In the compiled loop each batch size is a static sequence of its own whose 1-token step runs compiled (on a GPU,
replayed as a CUDA graph); the steps are traced with dynamo's counting backend (no inductor), so the module runs in
seconds. No timing is asserted beyond a median inside its own rounds' spread: speeds are bench/'s to measure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from engine.analysis.regime import judge_regime
from engine.core.compiled import CompiledLoop, StaticSequence
from engine.core.model import LoadedModel
from engine.measure.microbench import batch_sweep, compiled_batch_sweep
from engine.models.tiny import load_tiny
from engine.session import regime_evidence as evidence

TARGET = "tiny:1:48:2:64"
SIZES = (1, 2, 4)
WIDTHS = range(1, 4)


@pytest.fixture(scope="module")
def looped() -> Iterator[tuple[LoadedModel, CompileCounter]]:
    """A tiny model in a compiled loop, on one thread (a step's threads wait on one another when other processes
    hold the cores, which would time the machine's load rather than the step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, counter = load_tiny(TARGET), CompileCounter()
    model.compiled = CompiledLoop(model, 256, len(WIDTHS), backend=counter)
    model.compiled.compile(WIDTHS)
    yield model, counter
    torch.set_num_threads(threads)


def _addresses(seq: StaticSequence) -> list[int]:
    return [tensor.data_ptr() for tensor in seq.tensors()]


def test_the_compiled_sweep_times_a_static_step_per_batch_size(looped, monkeypatch) -> None:
    model, counter = looped
    loop = model.compiled
    decode = _addresses(loop.empty_cache())
    seen: dict[int, list[list[int]]] = defaultdict(list)
    step = loop.batch_step

    def recorded(seq: StaticSequence) -> torch.Tensor:
        seen[seq.batch].append(_addresses(seq))
        return step(seq)

    monkeypatch.setattr(loop, "batch_step", recorded)
    sweep = compiled_batch_sweep(loop, input_len=8, batch_sizes=SIZES, reps=3)
    assert sweep.loop == "compiled" and sweep.batch_sizes == list(SIZES) and sweep.reps == 3
    for t, (low, high) in zip(sweep.step_times_s, sweep.spread_s, strict=True):
        assert 0 < low <= t <= high  # the median lies in its rounds' spread (what they measure is bench/'s)
    assert sorted(seen) == list(SIZES)
    for rows, addresses in seen.items():
        assert len(addresses) == 4 and all(a == addresses[0] for a in addresses), rows  # warm-up round + 3
        assert len(addresses[0]) == 3 + 3 * len(loop.empty_cache().layers)
    assert _addresses(loop.empty_cache()) == decode  # the decode sequences are untouched
    assert loop.graph_count() == 0 and not loop._batches  # released; on a CPU nothing is captured anyway
    compiled = counter.frame_count
    assert compiled <= len(WIDTHS) + 2  # one row, and one graph for every batch of two rows or more
    compiled_batch_sweep(loop, input_len=8, batch_sizes=(*SIZES, 8), reps=1)
    assert counter.frame_count == compiled  # a second sweep, with a new batch size, compiles nothing new


def test_a_batch_sequence_steps_every_row_as_the_eager_forward_does(looped) -> None:
    model, _ = looped
    ids = torch.randint(0, int(model.model.config.vocab_size), (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        seq = model.compiled.batch_sequence(ids)
        following = seq.ids[:, 0].clone()
        stepped = model.compiled.batch_step(seq)[:, -1].clone()
        expected = model.model(input_ids=ids).logits[:, -1]
        after = model.model(input_ids=torch.cat([ids, following[:, None]], dim=1)).logits[:, -1]
    model.compiled.release_batches()
    assert torch.equal(following, expected.argmax(-1))  # each row's next token, from its own prefill
    assert seq.length == 7 and int(seq.position) == 7
    torch.testing.assert_close(stepped, after, rtol=1e-4, atol=1e-4)


def _detected(model: LoadedModel, loop: str, monkeypatch) -> dict:
    monkeypatch.setattr(evidence, "nvml_available", lambda: False)
    pool = SimpleNamespace(get=lambda *a: model)
    settings = SimpleNamespace(target=TARGET, dtype="float32", device="cpu", trust_remote_code=False)
    return evidence.detect_regime(pool, {"loop": loop, "verify_cost": {"1": 1.0, "4": 1.2}}, settings, 1)


@pytest.mark.parametrize("loop", ["compiled", "eager"])
def test_the_regime_record_says_which_loop_timed_its_sweep(loop, looped, monkeypatch) -> None:
    model, counter = looped
    compiled = counter.frame_count
    eager = []
    monkeypatch.setattr(evidence, "batch_sweep", lambda *a, **k: eager.append(1) or batch_sweep(*a, **k))
    stored = _detected(model, loop, monkeypatch)
    assert stored["batch_sweep"]["loop"] == loop and bool(eager) == (loop == "eager")
    assert len(stored["batch_sweep"]["step_times_s"]) == len(stored["batch_sweep"]["batch_sizes"]) >= 7
    said = judge_regime(stored, 1).evidence
    assert any(line.startswith(f"batch sweep (timed in the {loop} loop, judged at batch 1)") for line in said), said
    assert counter.frame_count <= compiled + 2
