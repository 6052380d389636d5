"""The recommender on plain numbers: the chapter's T5 paradox, hand-checked runs, off / n-gram / budget cases."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.analysis.recommend import (  # noqa: E402
    DraftMeasurement,
    accepted_curve_from_runs,
    calibration,
    crossover_from_curve,
    effective_c,
    gamma_curve,
    gamma_schedule,
    recommend,
)
from engine.analysis.theory import (  # noqa: E402
    crossover_gamma,
    expected_tokens_per_call,
    operations_multiplier,
    walltime_improvement,
)

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
    assert row.speedup_estimate == pytest.approx(2.8)
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
    assert row2.expected_tokens_source == "agreement_runs"
    assert row2.expected_tokens == pytest.approx(2.2)
    assert row2.verify_cost == pytest.approx(1.1)
    assert row2.speedup_predicted == pytest.approx(2.2 / (2 * 0.05 + 1.1))
    assert row2.speedup_one_alpha == pytest.approx(walltime_improvement(0.6, 2, 0.05))
    assert row2.expected_tokens_one_alpha == pytest.approx(expected_tokens_per_call(0.6, 2))
    assert row2.ops_multiplier == pytest.approx(3 / 2.2)
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
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.9, [0.9], 0.0)
    off = recommend([m], "cost", "compute-bound")
    assert off.off and "compute-bound" in off.explanation
    # memory-bound: cheapest per token is the fastest
    cheap = recommend([m], "cost", "memory-bound", gammas=range(1, 9))
    fast = recommend([m], "latency", "memory-bound", gammas=range(1, 9))
    assert cheap.gamma == fast.gamma == 8
    assert cheap.cost_change == pytest.approx(1 / cheap.predicted_speedup - 1)


def test_money_per_million_tokens() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.75, [0.75], 0.0)
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


def test_gamma_schedule_shrinks_with_batch() -> None:
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.02, {2: 1.0, 9: 1.2})
    schedule = gamma_schedule(m, knee_batch=16)
    assert list(schedule) == [1, 2, 4, 8, 16, 32, 64]
    values = list(schedule.values())
    assert values == sorted(values, reverse=True)  # non-increasing in batch
    assert schedule[1] > 0
    assert schedule[16] == schedule[32] == schedule[64] == 0  # at/past the knee: off
    rows = gamma_curve(m)
    cross = crossover_from_curve(rows)
    assert cross is not None and schedule[8] <= cross - 1  # approaching the knee: below the crossover
    assert set(gamma_schedule(m, knee_batch=None).values()) == {schedule[1]}
    assert set(gamma_schedule(DraftMeasurement("w", "draft_model", None, 0.05, [0.05], 0.2)).values()) == {0}


def test_gamma_schedule_caps_below_crossover_near_the_knee() -> None:
    # α 0.6, c 0, free verification: the crossover is γ=5 (chapter table), so near the knee γ ≤ 4
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [0.6], 0.0)
    assert gamma_schedule(m, batch_sizes=(1, 4, 8, 12, 16, 64), knee_batch=16) == {
        1: 9,
        4: 9,
        8: 4,
        12: 4,
        16: 0,
        64: 0,
    }


def test_smallest_gamma_within_tolerance() -> None:
    # with c = 0 the speedup creeps towards 1/(1-α) = 2.5 forever; γ=9 (2.485×) is within 1% of γ=32
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [0.6], 0.0)
    rec = recommend([m], "latency", "memory-bound")
    assert rec.gamma == 9
    assert f"{rec.predicted_speedup:.3f}" == "2.485"


def test_calibration_when_measurement_beats_the_model() -> None:
    # E at γ=4 from a single α of 0.5 is 1.9375; with c = 0.02, v = 1 the model says 1.80×, but 2.5× was measured:
    # no c ≥ 0 explains that, so the expected tokens are scaled (×2.5/1.80) and the profiled c is kept
    m = DraftMeasurement("d", "draft_model", "d-ref", 0.5, [0.5], 0.02, measured_speedup={4: 2.5})
    cal = calibration(m)
    assert cal is not None and cal.source == "acceptance" and cal.c == 0.02
    assert cal.scale == pytest.approx(2.5 / (1.9375 / 1.08))
    row = gamma_curve(m, [4])[0]
    assert row.speedup_estimate == pytest.approx(2.5)
    assert row.speedup_predicted == pytest.approx(1.9375 / 1.08)
    rec = recommend([m], "latency", "memory-bound", gammas=[4])
    assert any("scaled" in n for n in rec.notes)


def test_duplicate_names_are_kept_apart() -> None:
    greedy = DraftMeasurement("d", "draft_model", "d-ref", 0.8, [0.8], 0.05)
    sampled = DraftMeasurement("d", "draft_model", "d-ref", 0.6, [0.6], 0.05, temperature=1.0)
    rec = recommend([sampled, greedy], "latency", "memory-bound")
    assert rec.measurement is greedy and rec.temperature == 0.0
    assert len(rec.comparison) == 2
    with pytest.raises(ValueError):
        recommend([greedy], "latency", "memory-bound", gammas=[])
