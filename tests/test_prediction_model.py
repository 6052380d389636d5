"""One prediction model: every figure bounded (a property over random sessions), and one answer to one question
(the headline γ, the schedule at the serving batch, the policy table's best fixed γ and every export agree)."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.analysis.bounds import check_measured_speedup
from engine.analysis.calibrate import cost_of
from engine.analysis.choice import judge_for
from engine.analysis.curve import gamma_curve
from engine.analysis.export import export, export_policy
from engine.analysis.policy_replay import compare_policies
from engine.analysis.prediction import bound_flags
from engine.analysis.predictor import measured_depth, traces_of
from engine.analysis.recommend import DraftMeasurement, recommend
from engine.analysis.theory import VERIFY_FLOOR, fit_verify_cost


def _runs(rng: random.Random, n: int, alpha: float) -> list[int]:
    """Teacher-forced agreement runs of a draft that matches each token with probability α."""
    matches = [rng.random() < alpha for _ in range(n)]
    runs, following = [0] * n, 0
    for t in range(n - 1, -1, -1):
        following = following + 1 if matches[t] else 0
        runs[t] = following
    return runs


def _trace(rng: random.Random, method: str, n: int, alpha: float) -> dict:
    trace = {"method": method, "runs": _runs(rng, n, alpha), "max_new_tokens": n}
    if method == "ngram":
        trace["proposable"] = [rng.choice((0, 0, 2, 4, 8)) for _ in range(n)]
    else:
        trace["confidence"] = [rng.random() for _ in range(n)]
    return trace


def session(seed: int, method: str = "draft_model", with_trace: bool = True, measured: bool = True) -> DraftMeasurement:
    """A random but physical draft measurement: per-position rates, c, v(k) to k = 5, maybe a recorded pass."""
    rng = random.Random(seed)
    alpha = rng.uniform(0.05, 0.95)
    depth = rng.choice((2, 4))
    rates = [min(max(alpha + rng.uniform(-0.2, 0.1), 0.0), 1.0) for _ in range(depth)]
    verify = {k: 1.0 + rng.uniform(0.0, 0.4) * (k - 1) for k in range(2, depth + 2)}
    if rng.random() < 0.3:  # a CPU whose one-token kernel is the slower one (bf16 with AVX-512 BF16): v(k) < 1
        low = rng.uniform(0.85, 0.99)
        verify = {k: low + rng.uniform(0.0, 0.3) * (k - 2) for k in range(2, depth + 2)}
    c = rng.uniform(0.0, 0.6) if method == "draft_model" else 0.0
    m = DraftMeasurement(
        f"{method}-{seed}", method, None if method == "ngram" else "draft-ref", alpha, rates, c, verify,
        c_hat=rng.uniform(0.0, 0.3) if method == "draft_model" else 0.0,
        drafting_fraction=1.0 if method == "draft_model" else rng.uniform(0.2, 1.0),
    )  # fmt: skip
    if with_trace:
        m.traces = [_trace(rng, method, rng.randint(8, 40), alpha) for _ in range(3)]
    if measured:
        for g in (2, depth):
            m.measured_speedup[g] = rng.uniform(0.5, 3.5)
            m.measured_tokens_per_call[g] = rng.uniform(1.0, g + 1.0)
    return m


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(("draft_model", "ngram")), st.booleans())
def test_every_predicted_figure_respects_its_bound(seed: int, method: str, with_trace: bool) -> None:
    m = session(seed, method, with_trace)
    fit = fit_verify_cost(m.verify_cost)
    assert fit.at(1) == 1.0 and all(VERIFY_FLOOR <= fit.at(k) <= k for k in range(2, 40))
    for row in gamma_curve(m, range(1, 17)):
        p = row.prediction
        assert not bound_flags(p), bound_flags(p)
        assert 1.0 - 1e-9 <= p.tokens_per_call <= row.gamma + 1 + 1e-9
        assert p.verify_floor == fit.floor(row.gamma + 1) <= 1.0
        assert p.predicted_speedup <= p.tokens_per_call / (p.verify_floor + p.draft_share) + 1e-9
        assert p.ops_multiplier >= 1.0 - 1e-9
        assert row.verify_cost <= row.gamma + 1
        if row.measured_speedup is not None and row.measured_flag is None:  # unflagged ⇒ within its bound
            share = m.c * p.draft_calls_per_step
            assert check_measured_speedup(row.measured_speedup, row.gamma, m.measured_tokens_per_call.get(row.gamma),
                                          share, p.verify_floor) is None  # fmt: skip
    if traces_of(m):
        cmp = compare_policies(traces_of(m), cost_of(m), judge=judge_for(m, "latency", None, "memory-bound"))
        for p in cmp.results:
            assert not bound_flags(p), (p.policy, bound_flags(p))


def test_a_stored_impossible_prediction_cannot_happen() -> None:
    # the stored row: 3.02× at γ=4 from 1.83 tokens per call with c = 0 is impossible under the one model
    m = DraftMeasurement("ngram", "ngram", None, 0.3, [0.5, 0.4, 0.3, 0.2], 0.0, {5: 1.05}, drafting_fraction=0.4)
    row = gamma_curve(m, [4])[0]
    assert row.speedup_predicted <= row.expected_tokens
    assert row.prediction.drafted_per_step == pytest.approx(0.4 * 4)  # only drafting calls draft


def test_extrapolation_is_bounded_and_said() -> None:
    # per-position acceptance measured to γ=4 at T>0, v(k) to k=5: nothing past γ = 4 + 2 is recommended
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.9, [0.95, 0.93, 0.92, 0.9], 0.01, {2: 1.0, 3: 1.0, 5: 1.02},
                         temperature=0.8)  # fmt: skip
    assert measured_depth(m) == 4
    rec = recommend([m], "latency", "memory-bound")
    assert 1 <= rec.gamma <= 6
    row = next(p for p in rec.curve if p.gamma == rec.gamma)
    assert row.extrapolated == (rec.gamma > 4)
    assert any(p.extrapolated for p in rec.curve if p.gamma > 4)
    assert fit_verify_cost({2: 1.0, 3: 1.0, 4: 3.5}).at(33) <= 33


OBJECTIVES = (("latency", None), ("cost", None), ("latency_within_budget", 0.05), ("latency_within_budget", 0.5))
REGIMES = (("memory-bound", None), ("compute-bound", None), ("unknown", 16))


@pytest.mark.parametrize("seed", range(6))
def test_one_question_one_answer(seed: int) -> None:
    """Headline γ == schedule at the serving batch == the policy table's best fixed γ == the exported γ; and when
    the headline is off, no fixed γ may be recommended by the policy table either, and every export is off."""
    cands = [session(seed, "draft_model"), session(seed + 1000, "ngram")]
    for (objective, budget), (regime, knee), batch in itertools.product(OBJECTIVES, REGIMES, (1, 4, 16)):
        rec = recommend(cands, objective, regime, budget=budget, batch_size=batch, knee_batch=knee)
        where = f"{objective} {budget} {regime} knee={knee} batch={batch}"
        for m in cands:
            judge = judge_for(m, objective, budget, rec.regime_given, batch, knee)
            cmp = compare_policies(traces_of(m), cost_of(m), m.temperature, judge, max_gamma=32)
            fixed = [r for r in cmp.results if r.kind == "fixed" and r.feasible]
            if rec.off:
                assert not fixed, f"{where}: headline off, but {m.name} {fixed[0].policy} is feasible"
            elif m is rec.measurement:
                assert cmp.best_fixed.policy == f"fixed:{rec.gamma}", where
                assert cmp.best_fixed.predicted_speedup == pytest.approx(rec.predicted_speedup), where
        if rec.off:
            doc = json.loads(export(rec, "vllm")[1])
            assert doc.get("speculative_config") in (None, {}), where
            continue
        assert rec.schedule is not None and rec.schedule[batch] == rec.gamma, where
        assert _vllm_gamma(json.loads(export(rec, "vllm")[1]), batch) == rec.gamma, where
        judge = judge_for(rec.measurement, objective, budget, rec.regime_given, batch, knee)
        best = compare_policies(traces_of(rec.measurement), cost_of(rec.measurement), 0.0, judge)
        if best.best.kind == "fixed" and best.pays:
            policy_doc = json.loads(export_policy(rec, best.best.policy, "vllm").text)
            assert policy_doc["speculative_config"]["num_speculative_tokens"] == rec.gamma, where


def _vllm_gamma(doc: dict, batch: int) -> int:
    """The γ vLLM runs at this batch from an exported file: its per-batch range when it has one."""
    spec = doc["speculative_config"]
    for lo, hi, k in spec.get("num_speculative_tokens_per_batch_size") or []:
        if lo <= batch <= hi:
            return int(k)
    return int(spec["num_speculative_tokens"])


def test_crossover_and_theory_default_c_hat_to_c_and_say_so() -> None:
    import subprocess
    import sys

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    default = run("crossover", "--alpha", "0.8", "--c", "0.11")
    assert "taken as c = 0.11" in default and "crossover at gamma=9" in default  # ĉ = c on both sides
    assert "crossover at gamma=10" in run("crossover", "--alpha", "0.8", "--c", "0.11", "--c-hat", "0")
    assert "c_hat=0.11" in run("theory", "--alpha", "0.8", "--gamma", "4", "--c", "0.11")


def test_the_replay_reads_a_suffix_trace_s_exceptions_at_the_gamma_they_were_recorded_for() -> None:
    from engine.analysis.policy_replay import replay
    from engine.core.policy import FixedGamma

    # at the cap the draft at t=0 proposes 4 tokens of which 4 match; asked for 2 it proposes a different pair,
    # of which none matches (suffix decoding's γ is its max_spec_tokens): the replay at γ=2 must see that
    trace = {"method": "suffix", "runs": [4, 3, 2, 1, 0, 0], "proposable": [4, 4, 4, 4, 0, 0], "max_new_tokens": 6,
             "gamma_exceptions": {"2": {"0": [0, 2]}}}  # fmt: skip
    at2 = replay([trace], FixedGamma(2))
    at3 = replay([trace], FixedGamma(3))
    # t=0 rejects (1 token), t=1 accepts 2 (+1), t=4 and t=5 cannot draft: 4 calls; read at the cap it would be 3
    assert at2.steps == 4 and at2.tokens_per_call == pytest.approx(6 / 4)
    assert replay([trace | {"gamma_exceptions": {}}], FixedGamma(2)).steps == 3
    assert at3.steps == 3  # no exception at γ=3: t=0 takes 4, t=4 and t=5 one each
