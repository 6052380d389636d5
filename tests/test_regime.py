"""Regime classification from recorded numbers, plus structure-only checks of the live measurements."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.analysis.regime import (  # noqa: E402
    classify_batch_sweep,
    classify_verify_curve,
    judge_regime,
    regime_at_width,
    regime_report,
    roofline,
)
from engine.measure.microbench import BatchSweep, batch_sweep, measure_copy_bandwidth, measure_matmul_flops  # noqa: E402

# recorded shapes (milliseconds; the unit does not matter)
FLAT_THEN_LINEAR = ([1, 2, 4, 8, 16, 32], [10.0, 10.2, 10.5, 11.0, 20.5, 40.0])
LINEAR_FROM_START = ([1, 2, 4, 8], [1.0, 2.0, 4.0, 8.0])


@pytest.mark.parametrize(
    ("serving", "label"), [(1, "memory-bound"), (8, "memory-bound"), (16, "compute-bound"), (32, "compute-bound")]
)
def test_flat_then_linear_sweep(serving: int, label: str) -> None:
    result = classify_batch_sweep(*FLAT_THEN_LINEAR, serving_batch=serving)
    # 8 → 16: ×1.86 for ×2 rows = 93% of proportional ≥ 80%, confirmed by 16 → 32
    assert result.knee_batch == 16
    assert result.label == label
    assert result.growth_fraction[0] is None
    assert result.growth_fraction[4] == pytest.approx(20.5 / 11.0 / 2)
    assert result.marginal_cost_s[0] == pytest.approx(10.0)
    assert result.marginal_cost_s[1] == pytest.approx(0.2)
    assert result.marginal_cost_s[4] == pytest.approx((20.5 - 11.0) / 8)
    assert result.per_row_s[-1] == pytest.approx(40.0 / 32)
    assert any("knee at batch 16" in e for e in result.evidence)
    assert any(label in e for e in result.evidence)


def test_linear_from_start_is_compute_bound_at_batch_one() -> None:
    result = classify_batch_sweep(*LINEAR_FROM_START, serving_batch=1)
    assert result.knee_batch == 1
    assert result.label == "compute-bound"


def test_flat_sweep_has_no_knee() -> None:
    result = classify_batch_sweep([1, 2, 4, 8], [5.0, 5.1, 5.2, 5.4], serving_batch=64)
    assert result.knee_batch is None
    assert result.label == "memory-bound"
    assert any("beyond the sweep" in e for e in result.evidence)


def test_single_noisy_pair_is_not_a_knee() -> None:
    # 1 → 2 looks linear (85%), but 2 → 4 is flat again: noise, not a knee
    result = classify_batch_sweep([1, 2, 4, 8], [1.0, 1.7, 1.75, 1.8], serving_batch=4)
    assert result.knee_batch is None
    # a linear last pair has nothing to confirm it and counts
    tail = classify_batch_sweep([1, 2, 4, 8], [1.0, 1.02, 1.05, 1.9], serving_batch=8)
    assert tail.knee_batch == 8 and tail.label == "compute-bound"


def test_sweep_input_is_sorted_and_validated() -> None:
    result = classify_batch_sweep([4, 1, 2], [4.0, 1.0, 2.0], serving_batch=2)
    assert result.batch_sizes == [1, 2, 4] and result.step_times_s == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError):
        classify_batch_sweep([1, 2], [1.0], serving_batch=1)
    with pytest.raises(ValueError):
        classify_batch_sweep([1, 1], [1.0, 1.0], serving_batch=1)
    with pytest.raises(ValueError):
        classify_batch_sweep([1, 2], [1.0, 0.0], serving_batch=1)


def test_verify_curve_free_and_billed() -> None:
    free = classify_verify_curve({2: 1.02, 4: 1.05, 8: 1.1})
    assert (free.label, free.regime) == ("free", "memory-bound")
    assert free.v_k == pytest.approx(1.1)
    assert free.billed_fraction == pytest.approx(0.1 / 7)
    billed = classify_verify_curve({2: 2.0, 4: 3.9, 8: 7.8})
    assert (billed.label, billed.regime) == ("billed", "compute-bound")
    partial = classify_verify_curve({8: 4.5})
    assert (partial.label, partial.regime) == ("partial", "mixed")
    # v(8) not measured: extrapolated from (2, 1.1)–(4, 1.3) to 1.7
    extrapolated = classify_verify_curve({2: 1.1, 4: 1.3})
    assert extrapolated.v_k == pytest.approx(1.7)
    assert extrapolated.label == "free"
    assert "interpolated" in extrapolated.evidence[0]
    with pytest.raises(ValueError):
        classify_verify_curve({})


def test_roofline_arithmetic() -> None:
    # 7B bf16 at batch 1: 14 GB of weights + 1 GB KV, 2 FLOP/param/token, 10 ms, H100-ish peaks
    r = roofline(14e9, 1e9, 14e9, 0.010, peak_bw=3.35e12, peak_flops=989e12)
    assert r.bytes_per_step == 15e9
    assert r.achieved_bandwidth == pytest.approx(1.5e12)
    assert r.achieved_flops == pytest.approx(1.4e12)
    assert r.bandwidth_fraction == pytest.approx(1.5e12 / 3.35e12)
    assert r.flops_fraction == pytest.approx(1.4e12 / 989e12)
    assert r.arithmetic_intensity == pytest.approx(14e9 / 15e9)
    assert r.ridge_intensity == pytest.approx(989e12 / 3.35e12)
    assert (r.closer_to, r.label) == ("memory", "memory-bound")
    # batch 512: the same bytes, 512× the FLOPs in 12 ms
    big = roofline(14e9, 1e9, 14e9 * 512, 0.012, peak_bw=3.35e12, peak_flops=989e12)
    assert big.flops_fraction == pytest.approx(14e9 * 512 / 0.012 / 989e12)
    assert big.flops_fraction > big.bandwidth_fraction
    assert (big.closer_to, big.label) == ("compute", "compute-bound")
    with pytest.raises(ValueError):
        roofline(1, 1, 1, 0.0, 1, 1)


def test_regime_report_combines_evidence() -> None:
    sweep_mem = classify_batch_sweep(*FLAT_THEN_LINEAR, serving_batch=4)
    sweep_cmp = classify_batch_sweep(*FLAT_THEN_LINEAR, serving_batch=32)
    free = classify_verify_curve({8: 1.1})
    roof_mem = roofline(14e9, 1e9, 14e9, 0.010, 3.35e12, 989e12)

    agree = regime_report(sweep_mem, free, roof_mem)
    assert agree.label == "memory-bound" and agree.agree
    assert set(agree.votes) == {"batch sweep", "verify curve", "roofline"}
    assert any(e.startswith("verify curve:") for e in agree.evidence)

    # 3 (sweep) vs 2 + 1: a tie goes to the batch sweep, the most direct evidence
    split = regime_report(sweep_cmp, free, roof_mem)
    assert split.label == "compute-bound" and not split.agree
    assert any("disagree" in e for e in split.evidence)
    assert regime_report(verify=classify_verify_curve({8: 7.5})).label == "compute-bound"
    assert regime_report().label == "unknown"
    assert regime_report(verify=classify_verify_curve({8: 4.5})).label == "unknown"  # "mixed" takes no side


def test_micro_benchmarks_return_positive_rates() -> None:
    bw = measure_copy_bandwidth("cpu", nbytes=1 << 20, reps=2)
    flops = measure_matmul_flops("cpu", n=64, reps=2)
    assert math.isfinite(bw) and bw > 0
    assert math.isfinite(flops) and flops > 0


def test_batch_sweep_on_a_tiny_random_model() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core machine, thread contention turns 1 ms steps into 300 ms
    try:
        sweep = batch_sweep(model, input_len=8, batch_sizes=(4, 1, 2), reps=2)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(sweep, BatchSweep)
    assert sweep.batch_sizes == [1, 2, 4]  # sorted, every size measured
    assert len(sweep.step_times_s) == 3
    assert all(math.isfinite(t) and t > 0 for t in sweep.step_times_s)
    assert sweep.device == "cpu" and sweep.input_len == 8 and not sweep.stopped_early
    # interleaved rounds: each batch's median lies within its own spread over the rounds
    spreads = zip(sweep.step_times_s, sweep.spread_s, strict=True)
    assert sweep.reps == 2 and all(lo <= t <= hi for t, (lo, hi) in spreads)
    judged = classify_batch_sweep(sweep.batch_sizes, sweep.step_times_s, serving_batch=1)
    assert judged.label in ("memory-bound", "compute-bound")
    assert judged.knee_batch in (None, 1, 2, 4)


# ---------------------------------------------------------------------------------------------------------------------
# judge_regime: the one judgement at a serving batch, shared by the worker, the CLI and the page


def _record(serving_batch: int = 1, **extra: object) -> dict:
    return {
        "serving_batch": serving_batch,
        "batch_sweep": {"batch_sizes": FLAT_THEN_LINEAR[0], "step_times_s": FLAT_THEN_LINEAR[1]},
        **extra,
    }


def test_judge_regime_compares_the_verify_width_with_the_knee() -> None:
    # knee at 16; batch 4 is below it, but a verify step at γ=3 processes 4 × 4 = 16 token rows
    assert judge_regime(_record(), 4).label == "memory-bound"
    assert judge_regime(_record(), 4, gamma=2).label == "memory-bound"  # 12 rows
    at_knee = judge_regime(_record(), 4, gamma=3)
    assert at_knee.label == "compute-bound" and at_knee.knee_batch == 16 and at_knee.width == 16
    line = "serving batch 4 × 4 tokens per verify step (γ+1) = 16 token rows ≥ knee 16"
    assert any(line in e for e in at_knee.evidence)
    assert "4 × 4 = 16 token rows, at or past the knee at batch 16" in at_knee.source
    assert regime_at_width(15, 16) == "memory-bound" and regime_at_width(16, 16) == "compute-bound"
    assert regime_at_width(10_000, None) == "memory-bound"  # no knee seen


def test_judge_regime_override_unknown_and_stored_verdicts() -> None:
    forced = judge_regime(_record(), 1, override="compute-bound")
    assert forced.label == "compute-bound" and forced.override == "compute-bound"
    assert forced.evidence[0].startswith("regime set by hand to compute-bound") and "Set by hand" in forced.source
    nothing = judge_regime(None, 8)
    assert nothing.label == "unknown" and "unknown" in nothing.source  # never silently memory-bound
    assert any("no v(k) measured" in e for e in nothing.evidence)
    # nothing raw to re-judge: the stored verdict stands, and agree is computed from its votes (not assumed)
    stored = {"label": "compute-bound", "evidence": ["from an older worker"], "serving_batch": 8,
              "votes": {"batch sweep": "compute-bound", "roofline": "memory-bound"}}  # fmt: skip
    judged = judge_regime(stored, 8)
    assert judged.label == "compute-bound" and judged.agree is False
    assert any("stored with the session (serving batch 8): from an older worker" == e for e in judged.evidence)
    assert judge_regime({"label": "compute-bound", "evidence": [], "votes": {}}, 1).label == "compute-bound"
    # only the stored knee (no raw timings): still judged at this batch's width
    assert judge_regime({"batch_classification": {"knee_batch": 16}}, 8, gamma=1).label == "compute-bound"


def test_the_source_sentence_names_what_decided_the_label() -> None:
    # seen on the Recommend page: a label judged from a measured v(k) alone under a caption saying "unknown"
    billed = {1: 1.0, 2: 1.9, 4: 3.7, 8: 7.5}
    judged = judge_regime(None, 1, gamma=4, verify_cost=billed)
    assert judged.label == "compute-bound"
    assert judged.source == "From the verify curve measured in the chosen sessions." and "unknown" not in judged.source
    flagged = {"serving_batch": 1, "roofline": asdict(roofline(14e9, 1e9, 14e9, 0.010, peak_bw=3.35e12,
                                                               peak_flops=1.4e12 / 5.15))}  # fmt: skip
    undecided = judge_regime(flagged, 1)
    assert undecided.label == "unknown" and "does not decide" in undecided.source and "assumed" in undecided.source


def test_a_verify_cost_above_k_is_a_measurement_error_not_evidence() -> None:
    # seen in a llama.cpp session on a busy machine: v(5) = 5.69 from llama-bench, judged "billed → compute-bound"
    spiked = {1: 1.0, 2: 1.2, 4: 1.5, 5: 5.69}
    curve = classify_verify_curve(spiked, k=5)
    assert curve.label == "measurement error" and "v(5) = 5.69 is outside 0.8…5" in curve.evidence[0]
    judged = judge_regime(None, 1, verify_cost=spiked)
    assert judged.votes == {"verify curve": "measurement error"} and judged.label == "unknown"
    assert classify_verify_curve({1: 1.0, 5: 5.4}, k=5).label == "billed"  # within 10%: a slow batched kernel


def test_v_k_from_interleaved_rounds_is_not_moved_by_a_load_spike_on_one_side() -> None:
    from engine.measure.verify_cost import from_rounds, verify_ks

    # round 2: the machine got busy while the 1-token batch ran (3.2 s instead of 0.1 s)
    measured = from_rounds({1: [0.10, 3.20, 0.11], 5: [0.50, 0.55, 0.52]})
    assert measured.curve == {1: 1.0, 5: pytest.approx(5.0)} and measured.rounds == 3
    assert measured.spread[5] == (pytest.approx(1.0), pytest.approx(5.0))
    assert verify_ks(5) == [1, 2, 3, 4, 5] and verify_ks(1) == [1]  # every k a γ up to 8 verifies
    assert verify_ks(33) == [*range(1, 10), 16, 32, 33]


def test_a_k_token_forward_cheaper_than_one_token_is_kept_only_when_every_round_says_so() -> None:
    from engine.measure.verify_cost import from_rounds

    # bf16 on a CPU with AVX-512 BF16 (measured: 134.5 ms one-token, 126–128 ms for 2–5 tokens, every round)
    measured = from_rounds({1: [0.1345, 0.1350, 0.1360], 2: [0.1280, 0.1270, 0.1290], 5: [0.1261, 0.1300, 0.1370]})
    assert measured.curve[2] == pytest.approx(0.1270 / 0.1345)  # every round below: the one-token kernel is slower
    assert measured.curve[5] == 1.0  # one round above: timer noise, clamped
    assert measured.spread[2][1] < 1.0 <= measured.spread[5][0]


def test_pytorch_v_k_is_timed_in_alternating_rounds() -> None:
    from engine.measure.verify_cost import forward_times, verify_cost_curve
    from engine.models.tiny import load_tiny

    model = load_tiny("tiny:1:48:2:64")
    times = forward_times(model, [1, 2, 3, 4, 5, 6], [1, 2, 4], rounds=3)
    assert sorted(times) == [1, 2, 4] and all(len(t) == 3 and min(t) > 0 for t in times.values())
    curve = verify_cost_curve(model, [1, 2, 3, 4, 5, 6], 3, reps=2)
    # what timing cannot change: the widths, v(1) = 1, positive ratios (a v(k) below 1 is kept where every round
    # timed the wider forward faster, which a loaded machine can do to a model this small)
    assert sorted(curve) == [1, 2, 3] and curve[1] == 1.0 and all(0.0 < v < float("inf") for v in curve.values())


def test_impossible_roofline_is_a_measurement_error_not_evidence() -> None:
    # seen on a loaded machine: "515% of peak FLOP/s", "ridge 0.0785 FLOP/B" — the peak was measured under load
    r = roofline(14e9, 1e9, 14e9, 0.010, peak_bw=3.35e12, peak_flops=1.4e12 / 5.15)
    assert r.label == "measurement error" and r.flags and "515% of the measured peak" in r.flags[0]
    assert all(not e.startswith("step moves") for e in r.evidence)  # every line says it is not evidence
    sweep = classify_batch_sweep(*FLAT_THEN_LINEAR, serving_batch=32)
    report = regime_report(sweep, None, r)
    assert report.label == "compute-bound" and report.agree  # the flagged roofline takes no side
    assert report.votes["roofline"] == "measurement error"
    # an old stored record (never checked) is checked when it is judged again
    old = asdict(roofline(14e9, 1e9, 14e9, 0.010, peak_bw=3.35e12, peak_flops=989e12))
    old.update(flops_fraction=5.15, flags=[], label="compute-bound")
    judged = judge_regime({"serving_batch": 1, "roofline": old}, 1)
    assert judged.votes == {"roofline": "measurement error"} and judged.label == "unknown"
    assert judged.flags and any("measurement error" in e for e in judged.evidence)
    # measured at another batch: shown for reference, no vote
    elsewhere = judge_regime({"serving_batch": 64, "roofline": asdict(r)}, 1)
    assert "roofline" not in elsewhere.votes and any("reference only at batch 1" in e for e in elsewhere.evidence)


def test_the_regime_evidence_stores_what_judge_regime_says(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.session.regime_evidence as evidence

    sweep = BatchSweep(batch_sizes=FLAT_THEN_LINEAR[0], step_times_s=FLAT_THEN_LINEAR[1], device="cpu", input_len=32,
                       reps=2, stopped_early=False)  # fmt: skip
    monkeypatch.setattr(evidence, "batch_sweep", lambda *a, **k: sweep)
    monkeypatch.setattr(evidence, "_roofline_for", lambda *a: roofline(14e9, 1e9, 14e9, 0.010, 3.35e12, 989e12))
    monkeypatch.setattr(evidence, "nvml_available", lambda: False)
    pool = SimpleNamespace(get=lambda *a: SimpleNamespace(model=None, device="cpu"))
    settings = SimpleNamespace(target="t", dtype="float32", device="cpu", trust_remote_code=False)
    stored = evidence.detect_regime(pool, {"verify_cost": {"1": 1.0, "8": 7.5}}, settings, 32)  # type: ignore[arg-type]
    again = judge_regime(stored, 32)
    assert stored["label"] == again.label == "compute-bound"
    assert stored["votes"] == again.votes == {"batch sweep": "compute-bound", "verify curve": "compute-bound",
                                              "roofline": "memory-bound"}  # fmt: skip
    assert stored["agree"] is False and stored["evidence"] == again.evidence
    assert stored["batch_classification"]["knee_batch"] == 16


def test_the_regime_evidence_says_what_it_cannot_tell() -> None:
    # the sweep: 16.2, 10.3, 72.4, 14.6 … ms is noise, not a knee; a width past the sweep is extrapolated
    noisy = classify_batch_sweep([1, 2, 4, 8, 16], [0.0162, 0.0103, 0.0724, 0.0146, 0.0150], 8, tokens_per_row=8)
    said = " ".join(noisy.evidence)
    assert "non-monotone, timing noise" in said and "batch 1→2" in said and "batch 4→8" in said
    flat = classify_batch_sweep([1, 2, 4, 8], [0.010, 0.0101, 0.0102, 0.0104], 8, tokens_per_row=8)
    assert flat.knee_batch is None and "64 token rows per step is beyond the sweep" in " ".join(flat.evidence)
    # a step at 0.09% of peak FLOP/s and 0.015% of bandwidth is overhead-bound: the roofline takes no side
    roof = roofline(1e6, 0.0, 1e9, 0.010, peak_bw=1e6 / 0.010 / 0.00015, peak_flops=1e9 / 0.010 / 0.0009)
    assert roof.label == "overhead-bound" and "takes no side" in roof.evidence[-1]
    judged = judge_regime({"serving_batch": 1, "roofline": asdict(roof)}, 1)
    assert judged.label == "unknown" and judged.votes == {"roofline": "overhead-bound"}
    said = "measured but taking no side: roofline (overhead-bound, below 5% of both peaks)"
    assert any(said in e for e in judged.evidence)
