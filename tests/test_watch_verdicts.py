"""Watch windows and verdicts from numbers: counter deltas, resets, the predicted gain and each verdict."""

from __future__ import annotations

import pytest

from engine.analysis.recommend_types import DraftMeasurement
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND
from engine.serving.load import Load, parse_load
from engine.serving.metrics import ServerCounters, parse_metrics
from engine.watch.verdict import (
    BELOW,
    COLLAPSED,
    COSTING,
    DRIFTED,
    PAYING,
    Deployment,
    judge,
    observed_alpha,
    observed_batch,
    predicted_speedup,
)
from engine.watch.window import IDLE, OK, RESET, Reading, Window, tpot_between, window_between, window_of

NGRAM = DraftMeasurement(name="ngram:1-3", method="ngram", model_ref=None, alpha=0.6,
                         per_position_acceptance=[0.6, 0.5, 0.4], verify_cost={2: 1.1, 3: 1.2, 5: 1.4})  # fmt: skip
PAGE = """# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total {drafts}
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total {tokens}
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total {accepted}
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {p0}
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {p1}
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {emitted}
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {running}
"""


def reading(
    at: float, drafts: int, tokens: int, accepted: int, p0: int, p1: int, emitted: int, running: int
) -> Reading:
    text = PAGE.format(drafts=drafts, tokens=tokens, accepted=accepted, p0=p0, p1=p1, emitted=emitted, running=running)
    return Reading(at, parse_metrics(text), parse_load(text))


def test_a_window_is_the_counter_deltas_with_vllm_figures() -> None:
    before = reading(100.0, 10, 20, 12, 8, 4, 40, 1)
    after = reading(115.0, 30, 60, 42, 26, 16, 120, 3)
    w = window_between(before, after)
    assert w.state == OK and w.seconds == 15.0
    assert (w.num_drafts, w.num_draft_tokens, w.num_accepted_tokens) == (20, 40, 30)
    assert w.mean_acceptance_length == pytest.approx(1 + 30 / 20)
    assert w.draft_acceptance_rate == pytest.approx(30 / 40)
    assert w.per_position_acceptance == pytest.approx([18 / 20, 12 / 18])
    assert w.emitted_tokens == 80 and w.requests_running == 2.0  # the mean of the gauges read
    assert w.drafting_fraction == pytest.approx(20 / (80 - 30))  # target calls = emitted − accepted
    assert w.figures()["num_accepted_tokens_per_pos"] == {"0": 18.0, "1": 12.0}


def test_counters_that_went_down_make_a_reset_window_not_a_negative_one() -> None:
    before = reading(100.0, 30, 60, 42, 26, 16, 120, 1)
    after = reading(115.0, 3, 6, 4, 3, 1, 12, 1)  # the server restarted and counted a little since
    w = window_between(before, after)
    assert w.state == RESET and "num_drafts" in w.message
    assert w.mean_acceptance_length is None and w.num_drafts is None


def test_a_window_without_drafts_is_idle() -> None:
    w = window_of(0.0, 15.0, ServerCounters(drafts=0.0, draft_tokens=0.0, accepted_tokens=0.0), emitted=0.0)
    assert w.state == IDLE


def live(mal: float, drafts: float = 100.0, running: float = 1.0, rates: list[float] | None = None) -> Window:
    return Window(0.0, 15.0, num_drafts=drafts, num_draft_tokens=drafts * 4, num_accepted_tokens=(mal - 1) * drafts,
                  mean_acceptance_length=mal, per_position_acceptance=rates, requests_running=running,
                  drafting_fraction=1.0)  # fmt: skip


def test_the_predicted_gain_is_the_one_predictors() -> None:
    # ngram (c = 0), γ 4, α 0.9 flat: E = 1 + .9 + .81 + .729 + .6561 = 4.0951 tokens per v(5) = 1.4 → 2.925×
    assert predicted_speedup(NGRAM, 4, [0.9], 1.0, MEMORY_BOUND) == pytest.approx(4.0951 / 1.4, rel=1e-3)
    # compute-bound the gain is 1 ÷ the operations multiplier: 5 tokens processed per 4.0951 kept
    assert predicted_speedup(NGRAM, 4, [0.9], 1.0, COMPUTE_BOUND) == pytest.approx(4.0951 / 5, rel=1e-3)
    assert predicted_speedup(NGRAM, 4, [0.0], 1.0, MEMORY_BOUND) == pytest.approx(1 / 1.4, rel=1e-3)


