"""`python -m engine` as a contract: the run report's fields, theory/crossover, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"


def engine(*args: str, env_home: Path | None = None) -> subprocess.CompletedProcess:
    env = None
    if env_home is not None:
        import os

        env = dict(os.environ, SPECTUNE_HOME=str(env_home))
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture()
def prompt_files(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("hello world\nthe quick brown fox\n")
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        json.dumps({"prompt": "abc abc abc"}) + "\n" + json.dumps({"turns": ["one two", "x"], "category": "qa"}) + "\n"
    )
    return txt, jsonl


REQUIRED = {
    "target", "draft", "gamma", "temperature", "alpha", "tokens_per_call", "per_position_acceptance", "c",
    "verify_cost", "tokens_per_s", "baseline_tokens_per_s", "speedup_measured", "speedup_predicted", "outputs",
    "divergences",
}  # fmt: skip


def test_run_writes_the_contract(tmp_path, prompt_files):
    txt, jsonl = prompt_files
    out = tmp_path / "out.json"
    for prompts in (txt, jsonl):
        r = engine("run", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--gamma", "3",
                   "--temperature", "0", "--max-new-tokens", "16", "--seed", "1", "--dtype", "float32",
                   "--json", str(out))  # fmt: skip
        assert r.returncode == 0, r.stderr
        report = json.loads(out.read_text())
        assert REQUIRED <= report.keys()
        assert (report["target"], report["draft"], report["gamma"], report["temperature"]) == (TARGET, DRAFT, 3, 0.0)
        assert 0 <= report["alpha"] <= 1
        assert 1 <= report["tokens_per_call"] <= 4
        assert 1 <= len(report["per_position_acceptance"]) <= 3
        assert report["c"] > 0
        assert report["verify_cost"]["1"] == 1.0 and "4" in report["verify_cost"]
        assert report["tokens_per_s"] > 0 and report["baseline_tokens_per_s"] > 0
        spread = report["speedup_measured_spread"]  # per-prompt ratios of neighbouring measurements
        assert spread["n"] + spread["dropped"] == 2 and spread["min"] <= report["speedup_measured"] <= spread["max"]
        # the printed speedup is the run's one figure, the whole run's as every page shows it; the median of the
        # prompts stays beside their band
        said = f"speedup {report['speedup_whole_run']:.3f}× measured over the whole run"
        assert said in r.stdout and f"(median {report['speedup_measured']:.3f}×)" in r.stdout, r.stdout
        assert len(report["outputs"]) == 2
        for o, d in zip(report["outputs"], report["divergences"], strict=True):
            assert {"prompt_id", "text", "token_ids"} <= o.keys() and len(o["token_ids"]) <= 16
            assert d["prompt_id"] == o["prompt_id"]
            assert d["identical"] is True and d["verdict"] == "identical"  # fp32 greedy: exact


def test_run_with_ngram_and_none(tmp_path, prompt_files):
    txt, _ = prompt_files
    out = tmp_path / "o.json"
    r = engine("run", "--target", TARGET, "--draft", "none", "--prompts", str(txt), "--max-new-tokens", "8",
               "--dtype", "float32", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["draft"] == "none" and report["gamma"] == 0 and report["speedup_measured"] == 1.0
    r = engine("run", "--target", TARGET, "--draft", "ngram", "--prompts", str(txt), "--max-new-tokens", "8",
               "--dtype", "float32", "--temperature", "0.8", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["draft"] == "ngram" and report["c"] == 0.0
    assert all(d["verdict"] in ("identical", "not-applicable") for d in report["divergences"])


def test_theory_and_crossover_print_the_seed_numbers():
    r = engine("theory", "--alpha", "0.9", "--gamma", "7")
    assert r.returncode == 0
    assert "5.70x" in r.stdout and "1.40x" in r.stdout and "+40%" in r.stdout
    r = engine("crossover", "--alpha", "0.6")
    assert r.returncode == 0 and "crossover at gamma=5" in r.stdout and "2.31x speed, 2.17x ops" in r.stdout
    r = engine("crossover", "--alpha", "0.9")
    assert "no crossover below gamma=32" in r.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "--prompts", "MISSING", "--json", "o.json"], "no such file"),
        (["run", "--target", TARGET, "--draft", DRAFT, "--prompts", "P", "--gamma", "0", "--json", "o.json"], "γ = 0"),
        (["run", "--target", TARGET, "--prompts", "P", "--gamma", "1000", "--json", "o.json"], "γ = 1000"),
        (["run", "--target", TARGET, "--prompts", "P", "--temperature", "-1", "--json", "o.json"], "negative"),
        (["run", "--target", TARGET, "--prompts", "P", "--max-new-tokens", "0", "--json", "o.json"], "at least 1"),
        (["run", "--target", "no/such-model", "--prompts", "P", "--json", "o.json"], "cannot be fetched offline"),
        (["run", "--target", TARGET, "--draft", "./nowhere/model", "--prompts", "P", "--json", "o.json"], "not found"),
        (["run", "--target", TARGET, "--prompts", "P", "--dtype", "int3", "--json", "o.json"], "int3"),
        (["run", "--target", TARGET, "--prompts", "P", "--gamma", "two", "--json", "o.json"], "invalid int"),
        (["run", "--target", TARGET, "--prompts", "P"], "--json"),
        (["theory", "--alpha", "1.5", "--gamma", "3"], "alpha must be in [0, 1]"),
        (["crossover"], "--alpha"),
        (["bogus"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(tmp_path, prompt_files, args, fragment):
    txt, _ = prompt_files
    args = [str(txt) if a == "P" else str(tmp_path / a) if a in ("o.json", "MISSING") else a for a in args]
    r = engine(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("warning:")]
    assert len(lines) == 1, r.stderr
    assert fragment in lines[0]
    assert "Traceback" not in r.stderr


def test_empty_and_binary_prompt_files_are_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    for f in (empty, binary):
        r = engine("run", "--target", TARGET, "--prompts", str(f), "--json", str(tmp_path / "o.json"))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_truncated_gguf_and_non_model_directory(tmp_path, prompt_files):
    txt, _ = prompt_files
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 10)
    notmodel = tmp_path / "folder"
    notmodel.mkdir()
    unknown = tmp_path / "unknown-arch"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    cases = ((str(bad), "truncated or corrupt"), (str(notmodel), "no config.json"), (str(unknown), "could not load"))
    for ref, fragment in cases:
        r = engine("run", "--target", ref, "--prompts", str(txt), "--json", str(tmp_path / "o.json"))
        assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr


def readme_contract_fields() -> set[str]:
    """The `run --json` fields the contract paragraph of docs/cli.md names (each backticked field name in it)."""
    import re

    readme = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    start = readme.index("`out.json` holds the contract fields")
    paragraph = readme[start : readme.index("Bad arguments", start)]
    return {name for name in re.findall(r"`([^`]+)`", paragraph) if re.fullmatch(r"[a-z_]+", name)} - {"out"}


def test_the_readme_contract_is_what_run_json_writes(tmp_path, prompt_files):
    """A script written against the contract of docs/cli.md reads every field it names from a real `run --json`; the
    renamed keys it keeps as aliases carry the new keys' values."""
    txt, _ = prompt_files
    out = tmp_path / "contract.json"
    r = engine("run", "--target", "tiny:1", "--draft", "ngram", "--prompts", str(txt), "--gamma", "2",
               "--max-new-tokens", "8", "--dtype", "float32", "--loop", "eager", "--threads", "1",
               "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    fields = readme_contract_fields()
    assert {"tokens_per_call", "alpha_from_acceptance_length", "mean_accepted_tokens"} <= fields
    assert sorted(fields - report.keys()) == [], "docs/cli.md promises fields run --json does not write"
    assert report["mean_accepted_tokens"] == report["tokens_per_call"]
    assert report["alpha_from_mean_accepted"] == report["alpha_from_acceptance_length"]
