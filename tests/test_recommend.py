"""The recommender on plain numbers: the chapter's T5 paradox, hand-checked runs, off / n-gram / budget cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.analysis.export import export  # noqa: E402
from engine.analysis.recommend import (  # noqa: E402
    DraftMeasurement,
    accepted_curve_from_runs,
    calibration,
    crossover_from_curve,
    effective_c,
    gamma_curve,
    gamma_schedule,
    measurement_flags,
    recommend,
)
from engine.analysis.theory import (  # noqa: E402
    crossover_gamma,
    expected_tokens_per_call,
    operations_multiplier,
    walltime_improvement,
)


def vllm_config(text: str) -> dict:
    """The speculative config of a vLLM export (bare, or inside the export's "speculative_config")."""
    doc = json.loads(text)
    return doc["speculative_config"] if "speculative_config" in doc else doc


# the chapter's T5 table: (draft, α, c, measured speedup at γ = 7)
T5_ROWS = [("T5-small", 0.75, 0.02, 3.4), ("T5-base", 0.80, 0.04, 2.8), ("T5-large", 0.82, 0.11, 1.7)]


def t5(name: str, with_measured: bool = False) -> DraftMeasurement:
    _, alpha, c, measured = next(r for r in T5_ROWS if r[0] == name)
    return DraftMeasurement(
        name=name,
        method="draft_model",
        model_ref=f"google/{name.lower()}",
        alpha=alpha,
        per_position_acceptance=[alpha] * 7,
        c=c,
        verify_cost={k: 1.0 for k in range(1, 9)},
        measured_speedup={7: measured} if with_measured else {},
        session_ids=[1, 2],
    )


def test_t5_small_beats_t5_large_at_gamma_7() -> None:
    rec = recommend([t5("T5-large"), t5("T5-small")], "latency", "memory-bound", gammas=[7])
    assert rec.draft_name == "T5-small"
    assert rec.method == "draft_model"
    assert rec.model_ref == "google/t5-small"
    assert rec.gamma == 7
    assert f"{rec.predicted_speedup:.2f}" == "3.16"
    assert rec.explanation == (
        "T5-small wins: α 0.75 at c 0.02 gives 3.16× at γ=7; "
        "T5-large has the best α (0.82) but c 0.11 cuts it to 2.50×."
    )
    # comparison table in the chapter's shape, one row per draft
    rows = {s.name: s for s in rec.comparison}
    assert set(rows) == {"T5-small", "T5-large"}
    assert (rows["T5-large"].alpha, rows["T5-large"].c, rows["T5-large"].best_gamma) == (0.82, 0.11, 7)
    assert f"{rows['T5-large'].best_speedup:.2f}" == "2.50"
    assert all(s.pays for s in rec.comparison)
    # memory-bound: cost per token falls by the speedup
    assert rec.cost_change == pytest.approx(1 / rec.predicted_speedup - 1)
    assert rec.measurement is not None and rec.measurement.name == "T5-small"
    assert [p.gamma for p in rec.curve] == [7]


def test_t5_all_three_theory_vs_measured() -> None:
    # theory alone (printed α, c) puts T5-base marginally ahead of T5-small (3.25× vs 3.16×) ...
    theory = recommend([t5(n) for n, *_ in T5_ROWS], "latency", "memory-bound", gammas=[7])
    assert theory.draft_name == "T5-base"
    assert "T5-large has the best α (0.82)" in theory.explanation
    # ... measured speedups calibrate c, and the paper's verdict comes back: T5-small, best balance
    rec = recommend([t5(n, with_measured=True) for n, *_ in T5_ROWS], "latency", "memory-bound")
    assert rec.draft_name == "T5-small"
    assert "T5-small wins" in rec.explanation and "T5-large has the best α (0.82)" in rec.explanation
    assert "calibrated to the measured 3.40× at γ=7" in rec.explanation
    by_speed = sorted(rec.comparison, key=lambda s: s.best_speedup, reverse=True)
    assert [s.name for s in by_speed] == ["T5-small", "T5-base", "T5-large"]
    assert set(rec.crossover) == {"T5-small", "T5-base", "T5-large"}


def test_effective_c_passes_through_the_measurement() -> None:
    m = t5("T5-base", with_measured=True)
    c_eff = effective_c(m)
    assert c_eff is not None and c_eff > m.c  # the measured 2.8× hides overhead beyond c = 0.04
    row = gamma_curve(m, [7])[0]
    assert row.speedup_predicted == pytest.approx(2.8)
    assert row.measured_speedup == 2.8
    assert f"{row.speedup_one_alpha:.2f}" == "3.25"
    assert effective_c(t5("T5-base")) is None


def test_accepted_curve_from_runs_by_hand() -> None:
    runs = [[3, 2, 0, 1, 0, 0], [5, 4, 3, 2, 1]]
    # γ=2. prompt 1 (6 tokens): t=0 run 3 → accept 2, emit 3 → t=3; run 1 → emit 2 → t=5; run 0 → emit 1 → t=6:
    #   3 calls. prompt 2 (5 tokens): t=0 run 5 → accept 2, emit 3 → t=3; run 2 → emit min(3, 2 left) = 2: 2 calls.
    #   11 tokens / 5 calls = 2.2
    assert accepted_curve_from_runs(runs, 2) == pytest.approx(2.2)
    # γ=10. prompt 1: emit 4 (t=4), run 0 → emit 1, run 0 → emit 1: 3 calls; prompt 2: run 5 → emit min(6, 5): 1 call
    #   11 / 4 = 2.75
    assert accepted_curve_from_runs(runs, 10) == pytest.approx(2.75)
    assert accepted_curve_from_runs(runs, 0) == 1.0  # no speculation: one token per call
    assert accepted_curve_from_runs([], 3) == 0.0
    assert accepted_curve_from_runs([[]], 3) == 0.0


def test_gamma_curve_uses_runs_when_greedy() -> None:
    runs = [[3, 2, 0, 1, 0, 0], [5, 4, 3, 2, 1]]
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [0.6], 0.05, {3: 1.1}, agreement_runs=runs)
    rows = gamma_curve(m, [1, 2, 3])
    assert [r.gamma for r in rows] == [1, 2, 3]
    row2 = rows[1]
    assert row2.expected_tokens_source == "exact"  # the runs replayed step by step
    assert row2.expected_tokens == pytest.approx(2.2)
    assert row2.verify_cost == pytest.approx(1.1)
    # step by step, as the loop runs: prompt 1 drafts 2, 2, then 0 (its last token), prompt 2 drafts 2 then 1 (one
    # token left): 7 draft forwards, verifies v(3) 1.1 ×3, v(2) 1.05 (the fit between v(1) and v(3)), v(1) once
    assert row2.speedup_predicted == pytest.approx(11 / (7 * 0.05 + 3 * 1.1 + 1.05 + 1.0))
    assert row2.speedup_one_alpha == pytest.approx(walltime_improvement(0.6, 2, 0.05))
    assert row2.expected_tokens_one_alpha == pytest.approx(expected_tokens_per_call(0.6, 2))
    assert row2.ops_multiplier == pytest.approx((7 + 5) / 11)  # 7 drafted + 5 target positions for 11 tokens
    assert row2.measured_speedup is None
    # sampled decoding: greedy agreement runs would overstate acceptance, so the positional model is used
    m.temperature = 0.8
    row2 = gamma_curve(m, [2])[0]
    assert row2.expected_tokens_source == "positional"
    assert row2.expected_tokens == pytest.approx(1 + 0.6 + 0.36)