def test_observed_alpha_and_batch() -> None:
    assert observed_alpha(live(4.0951), 4) == pytest.approx(0.9, abs=1e-6)
    assert observed_alpha(live(9.0), 4) == pytest.approx(1.0)  # clamped to γ + 1
    assert observed_batch(live(2.0, running=6.4)) == 6 and observed_batch(live(2.0, running=0.0)) == 1


def deployment(band: tuple[float, float] = (0.5, 0.95), knee: int | None = None) -> Deployment:
    at = (lambda b, g: MEMORY_BOUND) if knee is None else (lambda b, g: COMPUTE_BOUND if b >= knee else MEMORY_BOUND)
    return Deployment(NGRAM, 4, band, at, costing_windows=3)


def test_paying_then_costing_after_three_windows_at_high_load() -> None:
    dep = deployment(knee=8)
    v = judge(live(4.0951, rates=[0.9]), dep)
    assert v.verdict == PAYING and v.predicted_speedup == pytest.approx(2.925, rel=1e-3) and v.batch == 1
    loaded = live(4.0951, running=8.0, rates=[0.9])  # past the knee: compute-bound, 0.82×
    first = judge(loaded, dep, [v.predicted_speedup])
    second = judge(loaded, dep, [v.predicted_speedup, first.predicted_speedup])
    third = judge(loaded, dep, [v.predicted_speedup, first.predicted_speedup, second.predicted_speedup])
    assert (first.verdict, second.verdict, third.verdict) == (BELOW, BELOW, COSTING)
    assert third.predicted_speedup == pytest.approx(0.819, rel=1e-3) and third.regime == COMPUTE_BOUND
    assert "off" in third.action and "2 of 3" in second.why


def test_acceptance_collapsed_while_drafting() -> None:
    v = judge(live(1.03), deployment())
    assert v.verdict == COLLAPSED and "off" in v.action
    assert judge(live(1.03, drafts=0.0), deployment()).verdict != COLLAPSED  # no drafts proposed: not collapsed


def test_traffic_drifted_outside_the_measured_band() -> None:
    low = judge(live(2.0), deployment(band=(0.7, 0.9)))  # α ≈ 0.5 from a mean of 2.0 at γ 4
    assert low.verdict == DRIFTED and "outside" in low.why
    assert judge(live(2.0), deployment(band=(0.45, 0.9))).verdict in (PAYING, BELOW)


def test_a_failed_window_keeps_its_state() -> None:
    down = Window(0.0, 15.0, "source down", "refused")
    assert judge(down, deployment()).verdict == "source down"


def test_load_gauges_are_summed_over_label_sets() -> None:
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3\n'
            'vllm:num_requests_running{engine="1"} 2\n# TYPE vllm:generation_tokens counter\n'
            'vllm:generation_tokens_total 500\n')  # fmt: skip
    assert parse_load(text) == Load(running=5.0, waiting=None, emitted=500.0)


def test_time_per_output_token_is_each_engines_seconds_over_its_count_across_a_window() -> None:
    def vllm(seconds: float, requests: int) -> Load:
        return parse_load("# TYPE vllm:request_time_per_output_token_seconds histogram\n"
                          f'vllm:request_time_per_output_token_seconds_bucket{{le="+Inf"}} {requests}\n'
                          f"vllm:request_time_per_output_token_seconds_sum {seconds}\n"
                          f"vllm:request_time_per_output_token_seconds_count {requests}\n")  # fmt: skip

    def llama(seconds: float, tokens: int) -> Load:
        return parse_load("# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
                          f"llamacpp:tokens_predicted_seconds_total {seconds}\n"
                          "# TYPE llamacpp:tokens_predicted_total counter\n"
                          f"llamacpp:tokens_predicted_total {tokens}\n")  # fmt: skip

    assert vllm(0.5, 20) == Load(tpot_seconds=0.5, tpot_count=20.0)
    assert tpot_between(vllm(0.5, 20), vllm(0.9, 30)) == pytest.approx(0.04)  # 10 requests at 40 ms a token
    assert tpot_between(llama(2.0, 100), llama(5.0, 200)) == pytest.approx(0.03)
    assert tpot_between(llama(2.0, 100), llama(2.0, 100)) is None  # nothing generated in the window
    assert tpot_between(Load(), llama(2.0, 100)) is None  # not exposed before
    assert llama(2.0, 100).emitted == 100.0


def test_per_position_counts_that_do_not_add_up_are_left_out() -> None:
    # Prometheus' increase() misses a series' first value: positions first seen in the window read as 0
    delta = ServerCounters(drafts=6.0, draft_tokens=24.0, accepted_tokens=24.0,
                           accepted_per_position={0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0})  # fmt: skip
    w = window_of(0.0, 15.0, delta)
    assert w.per_position_acceptance is None and w.mean_acceptance_length == 5.0
