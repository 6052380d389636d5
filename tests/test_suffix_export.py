"""Suffix decoding exported: vLLM's `method: "suffix"` with the measured parameters (checked with vLLM 0.33.0's
own config source), and SGLang / llama.cpp / transformers with their closest method and what it loses."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from test_export_engines import CHECK_SGLANG, CHECK_VLLM, check_python, llama_options, run_checker  # noqa: F401

from engine.analysis.export import export
from engine.analysis.recommend import DraftMeasurement, Recommendation, recommend

REF = "suffix:16:1.5:0.2:500"


def suffix_rec(ref: str = REF) -> Recommendation:
    m = DraftMeasurement(ref, "suffix", None, 0.5, [0.6, 0.5], 0.0, {9: 1.3})
    rec = recommend([m], "latency", "memory-bound", gammas=range(1, 9))
    assert rec.method == "suffix" and rec.gamma > 0
    return rec


def test_vllm_export_is_method_suffix_and_vllm_accepts_it(check_python: Path, tmp_path: Path) -> None:  # noqa: F811
    rec = suffix_rec()
    text = export(rec, "vllm", target="qwen2.5-coder-1.5b")[1]
    doc = json.loads(text)
    assert doc["speculative_config"] == {
        "method": "suffix", "num_speculative_tokens": rec.gamma, "suffix_decoding_max_tree_depth": 16,
        "suffix_decoding_max_cached_requests": 500, "suffix_decoding_max_spec_factor": 1.5,
        "suffix_decoding_min_token_prob": 0.2,
    }  # fmt: skip
    assert any("arctic-inference" in c for c in doc["comments"])
    path = tmp_path / "vllm.json"
    path.write_text(text)
    result = run_checker(check_python, CHECK_VLLM, path)
    assert result.returncode == 0, result.stdout + result.stderr
    defaults = json.loads(export(suffix_rec("suffix"), "vllm")[1])["speculative_config"]
    assert defaults["suffix_decoding_max_tree_depth"] == 24 and defaults["suffix_decoding_max_cached_requests"] == 10000


def test_sglang_export_is_ngram_with_what_is_lost(check_python: Path, tmp_path: Path) -> None:  # noqa: F811
    text = export(suffix_rec(), "sglang")[1]
    args = shlex.split(text, comments=True)
    assert args[args.index("--speculative-algorithm") + 1] == "NGRAM"
    assert "no suffix decoding" in text and "global tree of earlier responses" in text
    path = tmp_path / "sglang-flags.txt"
    path.write_text(text)
    result = run_checker(check_python, CHECK_SGLANG, "--flags-file", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_llamacpp_export_is_ngram_simple_with_what_is_lost(llama_options) -> None:  # noqa: F811
    text = export(suffix_rec(), "llamacpp")[1]
    args = shlex.split(text, comments=True)
    assert llama_options.problems(args) == []
    assert args[args.index("--spec-type") + 1] == "ngram-simple"
    assert "llama.cpp has no suffix decoding" in text


def test_transformers_export_is_prompt_lookup_with_what_is_lost() -> None:
    rec = suffix_rec()
    doc = json.loads(export(rec, "transformers")[1])
    assert doc["speculation"] == "prompt_lookup" and "no suffix decoding" in doc["lost"]
    assert doc["generate_kwargs"]["prompt_lookup_num_tokens"] == rec.gamma
    assert doc["generate_kwargs"]["max_matching_ngram_size"] == 15  # suffix matches up to depth − 1 tokens


def test_vllm_checker_holds_suffix_to_vllms_own_bounds(check_python: Path, tmp_path: Path) -> None:  # noqa: F811
    """The bounds come from vLLM's _validate_suffix_decoding: a probability above 1 or a depth of 0 fails."""
    doc = json.loads(export(suffix_rec(), "vllm")[1])
    for field, bad in (("suffix_decoding_min_token_prob", 2.0), ("suffix_decoding_max_tree_depth", 0)):
        wrong = {**doc, "speculative_config": {**doc["speculative_config"], field: bad}}
        path = tmp_path / "vllm.json"
        path.write_text(json.dumps(wrong))
        result = run_checker(check_python, CHECK_VLLM, path)
        assert result.returncode == 1 and f"{field}={bad}" in result.stdout + result.stderr


def test_the_evidence_says_suffix_needs_no_second_model() -> None:
    rec = suffix_rec()
    assert any("no second model" in n and "no draft load at peak" in n for n in rec.notes)