def test_crossover_from_curve_matches_theorem() -> None:
    m = DraftMeasurement("d", "draft_model", None, 0.7, [0.7], 0.0)
    assert crossover_from_curve(gamma_curve(m)) == crossover_gamma(0.7) == 10


def test_off_when_alpha_tiny() -> None:
    weak = DraftMeasurement("bigram", "draft_model", "bigram-ref", 0.05, [0.05], 0.1)
    rec = recommend([weak], "latency", "memory-bound")
    assert rec.off and rec.gamma == 0
    assert rec.method == "none" and rec.draft_name is None
    assert rec.predicted_speedup == 1.0 and rec.cost_change == 0.0
    assert rec.explanation.startswith("Speculation off")
    assert "bigram" in rec.explanation
    assert rec.comparison[0].pays is False


def test_ngram_chosen_when_draft_does_not_pay() -> None:
    draft = DraftMeasurement("qwen-0.5b", "draft_model", "qwen/0.5b", 0.3, [0.3], 0.5)
    ngram = DraftMeasurement("ngram", "ngram", None, 0.5, [0.6, 0.5, 0.4], 0.0, {2: 1.02, 9: 1.4})
    baseline = DraftMeasurement("target-only", "none", None, 0.0)
    rec = recommend([draft, ngram, baseline], "latency", "memory-bound")
    assert rec.method == "ngram" and rec.draft_name == "ngram"
    assert rec.gamma >= 1 and rec.predicted_speedup > 1.0
    assert "n-gram" in rec.explanation and "qwen-0.5b" in rec.explanation
    assert [s.name for s in rec.comparison] == ["qwen-0.5b", "ngram"]  # baselines are not candidates


