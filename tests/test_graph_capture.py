"""What keeps the compiled loop's step capturable as a CUDA graph, checked on the CPU.

A CUDA graph replays fixed kernels on fixed addresses, so the step must read and write only static buffers, trace as
one graph per width with no host read in it, and never need a recompile at another position. Each test here fails
on a change that would break the capture on a GPU. The steps are traced with dynamo's counting or recording
backends (no inductor), so the module runs in seconds."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounter

from engine.core import compiled
from engine.core.compiled import HOST_READS, CompiledLoop, StaticSequence, Uncapturable, static_step, use_eager
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.kvcache import crop_to, forward_step, sequence_cache
from engine.core.model import LoadedModel
from engine.core.sampling import SamplingConfig
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.engines.spectune.loop import choose_loop
from engine.models.tiny import load_tiny

TARGET, DRAFT = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"
GAMMA = 4
WIDTHS = range(1, GAMMA + 2)
PROMPT = "the quick brown fox jumps over the lazy dog, again and again"


def _counted(ref: str) -> tuple[LoadedModel, CompileCounter]:
    model = load_tiny(ref, logit_scale=4.0)
    counter = CompileCounter()
    model.compiled = CompiledLoop(model, 256, GAMMA + 1, backend=counter)
    model.compiled.compile(WIDTHS)
    return model, counter


@pytest.fixture(scope="module")
def counted() -> tuple[LoadedModel, CompileCounter, LoadedModel, list[int]]:
    torch._dynamo.reset()
    target, counter = _counted(TARGET)
    draft, _ = _counted(DRAFT)
    return target, counter, draft, target.tokenizer.encode(PROMPT)


def _addresses(seq: StaticSequence) -> list[int]:
    return [tensor.data_ptr() for tensor in seq.tensors()]


def test_every_cache_tensor_keeps_its_address_through_forwards_and_rollbacks(counted) -> None:
    target, _, draft, ids = counted
    seq = sequence_cache(target)
    before = _addresses(seq)
    assert len(before) == 3 + 3 * len(seq.layers)
    with torch.inference_mode():
        forward_step(target, ids, seq, 1)  # the prefill, eager, into the same buffers
        forward_step(target, ids[:3], seq, 3)
    assert _addresses(seq) == before
    crop_to(seq, len(ids) - 2)
    assert _addresses(seq) == before
    assert seq.get_seq_length() == len(ids) - 2 and int(seq.position) == len(ids) - 2
    cfg = DecodeConfig(GAMMA, SamplingConfig(0.0), 24, stop_on_eos=False)
    _, steps = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids, cfg)
    assert any(s.accepted < s.gamma for s in steps)  # rejections: the cache rolled back mid-decode
    assert sequence_cache(target) is seq and _addresses(seq) == before


def test_rolling_back_and_running_every_width_again_compiles_nothing_new(counted) -> None:
    target, counter, _, ids = counted
    assert counter.frame_count == len(WIDTHS)  # one graph per width, each compiled once
    seq = sequence_cache(target)
    other = target.compiled.empty_cache("draft")  # a second sequence shares the compiled steps
    with torch.inference_mode():
        for start in (len(ids), len(ids) + 7, 3):
            for width in WIDTHS:
                for cache in (seq, other):
                    crop_to(cache, 0)
                    forward_step(target, ids[:start], cache, 1)
                    forward_step(target, ids[:width], cache, width)
                    crop_to(cache, start - 1)
                    forward_step(target, ids[:width], cache, width)
    assert counter.frame_count == len(WIDTHS)
    assert target.compiled.graph_count() == 0  # the capture itself happens on a GPU only


def _fresh_sequence(model: LoadedModel) -> tuple[CompiledLoop, StaticSequence]:
    loop = CompiledLoop(model, 256, GAMMA + 1, backend=CompileCounter())
    model.compiled = loop
    return loop, loop.empty_cache()


def test_the_step_traces_as_one_graph_with_no_break() -> None:
    loop, seq = _fresh_sequence(load_tiny(TARGET))
    with torch.inference_mode():
        explained = torch._dynamo.explain(static_step)(loop.model.model, seq, 3)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_the_traced_step_holds_no_op_a_cuda_graph_cannot_capture() -> None:
    ops: list[str] = []

    def record(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        ops.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    model = load_tiny(TARGET)
    model.compiled = CompiledLoop(model, 256, 2, backend=aot_autograd(fw_compiler=record))
    model.compiled.compile([1, 2])
    assert any("index_copy" in op for op in ops)  # the cache write is in the graph, on the device
    names = {part for op in ops for part in op.split(".")}
    assert not names & HOST_READS, sorted(names & HOST_READS)
    assert not names & {"_assert_scalar", "sym_constrain_range", "_local_scalar_dense"}


def test_eager_kernels_decode_the_same_tokens_as_the_eager_loop(monkeypatch) -> None:
    """The step with uncompiled kernels (SPECTUNE_COMPILE_MODE=eager) through the static buffers: greedy fp32 output
    equals the eager loop's, with a draft model and with n-gram."""
    monkeypatch.setenv("SPECTUNE_COMPILE_MODE", "eager")
    target, draft = load_tiny(TARGET, logit_scale=4.0), load_tiny(DRAFT, logit_scale=4.0)
    ids = target.tokenizer.encode(PROMPT)
    cfg = DecodeConfig(GAMMA, SamplingConfig(0.0), 24, stop_on_eos=False)

    def decode() -> list[list[int]]:
        sources = (ModelDraft(draft, target.vocab_size), NgramDraft(3))
        return [decode_prompt(target, source, ids, cfg)[0].token_ids for source in sources]

    eager = decode()
    for model in (target, draft):
        model.compiled = CompiledLoop(model, 256, GAMMA + 1)
        model.compiled.compile(WIDTHS)
    assert target.compiled.mode == "eager" and target.loop == "compiled"
    assert decode() == eager


