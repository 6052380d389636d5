"""The physical bounds every figure is checked against before it is shown, stored or calibrated to."""

from __future__ import annotations

import math

import pytest

from engine.analysis.bounds import (
    MEASURED_SLACK,
    check_fraction_of_peak,
    check_measured_speedup,
    check_predicted_speedup,
    check_tokens_per_call,
)


def test_measured_speedup_is_bounded_by_the_runs_own_tokens_per_call() -> None:
    # seen on a loaded machine: 3.07× measured from a run that delivered 1.35 tokens per target call
    flag = check_measured_speedup(3.07, gamma=4, tokens_per_call=1.35)
    assert flag is not None and flag.quantity == "measured speedup"
    assert flag.value == 3.07 and flag.bound == pytest.approx(1.35)
    assert "measurement error" in flag.message and "load changed between runs" in flag.message
    assert "1.35 tokens per target call" in str(flag)
    assert check_measured_speedup(1.30, gamma=4, tokens_per_call=1.35) is None
    assert check_measured_speedup(1.35 * (1 + MEASURED_SLACK / 2), gamma=4, tokens_per_call=1.35) is None  # noise
    # the drafting share tightens it: tokens per call ÷ (1 + share)
    assert check_measured_speedup(1.30, gamma=4, tokens_per_call=1.35, draft_share=0.2) is not None


def test_measured_speedup_without_tokens_per_call_is_bounded_by_gamma_plus_one() -> None:
    assert check_measured_speedup(3.07, gamma=1) is not None  # at γ=1 at most 2 tokens per call
    assert check_measured_speedup(1.9, gamma=1) is None
    # an impossible tokens-per-call figure is not trusted as the bound: γ+1 is used instead
    assert check_measured_speedup(2.5, gamma=4, tokens_per_call=9.0) is None
    assert check_measured_speedup(math.inf, gamma=4) is not None


def test_a_deployment_s_speedup_is_bound_by_the_tokens_per_call_it_reported_not_by_gamma_zero() -> None:
    """An endpoint speculates with a γ of its own (stored as γ 0): 1.5× is possible where it delivered 2.4 tokens
    a call, impossible where it delivered 1.1, and unjudged where it reported none."""
    assert check_measured_speedup(1.5, gamma=0, tokens_per_call=2.4) is None
    flag = check_measured_speedup(1.5, gamma=0, tokens_per_call=1.1)
    assert flag is not None and "delivered 1.10 tokens per target call" in flag.message and "γ=0" not in flag.message
    assert check_measured_speedup(1.5, gamma=0) is None


def test_predicted_speedup_and_tokens_per_call_are_at_most_gamma_plus_one() -> None:
    flag = check_predicted_speedup(3.86, gamma=1)
    assert flag is not None and flag.bound == 2.0 and "exceeds γ+1 = 2" in flag.message
    assert check_predicted_speedup(2.0, gamma=1) is None
    assert check_tokens_per_call(2.0, gamma=1) is None
    assert check_tokens_per_call(1.35, gamma=4) is None
    assert check_tokens_per_call(4.78 * 1.35, gamma=4) is not None
    assert check_tokens_per_call(0.5, gamma=4) is not None  # every call yields at least the target's own token
    assert check_tokens_per_call(2.05, gamma=1, measured=False) is not None  # predictions get no slack


def test_achieved_is_at_most_the_measured_peak() -> None:
    flag = check_fraction_of_peak(5.15, 1.0, "FLOP/s")
    assert flag is not None and "515% of the measured peak" in flag.message and "load changed" in flag.message
    assert check_fraction_of_peak(0.8e12, 1e12, "bandwidth") is None
    assert check_fraction_of_peak(1.0, 0.0, "bandwidth") is not None  # no peak: nothing can be judged against it


def test_a_run_is_judged_on_its_whole_run_and_the_cheapest_verify_it_measured() -> None:
    from engine.session.summarise import speedup_flag

    # measured in bf16 on an AVX-512 BF16 EPYC (the 0.5B draft at γ=2): 2.34 tokens per call, c 0.364 per forward,
    # 2 forwards a step; the v(k) probe 0.91–1.0, the loop's own 3-wide verify 0.85 of a target-alone step
    probe = {"1": 1.0, "2": 1.0, "3": 0.91, "4": 1.0, "5": 0.92}
    args = (2, 2.34, 0.364, 2.0)
    assert speedup_flag(1.58, *args, probe, whole_run=1.50, loop_v=0.85) is None  # the median may exceed the bound
    assert speedup_flag(1.58, *args, probe) is not None  # judged alone, with the probe's v: "impossible"
    flag = speedup_flag(1.58, *args, probe, whole_run=1.75, loop_v=0.85)
    assert flag is not None and "1.75× over the whole run" in flag
    # a loop "cheaper" than VERIFY_FLOOR is a baseline timed under load: the floor holds, the flag fires
    assert speedup_flag(1.9, *args, probe, whole_run=1.9, loop_v=0.3) is not None


def test_a_loop_verify_the_probe_does_not_corroborate_never_widens_the_bound() -> None:
    """The summary a hold-out walk stored unflagged: n-gram at γ=4 in spectune's loop, 1.371 tokens per call,
    1.687× over the whole run, a v(k) probe never below 1. Its loop's verify, timed against a baseline slowed by
    decoding first, read cheap by the same factor that inflated the speedup; it may not excuse it."""
    from engine.analysis.step_overhead import LoopPoint
    from engine.core.counters import SpecCounters
    from engine.core.records import PromptOutput
    from engine.session.runner import Decoded, RunKey
    from engine.session.summarise import RunTally, summarise

    def decoded(tokens: int, seconds: float, calls: int) -> Decoded:
        counters = SpecCounters(drafts=calls, draft_tokens=4 * calls, accepted_tokens=tokens - calls,
                                target_calls=calls, emitted=tokens)  # fmt: skip
        output = PromptOutput(0, "p", 8, list(range(tokens)), "", [False] * tokens, seconds, calls)
        return Decoded(output, counters, seconds, tokens=tokens)

    base, run = RunTally(RunKey("none", 0, 0.0), None), RunTally(RunKey("ngram", 4, 0.0), None)
    for i in range(4):
        base.add(i, decoded(96, 1.0, 96), 1.0)
        run.add(i, decoded(96, 1.0 / 1.687, 70), 1.0)  # 1.371 tokens per call
    verify = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.045, 5: 1.143}
    summary = summarise(run, base, 0.0, verify, "spectune", loop_point=LoopPoint(5.0, 0.80, 40))
    assert summary.tokens_per_call is not None and abs(summary.tokens_per_call - 1.371) < 0.01
    assert summary.speedup_whole_run is not None and abs(summary.speedup_whole_run - 1.687) < 0.001
    assert summary.speedup_flag is not None and "1.69× over the whole run" in summary.speedup_flag
    assert "no speedup above 1.37×" in summary.speedup_flag  # 1.371 ÷ (1 + 0): v(k) never measured below 1
    assert [p["prompt"] for p in summary.speedup_above_bound] == [1, 2, 3, 4]
