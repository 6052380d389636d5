"""A speculation policy exported to every engine and parsed back: the engine's own flags or fields where it can
express the policy, the closest fixed γ and what is lost where it cannot; vLLM and SGLang files checked with their
own code (the check environment), llama.cpp flags against build 11434's --help."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from test_export import draft_rec, ngram_rec, off_rec
from test_export_engines import CHECK_PYTHON, CHECK_SGLANG, CHECK_VLLM, LLAMA_HELP, LlamaOptions, run_checker

from engine.analysis.export import export, export_format, export_formats, export_policy, export_policy_all
from engine.core.policy import AdaptiveEMA, BatchSchedule, ConfidenceStop, FixedGamma, HeuristicSchedule

TARGET = "qwen2.5-coder-1.5b"
CLOSEST = 5
POLICIES = {
    "fixed": FixedGamma(3),
    "confidence": ConfidenceStop(0.6, 16, 2),
    "confidence-keep": ConfidenceStop(0.4, 20, keep_last=True),
    "heuristic": HeuristicSchedule(20, 0.4),
    "adaptive": AdaptiveEMA(),
    "batch": BatchSchedule(((1, 4), (8, 2), (32, 1))),
}


def bundled():
    rec = draft_rec()
    rec.model_ref = "qwen2.5-coder-0.5b"
    return rec


def exported(name: str, fmt: str, rec=None):
    predicted = {"tokens_per_call": 3.1, "speedup": 1.9, "gain": 0.07, "best_fixed_gamma": CLOSEST, "basis": "exact"}
    return export_policy(rec or bundled(), POLICIES[name], fmt, closest_gamma=CLOSEST, predicted=predicted,
                         target=TARGET)  # fmt: skip


def args_of(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def llama_options() -> LlamaOptions:
    return LlamaOptions.parse(LLAMA_HELP.read_text())


@pytest.fixture(scope="module")
def check_python() -> Path:
    if not CHECK_PYTHON.is_file():
        pytest.fail("the check environment is missing: run `make check-env` (`make test` does it first)")
    return CHECK_PYTHON


# llama.cpp: p-min, n-min and n-max express the confidence stop; every flag parses against build 11434's --help
LLAMA = {  # name -> (n-max, n-min, p-min, exact)
    "fixed": ("3", "0", "0", True),
    "confidence": ("16", "2", "0.6", True),
    "confidence-keep": ("20", "0", "0.4", False),
    "heuristic": (str(CLOSEST), "0", "0.4", False),
    "adaptive": (str(CLOSEST), "0", "0", False),
    "batch": ("4", "0", "0", False),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_llamacpp_policy_flags(name, llama_options):
    e = exported(name, "llamacpp")
    args = args_of(e.text)
    assert llama_options.problems(args) == []
    n_max, n_min, p_min, exact = LLAMA[name]
    assert (value(args, "--spec-draft-n-max"), value(args, "--spec-draft-n-min"), value(args, "--spec-draft-p-min")) \
        == (n_max, n_min, p_min)  # fmt: skip
    assert value(args, "--spec-type") == "draft-simple" and e.filename == export_format("llamacpp").filename
    assert e.exact == exact and bool(e.lost) == (not exact)
    assert "# spectune policy " + POLICIES[name].spec() in e.text
    assert "draft p-min 0 always drafts" not in e.text
    for line in e.lost:
        assert f"# lost: {line}" in e.text


def test_llamacpp_legacy_build_and_ngram():
    old = export_policy(bundled(), POLICIES["confidence"], "llamacpp", llamacpp_build=8000)
    args = args_of(old.text)
    assert value(args, "--draft-max") == "16" and value(args, "--draft-min") == "2" and value(args, "--draft-p-min") \
        == "0.6"  # fmt: skip
    ng = export_policy(ngram_rec(), ConfidenceStop(0.5, 6), "llamacpp", closest_gamma=4)
    assert value(args_of(ng.text), "--spec-type") == "ngram-simple" and not ng.exact


# transformers: the assistant's generation_config carries γ, the schedule and the confidence threshold
TRANSFORMERS = {  # name -> (num_assistant_tokens, schedule, threshold, exact)
    "fixed": (3, "constant", 0.0, True),
    "confidence": (16, "constant", 0.6, False),  # keeps the unsure token, no n-min
    "confidence-keep": (20, "constant", 0.4, True),  # transformers' own default rule
    "heuristic": (20, "heuristic", 0.4, True),
    "adaptive": (CLOSEST, "constant", 0.0, False),
    "batch": (4, "constant", 0.0, False),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_transformers_policy_fields(name):
    e = exported(name, "transformers")
    doc = json.loads(e.text)
    config = doc["assistant_generation_config"]
    tokens, schedule, threshold, exact = TRANSFORMERS[name]
    assert config == {"num_assistant_tokens": tokens, "num_assistant_tokens_schedule": schedule,
                      "assistant_confidence_threshold": threshold}  # fmt: skip
    assert e.exact == exact and doc["policy"]["exact"] == exact and doc["policy"]["spec"] == POLICIES[name].spec()
    assert doc["generate_kwargs"]["assistant_model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert doc["spectune"].startswith("spectune policy ")


@pytest.mark.parametrize("name", list(POLICIES))
def test_vllm_policy_config(name, check_python, tmp_path):
    e = exported(name, "vllm")
    doc = json.loads(e.text)
    config = doc["speculative_config"]
    if name == "batch":
        assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 31, 2], [32, 32, 1]]
        assert e.exact
    else:
        assert "num_speculative_tokens_per_batch_size" not in config
        assert config["num_speculative_tokens"] == (3 if name == "fixed" else CLOSEST)
        assert e.exact == (name == "fixed")
    path = tmp_path / "vllm.json"
    path.write_text(e.text)
    result = run_checker(check_python, CHECK_VLLM, path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", list(POLICIES))
def test_sglang_policy_flags(name, check_python, tmp_path):
    e = exported(name, "sglang")
    args = args_of(e.text)
    gamma = 3 if name == "fixed" else 4 if name == "batch" else CLOSEST
    assert value(args, "--speculative-num-steps") == str(gamma)
    assert value(args, "--speculative-num-draft-tokens") == str(gamma + 1)
    assert "--speculative-adaptive" not in args  # STANDALONE drafts cannot adapt in SGLang
    assert e.exact == (name == "fixed")
    if not e.exact:
        assert "EAGLE" in e.text or "per-batch" in e.text
    path = tmp_path / "sglang-flags.txt"
    path.write_text(e.text)
    result = run_checker(check_python, CHECK_SGLANG, "--flags-file", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_spectune_record_keeps_the_policy():
    doc = json.loads(exported("heuristic", "spectune").text)
    assert doc["policy"]["spec"] == "heuristic:20:0.4" and doc["policy"]["closest_fixed_gamma"] == CLOSEST
    assert doc["policy"]["predicted"]["gain"] == 0.07
    assert doc["recommendation"]["gamma"] == CLOSEST


def test_every_format_and_off():
    everything = export_policy_all(bundled(), "confidence:0.5:8:1", closest_gamma=4, target=TARGET)
    assert set(everything) == {f.name for f in export_formats()} and all(f.policy_support for f in export_formats())
    for fmt, e in everything.items():
        assert e.filename == export_format(fmt).filename and e.text.endswith("\n")
        if fmt in ("vllm", "transformers", "spectune"):
            json.loads(e.text)
        else:
            args_of(e.text)
    off = export_policy(off_rec(), POLICIES["confidence"], "llamacpp")
    assert args_of(off.text) == [] and "Speculation off" in off.text
    with pytest.raises(ValueError):
        export_policy(bundled(), "fixed:2", "tgi")


def test_existing_exporters_are_unchanged():
    rec = bundled()
    assert export(rec, "llamacpp", target=TARGET)[1] == export(rec, "llamacpp", target=TARGET)[1]
    args = args_of(export(rec, "llamacpp", target=TARGET)[1])
    assert value(args, "--spec-draft-p-min") == "0" and value(args, "--spec-draft-n-max") == str(rec.gamma)


# --- closed loop: the exported policy, applied to transformers' generate(), drafts what spectune's loop drafts -------


def tiny_sharp_pair():
    """The tiny fp32 pair without EOS (a drafted EOS would rightly cut a draft short); the draft's model ref."""
    from engine.models.tiny import load_tiny

    pair = [load_tiny(ref, dtype="float32") for ref in ("tiny:1:48:2:64", "tiny:1:48:2:64~0.15")]
    for m in pair:
        m.model.generation_config.eos_token_id = None
        m.model.generation_config.pad_token_id = 0
    return (*pair, "tiny:1:48:2:64~0.15", "AutoModelForCausalLM", "the quick brown fox jumps over the lazy dog. the")


