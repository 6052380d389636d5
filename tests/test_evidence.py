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
from engine.service.decide.evidence import gather, recommend_from_store
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
    doc = json.loads(run("--export", "vllm").stdout)
    vllm = doc["speculative_config"] if "speculative_config" in doc else doc
    assert vllm["method"] == "draft_model" and vllm["model"] == "t5-small" and vllm["num_speculative_tokens"] >= 1
    flags = shlex.split(run("--export", "sglang").stdout, comments=True)
    assert "--speculative-draft-model-path" in flags and "t5-small" in flags
    tf = json.loads(run("--export", "transformers").stdout)
    assert tf["generate_kwargs"]["assistant_model"] == "t5-small"
    gamma_from = tf.get("assistant_generation_config") or tf["generate_kwargs"]  # where transformers reads γ
    assert gamma_from["num_assistant_tokens"] == vllm["num_speculative_tokens"]
    llama = shlex.split(run("--export", "llamacpp").stdout, comments=True)
    assert "--draft-max" in llama or "--spec-draft-n-max" in llama  # the flag's name depends on the llama.cpp build
    own = json.loads(run("--export", "spectune").stdout)
    assert own["evidence"]["measurement"]["alpha"] == pytest.approx(0.75)
    assert own["evidence"]["measurement"]["session_ids"] == [sid]
    # no regime evidence stored: the record says "unknown" and the decision says it assumed memory-bound
    assert own["evidence"]["regime"]["label"] == "unknown"
    assert own["recommendation"]["regime"] == "memory-bound"
    assert any(n.startswith("Regime unknown") for n in own["recommendation"]["notes"])
    assert "# note: Regime unknown" in run("--export", "sglang").stdout
    out = tmp_path / "cfg.json"
    assert run("--export", "vllm", "--out", str(out)).returncode == 0
    assert json.loads(out.read_text()) == doc
    saved = store.list_recommendations()
    assert len(saved) >= 5
    # the CLI stores the same full payload as the page (inputs, decision, notes, spectune's record)
    payload = saved[0]["payload"]
    assert payload["inputs"]["session_ids"] == [sid] and payload["inputs"]["objective"] == "latency"
    assert payload["record"]["format"] == "spectune.recommendation/1"
    assert payload["gamma"] == vllm["num_speculative_tokens"]
    bad = run("--objective", "cost", "--batch-size", "0")
    assert bad.returncode == 2 and "batch size" in bad.stderr and "Traceback" not in bad.stderr


def test_draft_arithmetic_from_parameter_counts_is_charged_when_compute_bound(store):
    # the bundled pair: ĉ = 494M / 1544M ≈ 0.32, so a γ that looked like +23% at ĉ = 0 is really about +49%
    regime = {"label": "compute-bound", "evidence": ["linear from batch 1"], "votes": {}}
    sid = store_session(store, {"qwen2.5-coder-0.5b": (0.8, 0.05, None)}, gamma=2, regime=regime,
                        target="qwen2.5-coder-1.5b")  # fmt: skip
    rec, ev, _ = recommend_from_store(store, [sid], "latency_within_budget", budget=0.3)
    m = ev.measurements[0]
    assert m.c_hat == pytest.approx(494_032_768 / 1_543_714_304) and "parameter counts" in m.c_hat_source
    assert rec.regime == "compute-bound" and rec.cost_change <= 0.3
    at_2 = next(p for p in rec.curve if p.gamma == 2)
    assert at_2.ops_multiplier == pytest.approx((2 * m.c_hat + 3) / at_2.expected_tokens)
    assert f"{at_2.ops_multiplier - 1:+.0%}" == "+49%" and rec.gamma == 1  # γ=2 no longer fits the budget
    assert any("parameter counts" in n for n in rec.notes)
    # a draft that is not bundled: ĉ from the measured time ratio c
    other = store_session(store, {"some/draft": (0.8, 0.05, None)}, gamma=2, name="other")
    _, ev, _ = recommend_from_store(store, [other], "latency")
    assert ev.measurements[0].c_hat == pytest.approx(0.05) and "measured" in ev.measurements[0].c_hat_source


def test_missing_verify_cost_and_unknown_regime_are_visible(store):
    sid = store_session(store, {"t5-small": T5["t5-small"]})  # the sweep stored no v(k)
    rec, ev, report = recommend_from_store(store, [sid], "latency")
    assert ev.measurements[0].verify_cost == {} and ev.verify_cost == {}
    assert any(n.startswith("No v(k) measured") for n in rec.notes)
    assert report.label == "unknown" and rec.regime == "memory-bound"
    assert any(n.startswith("Regime unknown") for n in rec.notes)
    doc = json.loads(export(rec, "spectune")[1])
    assert doc["evidence"]["measurement"]["verify_cost"] == {}
    assert any("No v(k) measured" in n for n in doc["recommendation"]["notes"])


def test_stored_regime_agreement_is_computed_from_the_votes(store):
    regime = {"label": "compute-bound", "evidence": ["old worker"], "serving_batch": 1,
              "votes": {"batch sweep": "compute-bound", "roofline": "memory-bound"}}  # fmt: skip
    sid = store_session(store, {"weak": (0.5, 0.1, None)}, gamma=3, regime=regime)
    _, _, report = recommend_from_store(store, [sid], "cost")
    assert report.label == "compute-bound" and report.agree is False
    doc = json.loads(export(recommend_from_store(store, [sid], "cost")[0], "spectune", regime=report)[1])
    assert doc["evidence"]["regime"]["agree"] is False


