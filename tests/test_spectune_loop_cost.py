"""spectune's own loop, timed as llama.cpp's is: c and each run's verify in units of the same prompt's
target-alone step, the step overhead fitted to them, and a confirmation that records no second trace."""

from __future__ import annotations

from statistics import median
from typing import Any

import pytest

from engine.analysis.step_overhead import InLoop, LoopPoint, StepOverhead, fit_step_overhead, loop_point
from engine.analysis.theory import fit_verify_cost
from engine.core.records import PromptOutput
from engine.engines.registry import sweep
from engine.session.runner import PromptText, RunKey
from engine.session.spec import SessionSpec
from tests.test_llamacpp import Recorder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
PROMPTS = [PromptText(f"p{i}", f"count {i}: one two three four five six seven eight") for i in range(3)]


class Outputs(Recorder):
    """The hooks of a sweep, keeping every prompt's output too (its decode time)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: dict[Any, list[PromptOutput]] = {}

    def output(self, run: Any, output: PromptOutput, divergence: dict | None) -> None:
        self.outputs.setdefault(run, []).append(output)


def spec(**over: Any) -> SessionSpec:
    base = {"target": TARGET, "drafts": [DRAFT, "ngram"], "gammas": [1, 3], "temperatures": [0.0],
            "max_new_tokens": 20, "dtype": "float32", "device": "cpu", "chat_template": False,
            "detect_regime": False}  # fmt: skip
    return SessionSpec(**(base | over))


def _decode_ms(out: PromptOutput) -> float:
    return 1000.0 * (out.wall_time_s - out.prefill_time_s)


def test_a_run_s_loop_point_is_its_time_beside_the_drafts_forwards_in_target_alone_steps() -> None:
    # two prompts whose target-alone steps took 10 and 20 ms: each request is read in its own prompt's steps
    requests = [
        InLoop(0, target_ms=65.0, draft_ms=12.0, drafting_calls=4, plain_calls=1, drafted=8.0, forwards=8),
        InLoop(1, target_ms=130.0, draft_ms=24.0, drafting_calls=4, plain_calls=1, drafted=8.0, forwards=8),
        InLoop(2, target_ms=99.0, draft_ms=9.0, drafting_calls=3, plain_calls=0, drafted=3.0, forwards=3),
    ]
    point, costs = loop_point(requests, {0: [10.0], 1: [20.0, 20.0]})  # prompt 2 has no target-alone step
    assert point == LoopPoint(k=3.0, v=(6.5 - 1 + 6.5 - 1) / 8, steps=8)  # 16 draft tokens over 8 steps
    assert costs == [pytest.approx(0.15), pytest.approx(0.15)]
    assert loop_point([InLoop(0, 10.0, 0.0, 0, 1, 0.0, 0)], {0: [10.0]}) == (None, [])  # nothing drafted


def test_spectune_measures_c_and_each_runs_verify_inside_its_loop() -> None:
    hooks = Outputs()
    report = sweep(spec(), PROMPTS, hooks).to_dict()
    assert not report["failed"]
    runs = {(k["draft"], k["gamma"]): run for run, k in hooks.keys.items()}
    step_ms = [_decode_ms(o) / o.steps for o in hooks.outputs[runs[("none", 0)]]]
    fit = fit_verify_cost({int(k): v for k, v in report["verify_cost"].items()})
    for draft in (DRAFT, "ngram"):
        points = []
        for gamma in (1, 3):
            run = runs[(draft, gamma)]
            records = [r for h, r in hooks.steps if h == run]
            drafting = [r for r in records if r.gamma > 0]
            summary = hooks.finished[run]
            point = summary.verify_in_loop
            assert point is not None and point["steps"] == len(drafting)
            assert point["k"] == pytest.approx(1 + sum(r.gamma for r in drafting) / len(drafting), abs=1e-3)
            assert 1.0 < point["k"] <= gamma + 1
            # the run's decode time less its draft forwards, per drafting step, in its prompts' own target steps
            units = 0.0
            for out, step in zip(hooks.outputs[run], step_ms, strict=True):
                mine = [r for r in records if r.prompt_index == out.prompt_index]
                forward_ms = 1000.0 * sum(r.draft_time_s for r in mine if r.draft_forwards > 0)
                units += (_decode_ms(out) - forward_ms) / step - sum(1 for r in mine if r.gamma == 0)
            assert point["v"] == pytest.approx(units / len(drafting), rel=1e-3)
            points.append(LoopPoint(**point))
        expected = fit_step_overhead(points, fit).to_dict()
        for gamma in (1, 3):  # one fit per draft over its runs, charged on both
            stored = StepOverhead.from_dict(hooks.finished[runs[(draft, gamma)]].step_overhead).to_dict()
            assert stored == pytest.approx(expected, abs=2e-4)
    # c: the draft's forward ms per forward, over the same prompt's target-alone step, median over its requests
    per_request = []
    for gamma in (1, 3):
        run = runs[(DRAFT, gamma)]
        for out, step in zip(hooks.outputs[run], step_ms, strict=True):
            mine = [r for h, r in hooks.steps if h == run and r.prompt_index == out.prompt_index and r.draft_forwards]
            per_request.append(1000.0 * sum(r.draft_time_s for r in mine) / sum(r.draft_forwards for r in mine) / step)
    assert hooks.finished[runs[(DRAFT, 1)]].c == pytest.approx(median(per_request), rel=1e-6)
    assert hooks.finished[runs[("ngram", 3)]].c == 0.0  # a lookup has no forward: its time is in the verify


def test_a_confirmation_records_no_second_trace() -> None:
    plan = [RunKey("none", 0, 0.0), RunKey(DRAFT, 2, 0.0)]
    first, again = Outputs(), Outputs()
    report = sweep(spec(gammas=[2]), PROMPTS, first, plan=plan).to_dict()
    measured = {int(k): v for k, v in report["verify_cost"].items()}
    sweep(spec(gammas=[2]), PROMPTS, again, plan=plan, verify_cost=measured, traces=False)
    assert [s.policy_trace is not None for s in first.finished.values()] == [False, True]
    assert all(s.policy_trace is None and not s.agreement_runs for s in again.finished.values())
    assert all(s.c is not None and s.c > 0 for run, s in again.finished.items() if again.keys[run]["draft"] == DRAFT)