def test_budget_objective_respects_budget() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.0)
    fast = recommend([m], "latency", "compute-bound")
    assert fast.gamma > 1 and fast.cost_change > 0.20
    rec = recommend([m], "latency_within_budget", "compute-bound", budget=0.20)
    assert rec.cost_change <= 0.20
    assert rec.gamma == 1  # γ=1 costs +11%, γ=2 already +23%
    assert f"{rec.cost_change * 100:+.0f}%" == f"{(operations_multiplier(0.8, 1) - 1) * 100:+.0f}%" == "+11%"
    tight = recommend([m], "latency_within_budget", "compute-bound", budget=0.05)
    assert tight.off and "budget" in tight.explanation
    with pytest.raises(ValueError):
        recommend([m], "latency_within_budget", "compute-bound")


def test_cost_objective_by_regime() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.9, [], 0.0)
    off = recommend([m], "cost", "compute-bound")
    assert off.off and "compute-bound" in off.explanation
    # memory-bound: cheapest per token is the fastest
    cheap = recommend([m], "cost", "memory-bound", gammas=range(1, 9))
    fast = recommend([m], "latency", "memory-bound", gammas=range(1, 9))
    assert cheap.gamma == fast.gamma == 8
    assert cheap.cost_change == pytest.approx(1 / cheap.predicted_speedup - 1)


def test_money_per_million_tokens() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.75, [], 0.0)
    rec = recommend([m], "latency", "memory-bound", price_per_hour=3.6, baseline_tokens_per_s=10.0, gammas=[7])
    # $3.60/h at 10 tok/s = 36,000 tok/h → $100 per million tokens; 3.60× faster → $27.78
    assert rec.cost_per_million_baseline == pytest.approx(100.0)
    assert f"{rec.cost_per_million:.2f}" == "27.78"
    batched = recommend([m], "latency", "memory-bound", batch_size=4, price_per_hour=3.6, baseline_tokens_per_s=10.0)
    assert batched.cost_per_million_baseline == pytest.approx(25.0)


def test_invalid_arguments() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.75)
    with pytest.raises(ValueError):
        recommend([m], "throughput", "memory-bound")
    with pytest.raises(ValueError):
        recommend([m], "latency", "io-bound")
    with pytest.raises(ValueError):
        recommend([DraftMeasurement("x", "eagle", None, 0.5)], "latency", "memory-bound")
    empty = recommend([], "latency", "memory-bound")
    assert empty.off and "no draft" in empty.explanation


def test_gamma_schedule_caps_at_the_crossover_past_the_knee() -> None:
    # was: off at and past the knee. Compute-bound means γ below the crossover, not off (the objective is latency)
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.02, {2: 1.0, 9: 1.2})
    schedule = gamma_schedule(m, knee_batch=16)
    assert list(schedule) == [1, 2, 4, 8, 16, 32, 64]
    values = list(schedule.values())
    assert values == sorted(values, reverse=True)  # non-increasing in batch
    cross = crossover_from_curve(gamma_curve(m))
    assert cross is not None
    assert 0 < schedule[16] == schedule[32] == schedule[64] <= cross - 1  # past the knee: capped, not off
    assert set(gamma_schedule(m, knee_batch=None).values()) == {schedule[1]}
    assert set(gamma_schedule(DraftMeasurement("w", "draft_model", None, 0.05, [0.05], 0.2)).values()) == {0}
    # off only where the objective says speculation loses: compute-bound, cost per token never falls
    cost = gamma_schedule(m, knee_batch=16, objective="cost")
    assert cost[1] > 0 and cost[16] == cost[64] == 0


def test_gamma_schedule_caps_below_crossover_near_the_knee() -> None:
    # α 0.6, c 0, free verification: the crossover is γ=5 (chapter table). At batch 1 γ ≤ 14 verifies fewer than 16
    # token rows (memory-bound: the latency optimum, γ=8 within 1%); from batch 4 every γ ≥ 3 verifies ≥ 16 rows
    # (compute-bound: below the crossover, γ ≤ 4), and from batch 8 every γ does — still γ=4, never off
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [], 0.0)
    assert gamma_schedule(m, batch_sizes=(1, 4, 8, 12, 16, 64), knee_batch=16) == {
        1: 8,
        4: 4,
        8: 4,
        12: 4,
        16: 4,
        64: 4,
    }