def test_impossible_measured_speedup_from_the_store_is_flagged_not_calibrated(store):
    # a loaded machine: 3.07× measured at γ=4 from a run that delivered 1.35 tokens per target call
    sid = store_session(store, {"ngram": (0.35, 0.0, 3.07)}, gamma=4, tokens_per_call={"ngram": 1.35})
    rec, ev, _ = recommend_from_store(store, [sid], "latency")
    m = ev.measurements[0]
    assert m.measured_tokens_per_call == {4: 1.35} and m.measured_speedup == {4: 3.07}
    assert rec.predicted_speedup <= rec.gamma + 1 and all(p.speedup_predicted <= p.gamma + 1 for p in rec.curve)
    assert any("measurement error" in n and "load changed between runs" in n for n in rec.notes)
    assert not any("scaled" in n for n in rec.notes)


def _mixed_temperature_session(store) -> int:
    """One finished n-gram session at T=0 (fast) and T=0.8 (no faster than the target)."""
    set_id, _, _ = store.add_prompt_set("mixed", "mixed.txt", [{"text": "a"}, {"text": "b"}])
    sid = store.create_session(name="mixed", target="t5-xxl", drafts=["ngram"], gammas=[3], temperatures=[0.0, 0.8],
                               max_new_tokens=32, prompt_set_id=set_id, n_prompts=2)  # fmt: skip
    store.claim_next_session("test:1")
    for temp, alpha in ((0.0, 0.6), (0.8, 0.05)):
        base = store.create_run(sid, "none", 0, temp, "baseline")
        store.finish_run(base, {}, tokens_per_s=10.0, speedup_measured=1.0)
        run = store.create_run(sid, "ngram", 3, temp, "speculative")
        result = {"alpha": alpha, "c": 0.0, "per_position_acceptance": [alpha] * 3, "verify_cost": {},
                  "tokens_per_s": 10.0, "speedup_measured": None}  # fmt: skip
        store.finish_run(run, result, **result)
    store.finish_session(sid, "done", summary={"verify_cost": {}})
    return sid


def test_mixed_temperatures_ask_for_the_deployment_temperature(store, tmp_path):
    sid = _mixed_temperature_session(store)
    with pytest.raises(SpectuneError, match="measured temperatures 0, 0.8: choose the temperature you deploy at"):
        recommend_from_store(store, [sid], "latency")
    greedy, ev0, _ = recommend_from_store(store, [sid], "latency", temperature=0.0)
    sampled, ev8, _ = recommend_from_store(store, [sid], "latency", temperature=0.8)
    assert {m.temperature for m in ev0.measurements} == {0.0} and {m.temperature for m in ev8.measurements} == {0.8}
    assert not greedy.off and greedy.temperature == 0.0
    assert sampled.off or sampled.predicted_speedup < greedy.predicted_speedup  # T=0.8 is never answered with T=0
    with pytest.raises(SpectuneError, match="temperature 0.5 was not measured"):
        recommend_from_store(store, [sid], "latency", temperature=0.5)
    env = dict(os.environ, SPECTUNE_HOME=str(tmp_path))
    cli = [sys.executable, "-m", "engine", "recommend", "--session", str(sid)]
    asked = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert asked.returncode != 0 and "choose the temperature you deploy at" in asked.stderr
    assert "Traceback" not in asked.stderr
    chosen = subprocess.run([*cli, "--temperature", "0"], cwd=ROOT, capture_output=True, text=True, env=env,
                            timeout=120)  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr
    assert "temperature: 0" in chosen.stdout


def test_a_flagged_verify_cost_is_never_predicted_from(store):
    """A v(5) = 5.52 (above its bound 5: a measurement error) once priced γ=4 at 0.51× beside a measured 1.54×:
    it is dropped from the prediction, which extrapolates the points that hold, and the notes say so."""
    set_id, _, _ = store.add_prompt_set("vk", "vk.txt", [{"text": "a"}, {"text": "b"}])
    sid = store.create_session(name="vk", target="t5-xxl", drafts=["ngram"], gammas=[4], temperatures=[0.0],
                               max_new_tokens=32, prompt_set_id=set_id, n_prompts=2)  # fmt: skip
    store.claim_next_session("test:1")
    verify = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 5.52}
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {}, tokens_per_s=10.0, speedup_measured=1.0)
    run = store.create_run(sid, "ngram", 4, 0.0, "speculative")
    result = {"alpha": 0.5, "c": 0.0, "per_position_acceptance": [0.5] * 4, "verify_cost": verify,
              "tokens_per_s": 15.0, "speedup_measured": 1.5}  # fmt: skip
    store.finish_run(run, result, **result)
    store.finish_session(sid, "done", summary={"verify_cost": verify})
    ev = gather(store, [sid])
    assert ev.measurements[0].verify_cost == {2: 1.05, 3: 1.1, 4: 1.15} and 5 not in ev.verify_cost
    assert any("v(5) = 5.52" in note and "not used for any prediction" in note for note in ev.notes), ev.notes
    from engine.analysis.calibrate import cost_of
    from engine.analysis.predictor import predict
    from engine.core.policy import FixedGamma

    four = predict(ev.measurements[0], FixedGamma(4), cost_of(ev.measurements[0]))
    assert four.speedup > 1.2, four  # priced from v(5) ≈ 1.2 (the points that hold), not from 5
