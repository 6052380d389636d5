"""The compiled loop (a static KV cache, compiled forwards) decodes exactly what the eager loop decodes, and a session
measures in the loop it says it used.

Compiling costs tens of seconds on 2 cores, so the models here are compiled once per module (torch's compile cache
keeps what it built between runs on one machine)."""

from __future__ import annotations

import pytest

from engine.core.compiled import STEP_BUFFER, cache_length, use_compiled, use_eager
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.proposal import NoDraft
from engine.core.sampling import SamplingConfig
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.engines import registry
from engine.engines.spectune.loop import choose_loop, kept
from engine.engines.spectune.options import LoopOptions
from engine.models.pool import ModelPool
from engine.models.tiny import load_tiny
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec

TARGET, DRAFT = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"
PROMPTS = ["the quick brown fox jumps over the lazy dog, again and again", "hello world, hello again"]
WIDEST = 5
NEW = 24


@pytest.fixture(scope="module")
def tiny_models():
    target, draft = load_tiny(TARGET, logit_scale=4.0), load_tiny(DRAFT, logit_scale=4.0)
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    need = max(len(i) for i in ids) + NEW + WIDEST + 1
    for model in (target, draft):
        use_compiled(model, need, WIDEST).compile(range(1, WIDEST + 1))
    yield target, draft, ids, need
    for model in (target, draft):
        use_eager(model)


def _decode(target, draft_source, ids, cfg):
    return [decode_prompt(target, draft_source, i, cfg)[0].token_ids for i in ids]


def test_the_compiled_loop_is_token_identical_to_the_eager_loop(tiny_models):
    target, draft, ids, need = tiny_models
    cfg = DecodeConfig(4, SamplingConfig(0.0), NEW, stop_on_eos=False)
    compiled = [_decode(target, source, ids, cfg) for source in (NoDraft(), ModelDraft(draft, target.vocab_size),
                                                                 NgramDraft(3))]  # fmt: skip
    assert target.loop == "compiled" and draft.loop == "compiled"
    for model in (target, draft):
        use_eager(model)
    eager = [_decode(target, source, ids, cfg) for source in (NoDraft(), ModelDraft(draft, target.vocab_size),
                                                              NgramDraft(3))]  # fmt: skip
    for model in (target, draft):
        use_compiled(model, need, WIDEST)
    assert compiled == eager
    assert compiled[0] == compiled[1] == compiled[2]  # speculation changes nothing in greedy fp32


def test_a_rollback_moves_the_static_cache_position_and_copies_nothing(tiny_models):
    target, draft, ids, _ = tiny_models
    cache = target.compiled.empty_cache()
    buffers = [layer.keys.data_ptr() for layer in cache.layers]
    cfg = DecodeConfig(4, SamplingConfig(0.0), NEW, stop_on_eos=False)
    out, steps = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids[0], cfg)
    assert any(s.accepted < s.gamma for s in steps)  # some drafts were rejected: the cache rolled back
    assert [layer.keys.data_ptr() for layer in cache.layers] == buffers
    assert target.compiled.cache_len == cache_length(len(ids[0]) + NEW + WIDEST + 1)


def test_sampling_runs_the_same_rule_in_the_compiled_loop(tiny_models):
    """At T > 0 the loop draws with the same seeded generator and rejection rule: the draft model's tokens are
    accepted as often as in the eager loop (the same draws, up to the compiled kernels' rounding)."""
    target, draft, ids, need = tiny_models
    cfg = DecodeConfig(3, SamplingConfig(0.8), NEW, seed=5, stop_on_eos=False)
    compiled = [decode_prompt(target, ModelDraft(draft, target.vocab_size), i, cfg) for i in ids]
    for model in (target, draft):
        use_eager(model)
    eager = [decode_prompt(target, ModelDraft(draft, target.vocab_size), i, cfg) for i in ids]
    for model in (target, draft):
        use_compiled(model, need, WIDEST)
    accepted = [sum(s.accepted for s in steps) for _, steps in compiled]
    assert accepted == [sum(s.accepted for s in steps) for _, steps in eager]
    assert all(len(out.token_ids) == NEW for out, _ in compiled)