def test_schedule_follows_the_objective_the_budget_and_the_regime() -> None:
    # issue repro 1: compute-bound, +20% budget → γ=1; the vLLM export must say 1, not the latency-optimal γ
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.02, {2: 1.0, 9: 1.2})
    rec = recommend([m], "latency_within_budget", "compute-bound", budget=0.2)
    assert rec.gamma == 1 and rec.cost_change <= 0.2
    assert set((rec.schedule or {}).values()) == {1}
    vllm = vllm_config(export(rec, "vllm")[1])
    assert vllm["num_speculative_tokens"] == 1 and "num_speculative_tokens_per_batch_size" not in vllm
    # issue repro 2: knee at 16, batch 32, +30% budget → γ=2 at batch 32, and the exported ranges say 2 there
    rec = recommend([m], "latency_within_budget", "memory-bound", budget=0.3, batch_size=32, knee_batch=16)
    assert rec.gamma == 2 and rec.regime == "compute-bound" and rec.cost_change <= 0.3
    assert rec.schedule is not None and rec.schedule[32] == 2 and rec.schedule[1] > 2
    ranges = vllm_config(export(rec, "vllm")[1])["num_speculative_tokens_per_batch_size"]
    assert next(k for lo, hi, k in ranges if lo <= 32 <= hi) == 2
    assert all(k > 0 for _, _, k in ranges)  # compute-bound caps γ, the budget still pays at γ=2: never off


@pytest.mark.parametrize("objective", ["latency", "cost", "latency_within_budget"])
def test_headline_gamma_equals_the_schedule_at_every_batch(objective: str) -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.75, [0.8, 0.75, 0.7], 0.03, {2: 1.01, 4: 1.05, 8: 1.3})
    budget = 0.25 if objective == "latency_within_budget" else None
    schedule = gamma_schedule(m, range(1, 41), knee_batch=16, objective=objective, budget=budget)
    for batch in range(1, 41):
        rec = recommend([m], objective, "memory-bound", budget=budget, batch_size=batch, knee_batch=16)
        assert rec.gamma == schedule[batch], batch
        assert rec.off or rec.schedule[batch] == rec.gamma  # type: ignore[index]


def test_the_verify_width_not_the_batch_is_compared_with_the_knee() -> None:
    # batch 8 is below the knee at 16, but a verify step at γ ≥ 1 processes 8·(γ+1) ≥ 16 token rows: compute-bound
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.0)
    rec = recommend([m], "latency", "memory-bound", batch_size=8, knee_batch=16)
    assert rec.regime == "compute-bound"
    assert rec.cost_change == pytest.approx(rec.ops_multiplier - 1)
    assert any("8 × " in n and "at or past the knee at batch 16" in n for n in rec.notes)
    # batch 2: γ ≤ 6 stays below 16 rows (memory-bound, cost falls), γ ≥ 7 would be billed
    rec = recommend([m], "cost", "memory-bound", batch_size=2, knee_batch=16)
    assert rec.regime == "memory-bound" and 2 * (rec.gamma + 1) < 16 and rec.cost_change < 0


def test_verify_cost_dip_does_not_move_gamma_and_never_extrapolates_down() -> None:
    base = {2: 1.02, 3: 1.04, 4: 1.06, 5: 1.08}

    def rec_for(table: dict[int, float]):
        return recommend([DraftMeasurement("d", "draft_model", "d-ref", 0.8, [], 0.03, table)], "latency",
                         "memory-bound")  # fmt: skip

    ref = rec_for(base)
    dip = rec_for(base | {5: 1.06})  # a 0.02 dip in v(5)
    assert abs(dip.gamma - ref.gamma) <= 1
    assert dip.predicted_speedup == pytest.approx(ref.predicted_speedup, rel=0.05)
    steep = rec_for(base | {5: 0.90})  # was extrapolated downwards: an 12× prediction
    assert steep.predicted_speedup == pytest.approx(ref.predicted_speedup, rel=0.10)
    assert all(p.speedup_predicted <= p.gamma + 1 for p in steep.curve)
    # γ+1 past the largest measured k is said, per point and in the notes
    row = next(p for p in ref.curve if p.gamma == ref.gamma)
    assert ref.gamma + 1 > 5 and row.verify_extrapolated and ref.gamma <= 4 + 2  # within the measured depth + 2
    assert not next(p for p in ref.curve if p.gamma == 3).verify_extrapolated
    assert any("extrapolated beyond the largest measured k = 5" in n for n in ref.notes)


