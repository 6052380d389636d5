"""Every export format parsed back (json.loads / shlex.split) and checked field by field, on, n-gram and off.

That the engines themselves accept the exports (and transformers drafts exactly γ) is tests/test_export_engines.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.analysis.export import (  # noqa: E402
    HF_ORIGIN,
    LLAMACPP_BUILD,
    LLAMACPP_SPEC_PARAMS_BUILD,
    SGLANG_VERSION,
    TRANSFORMERS_VERSION,
    VLLM_SCHEDULE_SINCE,
    VLLM_VERSION,
    EngineRef,
    bundled_gguf_path,
    engine_ref,
    export,
    export_format,
    export_vllm,
    format_names,
    other_tokenizer,
    vllm_schedule,
)
from engine.analysis.recommend import DraftMeasurement, Recommendation, gamma_schedule, recommend  # noqa: E402
from engine.analysis.regime import classify_batch_sweep, classify_verify_curve, regime_report  # noqa: E402
from engine.models.bundled import BUNDLED  # noqa: E402
from engine.models.loading import converted_dir  # noqa: E402


def draft_rec(temperature: float = 0.0) -> Recommendation:
    m = DraftMeasurement(
        name="qwen-0.5b",
        method="draft_model",
        model_ref="Qwen/Qwen2.5-0.5B-Instruct",
        alpha=0.75,
        per_position_acceptance=[0.8, 0.75, 0.7],
        c=0.02,
        verify_cost={2: 1.01, 4: 1.03, 8: 1.08},
        agreement_runs=[[2, 1, 0, 3, 2, 1, 0], [0, 0, 4]],
        temperature=temperature,
        measured_speedup={4: 2.3},
        session_ids=[11, 12],
    )
    return recommend([m], "latency", "memory-bound", gammas=range(1, 9))


def ngram_rec() -> Recommendation:
    m = DraftMeasurement("ngram-3", "ngram", None, 0.5, [0.6, 0.5], 0.0, {9: 1.3}, ngram_max=3, ngram_min=2)
    return recommend([m], "latency", "memory-bound", gammas=range(1, 9))


def off_rec() -> Recommendation:
    m = DraftMeasurement("weak", "draft_model", "tiny/weak", 0.05, [0.05], 0.2)
    rec = recommend([m], "latency", "memory-bound")
    assert rec.off
    return rec


def flags(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def speculative_config(text: str) -> dict | None:
    doc = json.loads(text)
    assert doc["engine"] == "vllm" and doc["engine_version"] == VLLM_VERSION
    return doc["speculative_config"]


def test_vllm_draft_model() -> None:
    rec = draft_rec()
    name, text = export(rec, "vllm")
    assert name == export_format("vllm").filename and name.endswith(".json")
    assert speculative_config(text) == {
        "method": "draft_model",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "num_speculative_tokens": rec.gamma,
    }
    assert rec.gamma >= 1
    config = export_format("vllm").filename
    assert f'--speculative-config "$(jq -c .speculative_config {config})"' in json.loads(text)["usage"]


def test_vllm_schedule() -> None:
    rec = draft_rec()
    schedule = {1: 6, 2: 6, 4: 6, 8: 3, 16: 0, 32: 0}
    text = export(rec, "vllm", schedule=schedule)[1]
    config = speculative_config(text)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 6], [8, 15, 3], [16, 32, 0]]
    assert config["num_speculative_tokens"] == max(rec.gamma, 6)
    assert any(f"vLLM >= {VLLM_SCHEDULE_SINCE}" in c for c in json.loads(text)["comments"])
    # schedule taken from the recommendation when not passed; this one is constant: no batch schedule
    rec.schedule = gamma_schedule(rec.measurement, knee_batch=16)  # type: ignore[arg-type]
    assert set(rec.schedule.values()) == {rec.gamma}
    assert "num_speculative_tokens_per_batch_size" not in speculative_config(export(rec, "vllm")[1])
    rec.schedule = {1: rec.gamma, 4: rec.gamma, 16: 1, 32: 0}
    config = speculative_config(export(rec, "vllm")[1])
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][2] == 0
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous
    assert vllm_schedule({4: 2, 8: 2}) == [[1, 8, 2]]
    assert vllm_schedule({}) == []


def test_vllm_constant_schedule_is_not_a_batch_schedule() -> None:
    """A schedule with one γ everywhere must not switch on vLLM's dynamic mode (nor need vLLM >= 0.24)."""
    rec = draft_rec()
    for schedule in ({1: rec.gamma, 16: rec.gamma}, {1: 4, 8: 4, 64: 4}, {1: rec.gamma}):
        for text in (export(rec, "vllm", schedule=schedule)[1], export_vllm(rec, schedule)):
            config = speculative_config(text)
            assert "num_speculative_tokens_per_batch_size" not in config
            assert config["num_speculative_tokens"] == rec.gamma
            assert VLLM_SCHEDULE_SINCE not in text


