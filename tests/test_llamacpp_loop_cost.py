"""What llama-server's speculative loop costs, measured in the loop (issue #18: prediction meets measurement).

llama.cpp's draft-model predictions were 0.72–0.76 of what was measured: the model charged c from the draft alone
and v(k) from llama-bench's batch. The draft's own time in the loop is now read from the server's statistics, and
what a drafting step's target call costs beyond llama-bench's batch is fitted per step and per verified token."""

from __future__ import annotations

import pytest

from engine.analysis.prediction import CostModel, bound_flags, positional
from engine.analysis.step_overhead import LoopPoint, StepOverhead, fit_step_overhead, fitted_v
from engine.analysis.theory import fit_verify_cost
from engine.engines.llamacpp.draft_stats import DraftStats, last_stats
from engine.engines.llamacpp.server import ServerConfig
from engine.engines.registry import sweep
from engine.session.spec import SessionSpec
from tests.test_llamacpp import DRAFT, PROMPTS, TARGET, Recorder
from tests.test_llamacpp import no_server_left_behind as no_server_left_behind  # autouse: every server stops

# as llama-server build 11434 logs it at verbosity 4 after a request
LINE = ("0.07.957.632 I spec common_specu: statistics     draft-simple: #calls(b,g,a) =    2      9      9, "
        "#gen drafts =      9, #acc drafts =     8, #gen tokens =      9, #acc tokens =     8, #mean acc len = 1.89, "
        "#acc rate/pos = (0.889), dur(b,g,a) = 0.099, 472.881, 0.009 ms")  # fmt: skip


def test_the_drafts_statistics_are_read_from_the_last_line_and_differenced_per_request() -> None:
    earlier = LINE.replace("   2      9      9", "   1      1      1").replace("472.881", "54.716")
    stats = last_stats(f"{earlier}\nother line\n{LINE}\n0.07.957.988 I slot release: id 0\n")
    assert stats == DraftStats(requests=2, calls=9, ms=472.881)
    assert last_stats("no statistics here") is None
    one = stats.minus(DraftStats(1, 1, 54.716))
    assert (one.requests, one.calls) == (1, 8) and one.ms == pytest.approx(418.165)
    assert DraftStats(1, 3, 30.0).minus(stats) == DraftStats(1, 3, 30.0)  # a restarted server counts from zero


def test_only_a_server_with_a_draft_model_logs_at_the_verbosity_its_statistics_need() -> None:
    from pathlib import Path

    assert "-lv" in ServerConfig(Path("t.gguf"), draft=Path("d.gguf"), spec_type="draft-simple").flags()
    assert "-lv" not in ServerConfig(Path("t.gguf")).flags()
    assert "-lv" not in ServerConfig(Path("t.gguf"), spec_type="ngram-simple").flags()
    assert "-lv" not in ServerConfig(Path("t.gguf"), draft=Path("d.gguf"), spec_type="draft-simple").speculation_flags(
        "user"
    )  # an export never carries it


def test_the_step_overhead_is_fitted_per_step_and_per_token_from_in_loop_verifies() -> None:
    fit = fit_verify_cost({2: 1.34, 3: 1.64, 5: 1.96})
    truth = StepOverhead(per_step=0.6, per_token=0.2)
    points = [LoopPoint(k, fitted_v(fit, k) + truth.at(k - 1), steps) for k, steps in ((2.0, 20), (3.0, 15), (4.9, 12))]
    got = fit_step_overhead(points, fit)
    assert got.per_step == pytest.approx(0.6) and got.per_token == pytest.approx(0.2)
    # one width cannot separate the two terms: the whole excess is charged per step
    assert fit_step_overhead(points[2:], fit) == StepOverhead(per_step=pytest.approx(0.6 + 0.2 * 3.9))
    # never negative: a loop measured cheaper than its batch forwards is noise, charged nothing
    cheap = [LoopPoint(2.0, 1.0, 10), LoopPoint(5.0, 1.5, 10)]
    assert fit_step_overhead(cheap, fit) == StepOverhead()
    falling = [LoopPoint(2.0, 2.5, 10), LoopPoint(5.0, 2.6, 10)]  # excess falls with width: per step alone
    assert fit_step_overhead(falling, fit).per_token == 0 and fit_step_overhead(falling, fit).per_step > 0
    assert fit_step_overhead([], fit) == StepOverhead() and not StepOverhead()