def test_no_verify_cost_measured_and_unknown_regime_are_said() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.02)
    rec = recommend([m], "latency", "unknown")
    assert rec.regime == "memory-bound"  # assumed, and said so
    assert any(n.startswith("Regime unknown") and "assumed memory-bound" in n for n in rec.notes)
    assert any(n.startswith("No v(k) measured") for n in rec.notes)
    sglang = export(rec, "sglang")[1]
    assert "# note: Regime unknown" in sglang and "# note: No v(k) measured" in sglang
    assert "Regime unknown" in json.dumps(json.loads(export(rec, "spectune")[1])["recommendation"]["notes"])


def test_draft_arithmetic_is_charged_when_compute_bound() -> None:
    # the bundled pair: ĉ ≈ 0.32 from parameter counts turns a "+23%" γ=2 into about +49%
    def measurement(c_hat: float) -> DraftMeasurement:
        return DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.0, c_hat=c_hat, c_hat_source="params")

    free = recommend([measurement(0.0)], "latency_within_budget", "compute-bound", budget=0.3, gammas=[2])
    paid = recommend([measurement(0.32)], "latency_within_budget", "compute-bound", budget=0.6, gammas=[2])
    assert f"{free.cost_change:+.0%}" == "+23%" and f"{paid.cost_change:+.0%}" == "+49%"
    assert any("ĉ (draft arithmetic ÷ target arithmetic) = 0.320 (params)" in n for n in paid.notes)


def test_smallest_gamma_within_tolerance() -> None:
    # with c = 0 the speedup creeps towards 1/(1-α) = 2.5 forever; γ=9 (2.485×) is within 1% of γ=32
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [], 0.0)  # the single-α model: no measured depth
    rec = recommend([m], "latency", "memory-bound")
    assert rec.gamma == 9
    assert f"{rec.predicted_speedup:.3f}" == "2.485"


def test_calibration_when_measurement_beats_the_model() -> None:
    # E at γ=4 from a single α of 0.5 is 1.9375; with c = 0.02, v = 1 the model says 1.80×, but 2.5× was measured:
    # no c ≥ 0 explains that, so the measurement is flagged and not calibrated to (expected tokens are never scaled)
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.5, [], 0.02, measured_speedup={4: 2.5})
    cal = calibration(m)
    assert cal is not None and cal.source == "profiled" and cal.c == 0.02
    assert cal.flag is not None and "2.50× at γ=4" in cal.flag and "c = " in cal.flag
    row = gamma_curve(m, [4])[0]
    assert row.speedup_predicted == pytest.approx(1.9375 / 1.08)
    assert row.expected_tokens == pytest.approx(1.9375)  # never scaled past what the acceptance gives
    rec = recommend([m], "latency", "memory-bound", gammas=[4])
    assert any("beat the model even with a free draft" in n for n in rec.notes)
    assert rec.comparison[0].calibration_flag == cal.flag


def test_calibration_runs_forwards() -> None:
    # the case: α 0.8, c 0.05, v(5) 1.05 measured at γ=4. A slower measurement fits a larger c and never
    # predicts a longer γ or a faster best than a quicker one
    def rec_for(measured: float):
        m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [], 0.05, {5: 1.05}, measured_speedup={4: measured})
        return recommend([m], "latency", "memory-bound"), calibration(m)

    (slow, cal_slow), (fast, cal_fast) = rec_for(2.50), rec_for(2.70)
    assert cal_slow.flag is None and cal_fast.flag is None and cal_slow.c > cal_fast.c
    assert slow.gamma <= fast.gamma and slow.predicted_speedup <= fast.predicted_speedup
    for rec in (slow, fast):
        row = next(p for p in rec.curve if p.gamma == 4)
        assert row.expected_tokens <= 5 and row.speedup_predicted <= row.expected_tokens
    assert next(p for p in slow.curve if p.gamma == 4).speedup_predicted == pytest.approx(2.50)