def bundled_pair():
    """The bundled Qwen2.5-Coder pair in fp32 (the draft's confidence varies, unlike a tiny random model's)."""
    from conftest import REAL_PROMPTS, real_pair
    from test_export_engines import HF_ORIGIN

    target, draft = real_pair("float32")
    return target, draft, "qwen2.5-coder-0.5b", HF_ORIGIN["qwen2.5-coder-0.5b"], REAL_PROMPTS[2]


@pytest.mark.parametrize(
    "pair, policy",
    [pytest.param(tiny_sharp_pair, HeuristicSchedule(3), id="heuristic-tiny"),
     pytest.param(bundled_pair, ConfidenceStop(0.5, 12, keep_last=True), id="confidence-keep-real",
                  marks=pytest.mark.real_model)],
)  # fmt: skip
def test_transformers_runs_the_exported_policy_as_spectunes_loop_does(pair, policy):
    """The transformers export of the heuristic schedule and of a confidence stop (assistant_confidence_threshold),
    applied to generate() in fp32: every step drafts as many tokens as spectune's own loop drafts with that policy
    on the same prompt, the threshold is the exported one, and the output is the target's alone."""
    from dataclasses import replace

    import torch
    from conftest import greedy_config
    from test_export_engines import closed_loop

    from engine.core.decoder import decode_prompt
    from engine.core.policy import PolicyRun
    from engine.drafts.model import ModelDraft

    target, draft, ref, origin, text = pair()
    rec = draft_rec()
    rec.model_ref = ref
    e = export_policy(rec, policy, "transformers", closest_gamma=CLOSEST, target=TARGET)
    assert e.exact, e.lost
    doc = json.loads(e.text)
    objects = {("AutoModelForCausalLM", doc["generate_kwargs"]["assistant_model"]): draft.model}
    assert doc["generate_kwargs"]["assistant_model"] in (ref, origin)
    prompt = target.tokenizer(text, return_tensors="pt")
    new_tokens = 24
    steps, assisted, alone = closed_loop(doc, target.model, draft.model, objects, prompt["input_ids"], new_tokens)
    assert torch.equal(assisted, alone)
    threshold = doc["assistant_generation_config"]["assistant_confidence_threshold"]
    assert all(s["threshold"] == threshold for s in steps), steps

    ids = prompt["input_ids"][0].tolist()
    cfg = replace(greedy_config(policy.max_draft(), new_tokens), policy=policy)
    out, records = decode_prompt(target, ModelDraft(draft, target.vocab_size), ids, cfg, policy_run=PolicyRun(policy))
    assert out.token_ids == alone[0, len(ids) :].tolist()
    ours, theirs = [r.gamma for r in records], [s["drafted"] for s in steps]
    assert len(set(theirs)) > 2, theirs  # the policy varied the draft length: not a fixed γ in disguise
    # transformers' last step may draft fewer where max_new_tokens leaves less room: compare the others
    assert len(steps) == len(records) and theirs[:-1] == ours[:-1], (theirs, ours)