def test_vllm_ngram_and_off() -> None:
    rec = ngram_rec()
    assert speculative_config(export(rec, "vllm")[1]) == {
        "method": "ngram",
        "num_speculative_tokens": rec.gamma,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 2,
    }
    off = off_rec()
    doc = json.loads(export(off, "vllm", schedule={1: 4})[1])
    assert doc["speculative_config"] is None and doc["engine_version"] == VLLM_VERSION
    assert doc["reason"] == off.explanation and "Speculation off" in doc["reason"]
    assert "without --speculative-config" in doc["note"]


def test_sglang_flags() -> None:
    rec = draft_rec()
    name, text = export(rec, "sglang")
    assert name == export_format("sglang").filename
    assert text.startswith(f"# SGLang {SGLANG_VERSION} ")
    args = flags(text)
    assert value(args, "--speculative-algorithm") == "STANDALONE"
    assert value(args, "--speculative-draft-model-path") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert value(args, "--speculative-num-steps") == str(rec.gamma)
    assert value(args, "--speculative-eagle-topk") == "1"
    assert value(args, "--speculative-num-draft-tokens") == str(rec.gamma + 1)
    assert len(args) == 10
    off_text = export(off_rec(), "sglang")[1]
    assert flags(off_text) == []
    assert off_text.startswith(f"# SGLang {SGLANG_VERSION} ") and "# Speculation off:" in off_text


def test_sglang_ngram_uses_the_flags_of_the_pinned_version() -> None:
    """The match-window flags went in SGLang 0.5.10; 0.5.23 bounds the match by the trie depth."""
    ng = ngram_rec()
    args = flags(export(ng, "sglang")[1])
    assert value(args, "--speculative-algorithm") == "NGRAM"
    assert value(args, "--speculative-num-draft-tokens") == str(ng.gamma + 1)
    assert value(args, "--speculative-ngram-max-bfs-breadth") == "1"
    assert value(args, "--speculative-ngram-max-trie-depth") == str(3 + ng.gamma)
    assert not [a for a in args if "match-window" in a]
    assert "--speculative-draft-model-path" not in args


def test_sglang_quotes_odd_paths() -> None:
    rec = draft_rec()
    rec.model_ref = "/models/my draft's dir"
    args = flags(export(rec, "sglang")[1])
    assert value(args, "--speculative-draft-model-path") == "/models/my draft's dir"