def test_a_session_measures_in_the_loop_it_names(tiny_models, tmp_path, monkeypatch):
    """c, v(k) and every run in the compiled loop; the report says so, with the compile as its own phase."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    target, draft, _, _ = tiny_models
    pool = ModelPool()
    pool.adopt(target)
    pool.adopt(draft)
    spec = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[2, 4], max_new_tokens=16, dtype="float32",
                       device="cpu", chat_template=False,
                       engine_options=LoopOptions("compiled", threads=1))  # fmt: skip
    report = registry.sweep(spec, [PromptText(str(i), p) for i, p in enumerate(PROMPTS)], pool=pool).to_dict()
    assert report["loop"] == "compiled" and report["threads"] == 1
    assert report["loop_basis"] == "as set"
    assert set(report["verify_cost"]) == {"1", "2", "3", "4", "5"}
    assert all(run["c"] is not None for run in report["runs"] if run["draft"] == DRAFT)
    assert "measurement_floor" in report and report["measurement_floor"]["spread"]["n"] == len(PROMPTS)
    assert not report["failed"]


def test_auto_probes_once_per_machine_target_and_dtype(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_LOOP", raising=False)
    target, _, ids, need = tiny_models
    first = choose_loop("auto", target, ids[0], need, WIDEST, "this machine")
    assert first.basis.startswith("probed in")
    assert first.loop in ("eager", "compiled")
    [probe] = kept()
    assert probe.eager_ms > 0 and probe.compiled_ms is not None and probe.compiled_ms > 0
    again = choose_loop("auto", target, ids[0], need, WIDEST, "this machine")
    assert again.loop == first.loop and again.basis.startswith("kept probe")
    monkeypatch.setenv("SPECTUNE_LOOP", "eager")
    assert choose_loop("auto", target, ids[0], need, WIDEST, "this machine").loop == "eager"
    assert choose_loop("compiled", target, ids[0], need, WIDEST, "this machine").basis == "as set"


def test_auto_compiles_only_where_the_saving_pays_for_the_widths_left(tiny_models, tmp_path, monkeypatch):
    """A probe that found the compiled loop 75 ms a token faster after a 55 s compile (a 1.5B target on 2 cores):
    nine widths still to compile (495 s) pay back only over more than 6600 tokens; with nothing left to compile the
    compiled loop is kept whatever the sweep's length."""
    from engine.engines.spectune.loop import LoopProbe, keep, widths_to_compile

    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_LOOP", raising=False)
    target, _, ids, need = tiny_models
    keep(LoopProbe("this machine", target.ref, target.dtype, target.device, 250.0, 175.0, 55.0, "compiled"))
    short = choose_loop("auto", target, ids[0], need, WIDEST, "this machine", tokens=2000, to_compile=lambda: 9)
    assert short.loop == "eager" and "about 495 s" in short.basis and "save about 150 s" in short.basis
    assert short.basis.startswith("kept probe, compiled")  # what the probe chose, then why not here
    long = choose_loop("auto", target, ids[0], need, WIDEST, "this machine", tokens=7000, to_compile=lambda: 9)
    assert long.loop == "compiled"
    assert widths_to_compile(target, need, WIDEST) == 0  # the fixture compiled every width
    assert widths_to_compile(target, need, WIDEST + 2) == 2  # two more widths, within its input buffers
    assert widths_to_compile(target, need, STEP_BUFFER + 1) == STEP_BUFFER + 1  # wider buffers: a new loop
    assert widths_to_compile(target, need * 100, WIDEST) == WIDEST  # so does a longer static cache
    done = choose_loop("auto", target, ids[0], need, WIDEST, "this machine", tokens=10,
                       to_compile=lambda: widths_to_compile(target, need, WIDEST))  # fmt: skip
    assert done.loop == "compiled"


def test_the_bundled_model_decodes_the_same_tokens_compiled() -> None:
    """SmolLM2-135M (bundled, float32) with n-gram γ=3: the compiled loop's greedy output equals the eager loop's."""
    from engine.models.chat import encode_prompt

    model = ModelPool().get("smollm2-135m", "float32", "cpu")
    prompts = ["Repeat after me: the cat sat on the mat, the cat sat on the mat,", "List three primes:"]
    ids = [encode_prompt(model.tokenizer, p, True) for p in prompts]
    cfg = DecodeConfig(3, SamplingConfig(0.0), 24, stop_on_eos=False)
    use_eager(model)
    eager = _decode(model, NgramDraft(3), ids, cfg)
    use_compiled(model, max(len(i) for i in ids) + 24 + 5, 4).compile(range(1, 5))
    try:
        compiled = _decode(model, NgramDraft(3), ids, cfg)
    finally:
        use_eager(model)
    assert compiled == eager