def test_each_loop_compiles_its_own_step_against_its_own_recompile_limit(monkeypatch) -> None:
    """Two loops (two models) each compile every width up to a recompile limit they would exceed together: dynamo
    keeps the entries and the count on the step's code object, and each loop has its own copy of it."""
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 3)
    widths = range(1, 4)
    loops = []
    with torch._dynamo.config.patch(recompile_limit=3):  # (monkeypatch's undo deletes a dynamo config entry)
        for ref in (TARGET, DRAFT):
            model, counter = load_tiny(ref), CompileCounter()
            model.compiled = CompiledLoop(model, 256, len(widths), backend=counter)
            model.compiled.compile(widths)  # the second would raise (fullgraph: the limit is a hard failure) if shared
            loops.append((model.compiled, counter))
    assert [counter.frame_count for _, counter in loops] == [len(widths)] * 2
    codes = [loop._step._torchdynamo_orig_callable.__code__ for loop, _ in loops]
    assert codes[0] is not codes[1] and all(code is not static_step.__code__ for code in codes)  # equal, not one


def _with_item(kind: str) -> LoadedModel:
    """A tiny model whose forward reads a value from the device and uses it ("read") or branches on it."""
    model = load_tiny(TARGET)
    inner = model.model.forward

    def forward(*args: object, **kwargs: torch.Tensor) -> object:
        top = kwargs["input_ids"].max().item()
        if kind == "branch" and top < 0:
            raise ValueError("negative token id")
        kwargs["input_ids"] = kwargs["input_ids"].clamp(max=top)
        return inner(*args, **kwargs)

    model.model.forward = forward
    model.ref = f"item-in-forward-{kind}"
    return model


@pytest.mark.parametrize("kind", ["read", "branch"])
def test_a_model_that_cannot_be_captured_is_refused_in_one_line(kind, tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_LOOP", raising=False)
    model = _with_item(kind)
    ids = model.tokenizer.encode(PROMPT)
    with pytest.raises(Uncapturable, match=model.ref):
        CompiledLoop(model, 256, 2, backend="eager").compile([1])
    torch._dynamo.reset()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        choice = choose_loop("auto", model, ids, len(ids) + 24, 2, "this machine")
    use_eager(model)
    assert choice.loop == "eager" and model.ref in choice.basis
    assert ("reads the device from the host" if kind == "read" else "branches on a value") in choice.basis
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warned] == ["spectune.loop"], [r.getMessage()[:80] for r in warned]
    assert "\n" not in warned[0].getMessage() and model.ref in warned[0].getMessage()