def test_calibration_never_scales_expected_tokens_past_gamma_plus_one() -> None:
    # one measured γ=4 at 2.5× scales E by ×1.39; at γ=1 that would be 2.08 tokens per call (more than γ+1 = 2)
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.5, [0.5], 0.02, measured_speedup={4: 2.5})
    for row in gamma_curve(m, range(1, 9)):
        assert row.speedup_predicted <= (row.gamma + 1) / (row.gamma * 0.02 + row.verify_cost) + 1e-12
        assert row.speedup_predicted <= row.gamma + 1


def test_an_impossible_measured_speedup_is_flagged_and_never_calibrated_to() -> None:
    # seen on a loaded machine: a measured 3.07× from a run that delivered 1.35 tokens per target call
    m = DraftMeasurement(
        "ngram", "ngram", None, 0.35, [0.35], 0.0, measured_speedup={4: 3.07}, measured_tokens_per_call={4: 1.35}
    )
    assert measurement_flags(m)[4].bound == pytest.approx(1.35)
    assert calibration(m) is None  # nothing possible to calibrate to
    rec = recommend([m], "latency", "memory-bound")
    assert all(p.speedup_predicted <= p.gamma + 1 for p in rec.curve)
    assert rec.predicted_speedup <= rec.gamma + 1
    assert not any("scaled" in n for n in rec.notes)
    flagged = [n for n in rec.notes if "measurement error" in n]
    assert flagged and "3.07×" in flagged[0] and "load changed between runs" in flagged[0]
    row = next(p for p in gamma_curve(m) if p.gamma == 4)
    assert row.measured_speedup == 3.07 and row.measured_flag and "impossible" in row.measured_flag
    assert rec.comparison[0].measured_flags == {4: row.measured_flag}
    # without a tokens-per-call figure the bound is γ+1: 3.07× at γ=1 is just as impossible
    assert measurement_flags(DraftMeasurement("n", "ngram", None, 0.35, [0.35], measured_speedup={1: 3.07}))
    # a possible measurement is not flagged; n-gram lookup has no draft forward, so there is no c to fit
    fine = DraftMeasurement("n", "ngram", None, 0.35, [0.35], measured_speedup={4: 1.3},
                            measured_tokens_per_call={4: 1.5})  # fmt: skip
    assert not measurement_flags(fine) and calibration(fine) is None


def test_duplicate_names_are_kept_apart() -> None:
    greedy = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.05)
    sampled = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [0.6], 0.05, temperature=1.0)
    rec = recommend([sampled, greedy], "latency", "memory-bound")
    assert rec.measurement is greedy and rec.temperature == 0.0
    assert len(rec.comparison) == 2
    with pytest.raises(ValueError):
        recommend([greedy], "latency", "memory-bound", gammas=[])


def test_a_proposer_that_drafts_only_on_some_calls_is_predicted_from_those_calls() -> None:
    # llama.cpp's n-gram lookup drafted on 6 of 57 target calls; its per-position acceptance ([1/3, 0]) counts
    # only those 6, so without the drafting fraction the model predicted 1.33 tokens per call against 1.02 measured
    ngram = DraftMeasurement(name="ngram", method="ngram", model_ref=None, alpha=0.02,
                             per_position_acceptance=[1 / 3, 0.0], drafting_fraction=6 / 57,
                             verify_cost={1: 1.0, 5: 1.0})  # fmt: skip
    point = next(p for p in gamma_curve(ngram, [4]) if p.gamma == 4)
    assert point.expected_tokens == pytest.approx(1 + 6 / 57 / 3)  # ≈ 1.035, the run measured 1.018
    always = DraftMeasurement(name="ngram", method="ngram", model_ref=None, alpha=0.02,
                              per_position_acceptance=[1 / 3, 0.0], verify_cost={1: 1.0, 5: 1.0})  # fmt: skip
    assert next(p for p in gamma_curve(always, [4])).expected_tokens == pytest.approx(4 / 3)
    # a call without a draft verifies one token: it costs v(1) = 1, not v(γ+1)
    billed = DraftMeasurement(name="ngram", method="ngram", model_ref=None, alpha=0.02,
                              per_position_acceptance=[1 / 3, 0.0], drafting_fraction=6 / 57,
                              verify_cost={1: 1.0, 5: 3.0})  # fmt: skip
    point = next(p for p in gamma_curve(billed, [4]))
    f = 6 / 57
    assert point.speedup_predicted == pytest.approx((1 + f / 3) / (f * 3.0 + 1 - f))  # ≈ 0.85, not 1.035/3