def test_a_drafting_step_pays_the_overhead_and_a_plain_step_does_not() -> None:
    overhead = StepOverhead(per_step=0.5, per_token=0.1)
    plain = CostModel(c=0.2, verify_cost={2: 1.2, 3: 1.4})
    loop = CostModel(c=0.2, verify_cost={2: 1.2, 3: 1.4}, overhead=overhead)
    # half the calls draft γ=2 (accepted at 0.8, then 0.5): tokens 0.5·(1 + 0.8 + 0.4) + 0.5 = 1.6 per call
    free, paid = positional([0.8, 0.5], 0.5, 2, plain, True), positional([0.8, 0.5], 0.5, 2, loop, True)
    assert free.tokens_per_call == paid.tokens_per_call == pytest.approx(1.6)
    # per call: 0.5·(0.2·2 + 1.4) + 0.5·1 = 1.4, and 0.5·(0.5 + 0.1·2) = 0.35 more with the overhead
    assert free.predicted_speedup == pytest.approx(1.6 / 1.4) and paid.predicted_speedup == pytest.approx(1.6 / 1.75)
    assert not bound_flags(paid)
    assert positional([0.8], 0.0, 2, loop, True).predicted_speedup == pytest.approx(1.0)  # nothing drafted: no cost


def test_a_llamacpp_session_measures_the_draft_and_the_verify_inside_the_loop() -> None:
    spec = SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[1, 3], max_new_tokens=16, engine="llama.cpp")
    hooks = Recorder()
    report = sweep(spec, PROMPTS[:2], hooks).to_dict()
    assert not report["failed"]
    assert any("inside llama-server's loop" in note for note in report["notes"]), report["notes"]
    draft_runs = {run for run, key in hooks.keys.items() if key["draft"] == DRAFT}
    records = [r for run, r in hooks.steps if run in draft_runs]
    assert records and all(r.draft_time_s > 0 and r.verify_time_s > 0 for r in records if r.gamma > 0)
    runs = [r for r in report["runs"] if r["draft"] == DRAFT]
    assert sorted(r["gamma"] for r in runs) == [1, 3]
    fit = fit_verify_cost({int(k): v for k, v in report["verify_cost"].items()})
    overheads = {tuple(sorted(r["step_overhead"].items())) for r in runs}
    assert len(overheads) == 1  # one fit per draft, over its runs at both widths
    overhead = StepOverhead.from_dict(runs[0]["step_overhead"])
    for run in runs:
        point = run["verify_in_loop"]
        # v and c are timed, in target steps timed apart from them: a busy machine moves both (v below 1, c near
        # 10 beside a CPU hog), so only their sign is asserted here
        assert 1.0 < point["k"] <= run["gamma"] + 1 and point["v"] > 0.0 and point["steps"] > 0
        assert run["c"] > 0.0
    # what every run was predicted with is what the one model charges: the fit of the runs' own in-loop points. How
    # busy the machine was moves the points, never this relation; where the fit is a line through both widths (no
    # term held at 0), it gives each run's in-loop verify back.
    points = [LoopPoint(**run["verify_in_loop"]) for run in runs]
    refit = fit_step_overhead(points, fit)
    assert (overhead.per_step, overhead.per_token) == pytest.approx((refit.per_step, refit.per_token), abs=1e-3)
    if overhead.per_step > 0 and overhead.per_token > 0:
        for p in points:
            assert p.v - fitted_v(fit, p.k) == pytest.approx(overhead.at(p.k - 1), abs=1e-2), (p, overhead)
