"""Every export format parsed back (json.loads / shlex.split) and checked field by field, on, n-gram and off."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.analysis.export import FILENAMES, FORMATS, export, vllm_schedule  # noqa: E402
from engine.analysis.recommend import DraftMeasurement, Recommendation, gamma_schedule, recommend  # noqa: E402
from engine.analysis.regime import classify_batch_sweep, classify_verify_curve, regime_report  # noqa: E402


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


def test_vllm_draft_model() -> None:
    rec = draft_rec()
    name, text = export(rec, "vllm")
    assert name == FILENAMES["vllm"] and name.endswith(".json")
    config = json.loads(text)
    assert config == {
        "method": "draft_model",
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "num_speculative_tokens": rec.gamma,
    }
    assert rec.gamma >= 1


def test_vllm_schedule() -> None:
    rec = draft_rec()
    schedule = {1: 6, 2: 6, 4: 6, 8: 3, 16: 0, 32: 0}
    config = json.loads(export(rec, "vllm", schedule=schedule)[1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 6], [8, 15, 3], [16, 32, 0]]
    assert config["num_speculative_tokens"] == max(rec.gamma, 6)
    # schedule taken from the recommendation when not passed
    rec.schedule = gamma_schedule(rec.measurement, knee_batch=16)  # type: ignore[arg-type]
    config = json.loads(export(rec, "vllm")[1])
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][2] == 0
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous
    assert vllm_schedule({4: 2, 8: 2}) == [[1, 8, 2]]
    assert vllm_schedule({}) == []


def test_vllm_ngram_and_off() -> None:
    config = json.loads(export(ngram_rec(), "vllm")[1])
    rec = ngram_rec()
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": rec.gamma,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 2,
    }
    off = off_rec()
    doc = json.loads(export(off, "vllm", schedule={1: 4})[1])
    assert doc["speculative_config"] is None
    assert doc["reason"] == off.explanation and "Speculation off" in doc["reason"]
    assert "without --speculative-config" in doc["note"]


def test_sglang_flags() -> None:
    rec = draft_rec()
    name, text = export(rec, "sglang")
    assert name == FILENAMES["sglang"]
    args = flags(text)
    assert value(args, "--speculative-algorithm") == "STANDALONE"
    assert value(args, "--speculative-draft-model-path") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert value(args, "--speculative-num-steps") == str(rec.gamma)
    assert value(args, "--speculative-eagle-topk") == "1"
    assert value(args, "--speculative-num-draft-tokens") == str(rec.gamma + 1)
    assert len(args) == 10
    ng = ngram_rec()
    args = flags(export(ng, "sglang")[1])
    assert value(args, "--speculative-algorithm") == "NGRAM"
    assert value(args, "--speculative-num-draft-tokens") == str(ng.gamma + 1)
    assert value(args, "--speculative-ngram-max-match-window-size") == "3"
    assert value(args, "--speculative-ngram-min-match-window-size") == "2"
    assert "--speculative-draft-model-path" not in args
    off_text = export(off_rec(), "sglang")[1]
    assert flags(off_text) == []
    assert off_text.startswith("# Speculation off:")


def test_sglang_quotes_odd_paths() -> None:
    rec = draft_rec()
    rec.model_ref = "/models/my draft's dir"
    args = flags(export(rec, "sglang")[1])
    assert value(args, "--speculative-draft-model-path") == "/models/my draft's dir"


def test_transformers_kwargs() -> None:
    rec = draft_rec()
    name, text = export(rec, "transformers")
    assert name == FILENAMES["transformers"]
    doc = json.loads(text)
    assert doc["speculation"] == "draft_model"
    assert doc["generate_kwargs"] == {
        "assistant_model": "Qwen/Qwen2.5-0.5B-Instruct",
        "num_assistant_tokens": rec.gamma,
        "num_assistant_tokens_schedule": "constant",
        "do_sample": False,
    }
    sampled = json.loads(export(draft_rec(temperature=0.7), "transformers")[1])["generate_kwargs"]
    assert sampled["do_sample"] is True and sampled["temperature"] == 0.7
    ng = ngram_rec()
    kwargs = json.loads(export(ng, "transformers")[1])["generate_kwargs"]
    assert kwargs == {"prompt_lookup_num_tokens": ng.gamma, "max_matching_ngram_size": 3, "do_sample": False}
    off = json.loads(export(off_rec(), "transformers")[1])
    assert off["speculation"] == "off"
    assert off["generate_kwargs"] == {"do_sample": False}
    assert "Speculation off" in off["note"]


def test_llamacpp_flags() -> None:
    rec = draft_rec()
    rec.model_ref = "/models/qwen2.5-0.5b-q8_0.gguf"
    name, text = export(rec, "llamacpp")
    assert name == FILENAMES["llamacpp"]
    args = flags(text)
    assert args == [
        "-md",
        "/models/qwen2.5-0.5b-q8_0.gguf",
        "--draft-max",
        str(rec.gamma),
        "--draft-min",
        "0",
        "--draft-p-min",
        "0",
    ]
    assert "convert" not in text
    hf = export(draft_rec(), "llamacpp")[1]
    assert "convert Qwen/Qwen2.5-0.5B-Instruct to GGUF" in hf
    ng = ngram_rec()
    assert flags(export(ng, "llamacpp")[1]) == ["--spec-type", "ngram-simple", "--draft-max", str(ng.gamma)]
    off_text = export(off_rec(), "llamacpp")[1]
    assert flags(off_text) == [] and "Speculation off" in off_text


def test_schedule_is_noted_where_unsupported() -> None:
    rec = draft_rec()
    for fmt in ("sglang", "llamacpp"):
        text = export(rec, fmt, schedule={1: 5, 16: 0})[1]
        assert "no per-batch γ flag" in text
        assert "--speculative-num-steps" in flags(text) or "--draft-max" in flags(text)


def test_spectune_json_carries_the_evidence() -> None:
    rec = draft_rec()
    sweep = classify_batch_sweep([1, 2, 4, 8, 16], [1.0, 1.01, 1.03, 1.9, 3.8], serving_batch=1)
    report = regime_report(sweep, classify_verify_curve({8: 1.08}))
    schedule = gamma_schedule(rec.measurement, knee_batch=sweep.knee_batch)  # type: ignore[arg-type]
    name, text = export(rec, "spectune", regime=report, schedule=schedule)
    assert name == FILENAMES["spectune"]
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


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips(fmt: str) -> None:
    for rec in (draft_rec(), ngram_rec(), off_rec()):
        name, text = export(rec, fmt)
        assert name == FILENAMES[fmt] and text.endswith("\n")
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