def test_transformers_kwargs() -> None:
    """γ goes on the assistant's generation_config: transformers ignores generate(num_assistant_tokens=...)."""
    rec = draft_rec()
    name, text = export(rec, "transformers")
    assert name == export_format("transformers").filename
    doc = json.loads(text)
    assert (doc["engine"], doc["engine_version"], doc["speculation"]) == (
        "transformers",
        TRANSFORMERS_VERSION,
        "draft_model",
    )
    assert doc["assistant_generation_config"] == {
        "num_assistant_tokens": rec.gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    assert doc["generate_kwargs"] == {"assistant_model": "Qwen/Qwen2.5-0.5B-Instruct", "do_sample": False}
    assert doc["load"] == {"assistant_model": "AutoModelForCausalLM"}
    sampled = json.loads(export(draft_rec(temperature=0.7), "transformers")[1])["generate_kwargs"]
    assert sampled["do_sample"] is True and sampled["temperature"] == 0.7
    ng = ngram_rec()
    kwargs = json.loads(export(ng, "transformers")[1])["generate_kwargs"]
    assert kwargs == {"prompt_lookup_num_tokens": ng.gamma, "max_matching_ngram_size": 3, "do_sample": False}
    off = json.loads(export(off_rec(), "transformers")[1])
    assert off["speculation"] == "off" and off["engine_version"] == TRANSFORMERS_VERSION
    assert off["generate_kwargs"] == {"do_sample": False}
    assert "Speculation off" in off["note"]


def test_llamacpp_flags() -> None:
    """Build 11434 refuses --draft-max/--draft-min; -md alone loads the draft without speculating."""
    rec = draft_rec()
    rec.model_ref = "/models/qwen2.5-0.5b-q8_0.gguf"
    name, text = export(rec, "llamacpp")
    assert name == export_format("llamacpp").filename
    assert text.startswith(f"# llama-server flags for llama.cpp build {LLAMACPP_BUILD} ")
    assert flags(text) == [
        "--spec-type", "draft-simple",
        "--spec-draft-model", "/models/qwen2.5-0.5b-q8_0.gguf",
        "--spec-draft-n-max", str(rec.gamma),
        "--spec-draft-n-min", "0",
        "--spec-draft-p-min", "0",
    ]  # fmt: skip
    assert "convert" not in text
    hf = export(draft_rec(), "llamacpp")[1]
    assert value(flags(hf), "--spec-draft-model") == "<Qwen/Qwen2.5-0.5B-Instruct as .gguf>"
    assert "# you must supply: llama.cpp loads GGUF files: convert Qwen/Qwen2.5-0.5B-Instruct to GGUF" in hf
    ng = ngram_rec()
    assert flags(export(ng, "llamacpp")[1]) == [
        "--spec-type", "ngram-simple",
        "--spec-ngram-simple-size-n", "3",
        "--spec-ngram-simple-size-m", str(ng.gamma),
    ]  # fmt: skip
    off_text = export(off_rec(), "llamacpp")[1]
    assert flags(off_text) == [] and "Speculation off" in off_text


def test_llamacpp_flags_follow_the_named_build() -> None:
    rec = draft_rec()
    rec.model_ref = "/m/d.gguf"
    old = export(rec, "llamacpp", llamacpp_build=LLAMACPP_SPEC_PARAMS_BUILD - 1)[1]
    assert f"build {LLAMACPP_SPEC_PARAMS_BUILD - 1}" in old.splitlines()[0]
    assert flags(old) == ["-md", "/m/d.gguf", "--draft-max", str(rec.gamma), "--draft-min", "0", "--draft-p-min", "0"]
    new = export(rec, "llamacpp", llamacpp_build=LLAMACPP_SPEC_PARAMS_BUILD)[1]
    assert f"build {LLAMACPP_SPEC_PARAMS_BUILD}" in new.splitlines()[0]
    assert value(flags(new), "--spec-draft-n-max") == str(rec.gamma)
    assert flags(export(ngram_rec(), "llamacpp", llamacpp_build=8000)[1]) == []  # no server-side n-gram flags
    assert LLAMACPP_BUILD == 11434


def test_schedule_is_noted_where_unsupported() -> None:
    rec = draft_rec()
    for fmt in ("sglang", "llamacpp"):
        text = export(rec, fmt, schedule={1: 5, 16: 0})[1]
        assert "no per-batch γ flag" in text
        assert "--speculative-num-steps" in flags(text) or "--spec-draft-n-max" in flags(text)


def test_bundled_models_are_exported_as_what_each_engine_loads() -> None:
    """No engine knows spectune's aliases: llama.cpp gets the assembled GGUF, the others the official repository."""
    assert set(HF_ORIGIN) == set(BUNDLED)
    rec = draft_rec()
    rec.model_ref = "qwen2.5-coder-0.5b"
    origin = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    vllm_text = export(rec, "vllm", target="qwen2.5-coder-1.5b")[1]
    assert speculative_config(vllm_text)["model"] == origin
    assert json.loads(vllm_text)["usage"].startswith("vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct ")
    assert any(str(converted_dir("qwen2.5-coder-0.5b")) in c for c in json.loads(vllm_text)["comments"])
    assert value(flags(export(rec, "sglang")[1]), "--speculative-draft-model-path") == origin
    assert json.loads(export(rec, "transformers")[1])["generate_kwargs"]["assistant_model"] == origin
    llama = export(rec, "llamacpp", target="qwen2.5-coder-1.5b")[1]
    assert value(flags(llama), "--spec-draft-model") == str(bundled_gguf_path("qwen2.5-coder-0.5b"))
    assert f"llama-server -m {bundled_gguf_path('qwen2.5-coder-1.5b')} " in llama
    for text in (vllm_text, llama):
        assert 'qwen2.5-coder-0.5b"' not in text and "'qwen2.5-coder-0.5b'" not in text


def test_bundled_gguf_path_is_where_assembled_gguf_puts_it(tmp_path, monkeypatch) -> None:
    from engine.models.bundled import assembled_gguf

    monkeypatch.setenv("SPECTUNE_MODEL_CACHE", str(tmp_path))
    model = BUNDLED["smollm2-135m"]
    path = bundled_gguf_path(model.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    path.with_suffix(".verified").write_text(model.sha256)  # assembled_gguf then returns at once
    assert assembled_gguf(model, progress=False) == path and path.suffix == ".gguf"


def test_model_references_an_engine_cannot_load_become_placeholders() -> None:
    rec = draft_rec()
    rec.model_ref = "/models/draft-q4.gguf"
    config = speculative_config(export(rec, "vllm")[1])
    assert config["model"] == "<checkpoint of draft-q4.gguf>"
    for fmt in ("vllm", "sglang", "transformers"):
        assert "you must supply" in export(rec, fmt)[1]
    assert value(flags(export(rec, "llamacpp")[1]), "--spec-draft-model") == "/models/draft-q4.gguf"
    assert engine_ref("/models/ckpt", "hf") == EngineRef("/models/ckpt")
    with pytest.raises(ValueError):
        engine_ref("x", "tgi")


def test_draft_with_another_tokenizer() -> None:
    """SmolLM2 for a Qwen target: transformers re-tokenises, vLLM 0.33 intersects vocabularies, SGLang 0.5.23
    and llama.cpp refuse such a draft, so they get no flags and a reason instead of a config that fails."""
    rec = draft_rec()
    rec.model_ref = "smollm2-135m"
    smol = "HuggingFaceTB/SmolLM2-135M-Instruct"
    for target in ("qwen2.5-coder-1.5b", None):
        config = speculative_config(export(rec, "vllm", target=target)[1])
        assert config["model"] == smol and config["use_heterogeneous_vocab"] is True
        sglang = export(rec, "sglang", target=target)[1]
        assert flags(sglang) == [] and "STANDALONE requires the draft to share the target's vocabulary" in sglang
        llama = export(rec, "llamacpp", target=target)[1]
        assert flags(llama) == [] and "has another tokenizer" in llama
        doc = json.loads(export(rec, "transformers", target=target)[1])
        assert doc["generate_kwargs"]["assistant_tokenizer"] == smol
        assert doc["load"]["tokenizer"] == doc["load"]["assistant_tokenizer"] == "AutoTokenizer"
        assert doc["assistant_generation_config"]["num_assistant_tokens"] == rec.gamma
    tf = json.loads(export(rec, "transformers", target="qwen2.5-coder-1.5b")[1])
    assert tf["generate_kwargs"]["tokenizer"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert "assumed" in export(rec, "vllm")[1] and "assumed" not in export(rec, "vllm", target="qwen2.5-coder-1.5b")[1]
    assert other_tokenizer("smollm2-135m", "qwen2.5-coder-1.5b") == (True, None)
    assert other_tokenizer("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b") == (False, None)
    assert other_tokenizer("my/draft", "qwen2.5-coder-1.5b") == (None, None)
    same = draft_rec()
    same.model_ref = "qwen2.5-coder-0.5b"
    assert "use_heterogeneous_vocab" not in speculative_config(export(same, "vllm")[1])
    assert "tokenizer" not in json.loads(export(same, "transformers")[1])["generate_kwargs"]


def test_every_export_names_its_engine_version() -> None:
    for rec in (draft_rec(), ngram_rec(), off_rec()):
        assert json.loads(export(rec, "vllm")[1])["engine_version"] == VLLM_VERSION
        assert json.loads(export(rec, "transformers")[1])["engine_version"] == TRANSFORMERS_VERSION
        assert export(rec, "sglang")[1].startswith(f"# SGLang {SGLANG_VERSION} ")
        assert export(rec, "llamacpp")[1].startswith(f"# llama-server flags for llama.cpp build {LLAMACPP_BUILD} ")


def test_spectune_json_carries_the_evidence() -> None:
    rec = draft_rec()
    sweep = classify_batch_sweep([1, 2, 4, 8, 16], [1.0, 1.01, 1.03, 1.9, 3.8], serving_batch=1)
    report = regime_report(sweep, classify_verify_curve({8: 1.08}))
    schedule = gamma_schedule(rec.measurement, knee_batch=sweep.knee_batch)  # type: ignore[arg-type]
    name, text = export(rec, "spectune", regime=report, schedule=schedule)
    assert name == export_format("spectune").filename
    doc = json.loads(text)
    assert doc["format"] == "spectune.recommendation/1"
    assert doc["speculation"] == "draft_model"
    r = doc["recommendation"]
    assert (r["draft_name"], r["gamma"], r["objective"], r["regime"]) == (
        "qwen-0.5b",
        rec.gamma,
        "latency",
        "memory-bound",
    )
    assert r["predicted_speedup"] == pytest.approx(rec.predicted_speedup)
    assert r["explanation"] == rec.explanation
    assert r["schedule"] == {str(k): v for k, v in schedule.items()}
    ev = doc["evidence"]
    m = ev["measurement"]
    assert m["alpha"] == 0.75 and m["c"] == 0.02
    assert m["per_position_acceptance"] == [0.8, 0.75, 0.7]
    assert m["verify_cost"] == {"2": 1.01, "4": 1.03, "8": 1.08}
    assert m["measured_speedup"] == {"4": 2.3}
    assert m["session_ids"] == [11, 12]
    assert (m["agreement_prompts"], m["agreement_tokens"]) == (2, 10)
    assert ev["regime"]["label"] == "memory-bound" and ev["regime"]["agree"] is True
    assert ev["regime"]["votes"] == {"batch sweep": "memory-bound", "verify curve": "memory-bound"}
    curve = ev["gamma_curve"]
    assert [p["gamma"] for p in curve] == list(range(1, 9))
    assert curve[3]["measured_speedup"] == 2.3
    assert set(curve[0]) >= {"expected_tokens", "speedup_predicted", "speedup_one_alpha", "ops_multiplier"}
    assert doc["comparison"][0]["name"] == "qwen-0.5b"


def test_spectune_json_off() -> None:
    off = off_rec()
    doc = json.loads(export(off, "spectune")[1])
    assert doc["speculation"] == "off"
    assert doc["recommendation"]["gamma"] == 0
    assert doc["evidence"]["measurement"] is None
    assert doc["evidence"]["regime"]["label"] == "memory-bound"
    assert doc["comparison"][0]["pays"] is False


@pytest.mark.parametrize("fmt", format_names())
def test_every_format_round_trips(fmt: str) -> None:
    for rec in (draft_rec(), ngram_rec(), off_rec()):
        name, text = export(rec, fmt)
        assert name == export_format(fmt).filename and text.endswith("\n")
        if name.endswith(".json"):
            json.loads(text)
        else:
            flags(text)


def test_unknown_format_and_missing_ref() -> None:
    with pytest.raises(ValueError):
        export(draft_rec(), "tgi")
    rec = draft_rec()
    rec.model_ref = None
    with pytest.raises(ValueError):
        export(rec, "vllm")
