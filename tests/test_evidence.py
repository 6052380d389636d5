"""The recommender on stored sessions with known numbers, through the store and the CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.analysis.export import export
from engine.errors import SpectuneError
from engine.service.evidence import gather, recommend_from_store
from store import open_store
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    return open_store(f"sqlite:///{tmp_path / 'spectune.db'}")


def test_t5_small_beats_t5_large_at_gamma_7(store):
    sid = store_session(store, {"t5-small": T5["t5-small"], "t5-large": T5["t5-large"]})
    rec, ev, _ = recommend_from_store(store, [sid], "latency")
    assert rec.draft_name == "t5-small" and rec.gamma >= 1
    assert "t5-large" in rec.explanation and "t5-small" in rec.explanation.lower()
    assert {m.name for m in ev.measurements} == {"t5-small", "t5-large"}
    rows = {r.name: r for r in rec.comparison}
    assert rows["t5-large"].alpha > rows["t5-small"].alpha  # better α, still loses: c decides


def test_measured_speedups_reproduce_the_papers_order(store):
    sid = store_session(store, T5)
    rec, _, _ = recommend_from_store(store, [sid], "latency")
    assert rec.draft_name == "t5-small"  # the paper's measured 3.4× > 2.8× > 1.7×


def test_compute_bound_cost_objective_turns_speculation_off(store):
    regime = {"label": "compute-bound", "evidence": ["linear from batch 1"], "votes": {}}
    sid = store_session(store, {"weak": (0.5, 0.1, None)}, gamma=3, regime=regime)
    rec, ev, report = recommend_from_store(store, [sid], "cost")
    assert ev.regime_label == "compute-bound" and report is not None
    assert rec.off and rec.gamma == 0
    name, text = export(rec, "vllm")
    assert json.loads(text)["speculative_config"] is None


def test_only_finished_sessions_and_valid_objectives(store):
    set_id, _, _ = store.add_prompt_set("x", "x.txt", [{"text": "a"}])
    sid = store.create_session(target="t", drafts=["d"], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                               prompt_set_id=set_id)  # fmt: skip
    with pytest.raises(SpectuneError, match="not done"):
        gather(store, [sid])
    with pytest.raises(SpectuneError, match="does not exist"):
        gather(store, [999])
    done = store_session(store, {"d": (0.8, 0.1, None)})
    with pytest.raises(SpectuneError, match="objective"):
        recommend_from_store(store, [done], "fastest")
    with pytest.raises(SpectuneError, match="budget"):
        recommend_from_store(store, [done], "latency_within_budget")


def test_cli_recommend_and_every_export_format(store, tmp_path):
    sid = store_session(store, {"t5-small": T5["t5-small"], "ngram": (0.3, 0.0, None)})
    env = dict(os.environ, SPECTUNE_HOME=str(tmp_path))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "engine", "recommend", "--session", str(sid), *args],
                              cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)  # fmt: skip

    r = run()
    assert r.returncode == 0, r.stderr
    assert "recommendation: t5-small" in r.stdout and "γ by batch size" in r.stdout
    vllm = json.loads(run("--export", "vllm").stdout)
    assert vllm["method"] == "draft_model" and vllm["model"] == "t5-small" and vllm["num_speculative_tokens"] >= 1
    flags = shlex.split(run("--export", "sglang").stdout, comments=True)
    assert "--speculative-draft-model-path" in flags and "t5-small" in flags
    tf = json.loads(run("--export", "transformers").stdout)
    assert tf["generate_kwargs"]["assistant_model"] == "t5-small"
    assert tf["generate_kwargs"]["num_assistant_tokens"] == vllm["num_speculative_tokens"]
    llama = shlex.split(run("--export", "llamacpp").stdout, comments=True)
    assert "--draft-max" in llama
    own = json.loads(run("--export", "spectune").stdout)
    assert own["evidence"]["measurement"]["alpha"] == pytest.approx(0.75)
    assert own["evidence"]["measurement"]["session_ids"] == [sid]
    assert own["evidence"]["regime"]["label"] == "memory-bound"
    out = tmp_path / "cfg.json"
    assert run("--export", "vllm", "--out", str(out)).returncode == 0
    assert json.loads(out.read_text()) == vllm
    assert len(store.list_recommendations()) >= 5
    bad = run("--objective", "cost", "--batch-size", "0")
    assert bad.returncode == 2 and "batch size" in bad.stderr and "Traceback" not in bad.stderr