@pytest.mark.real_model
def test_llama_server_runs_the_exported_policy_as_spectune_measured_it(tmp_path):
    """llama-server started with exactly the exported confidence-stop flags drafts as spectune's own llama.cpp run of
    that policy did (the run its replay was checked against): the same output, drafts, draft and accepted tokens."""
    from test_export_engines import exported_llama_server

    from engine.engines.llamacpp import client
    from engine.service.decide.llamacpp_live import llamacpp_live

    policy = ConfidenceStop(0.6, 8, 0)
    e = export_policy(bundled(), policy, "llamacpp", closest_gamma=CLOSEST, target=TARGET)
    assert e.exact, e.lost
    prompt = "Write a Python function is_even(n) that returns True when n is even."
    measured = llamacpp_live(policy.spec(), [prompt], 24, threads=2)
    with exported_llama_server(args_of(e.text), tmp_path) as base:
        before = client.metrics(base)
        done = client.complete(base, measured["chat_prompts"][0], 24)
        counters = client.metrics(base).minus(before)
    assert done.token_ids == measured["outputs"][0]
    assert (done.draft_n, done.draft_n_accepted) == (measured["draft_tokens"], measured["accepted"])
    assert counters.drafts > 0 and counters.draft_tokens <= policy.n_max * counters.drafts
    assert counters.tokens_per_call() == pytest.approx(measured["tokens_per_call"])
