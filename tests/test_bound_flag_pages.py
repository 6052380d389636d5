"""Issue #21, defects 1 and 6, on the pages as a user sees them (streamlit.testing.v1.AppTest, sessions written
straight through the store API, as in tests/test_app_pages.py).

1. A measured speedup that breaks its bound (engine.analysis.bounds: speedup ≤ tokens per call ÷ (1 + the draft's
   share)) is flagged, never a green win: the Run page's live view, the Sessions runs table and History, the CLI's
   `sessions` and the run's stored summary (`speedup_flag`, decided once by the sweep's summary of the run).
6. The live view names no run "running" before its first step or while the session does something else, and its
   per-position chart is the conditional rate of single steps, never more positions than the run's γ.
"""

from __future__ import annotations

import json
import time

import pytest

from engine.core.records import PromptOutput, StepRecord
from tests.test_app_pages import add_prompts, assert_clean, env, page, texts, unescape_md  # noqa: F401 - env: fixture

TARGET = "tiny:1:48:2:64"
BASE_TPS = 1.72
# the llama.cpp session: n-gram at γ=4 delivered 1.09 tokens per target call, yet measured 1.93×
IMPOSSIBLE = {"tokens_per_s": 3.4, "tokens_per_call": 1.09, "speedup_measured": 1.93, "c": 0.0, "alpha": None}
POSSIBLE = {"tokens_per_s": 2.0, "tokens_per_call": 1.6, "speedup_measured": 1.16, "c": 0.0, "alpha": None}


def _spread(median: float) -> dict:
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "n": 2, "verdict": "faster"}


def _session(store, status: str = "done", phase: str | None = None, legacy: bool = True) -> int:
    """A finished (or running) session: the target alone, n-gram γ=4 (an impossible 1.93×) and γ=2 (a possible
    1.16×). `legacy`: runs stored as before runs carried their flag (the readers check them the same way)."""
    set_id = add_prompts(store, [("def f(x):", None), ("for i in range(3):", None)], name="bounds")
    sid = store.create_session(
        name="impossible", target=TARGET, drafts=["ngram"], gammas=[2, 4], temperatures=[0.0], max_new_tokens=8,
        prompt_set_id=set_id, n_prompts=2, dtype="float32", device="cpu",
    )  # fmt: skip
    store.claim_next_session("testhost:99999")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    two = store.create_run(sid, "ngram", 2, 0.0, "speculative")
    four = store.create_run(sid, "ngram", 4, 0.0, "speculative")
    if phase:
        store.set_phase(sid, {"name": phase, "done": 0, "total": 6})
    if status == "running":
        return sid
    t0 = time.time()
    with store.step_writer(base) as w:
        for i in range(4):
            w.add(StepRecord(0, i, 0, 0, [], [], 0.0, 0.5, 0, 1, [2 + i], [False]), t=t0 + i)
    with store.step_writer(two) as w:
        for i in range(5):
            w.add(StepRecord(0, i, 2, 1, [True, False], [], 0.0, 0.3, 0, 2), t=t0 + 7 + i * 0.1)
    with store.step_writer(four) as w:  # logged last; n-gram drafts on few calls
        for i in range(11):
            drafted = 4 if i == 0 else 0
            w.add(StepRecord(0, i, drafted, 1 if drafted else 0, [True, False] if drafted else [], [], 0.0, 0.3, 0,
                             2 if drafted else 1), t=t0 + 5 + i * 0.1)  # fmt: skip
    store.finish_run(base, {}, tokens_per_s=BASE_TPS, tokens_per_call=1.0, speedup_measured=1.0)
    for run, figures in ((four, IMPOSSIBLE), (two, POSSIBLE)):
        summary = {**figures, "speedup_spread": _spread(figures["speedup_measured"]), "steps": 11, "draft_calls": 0}
        if not legacy:
            from engine.session.summarise import stored_speedup_flag

            summary["speedup_flag"] = stored_speedup_flag({**summary, "kind": "speculative", "gamma": 4})
        store.finish_run(run, summary, **figures, speedup_predicted=1.0, baseline_tokens_per_s=BASE_TPS)
    for index, prompt in enumerate(store.get_prompts(set_id)):
        for run in (base, four, two):
            store.add_output(run, PromptOutput(index, str(prompt["id"]), 3, [2, 3, 4], "abc", [False] * 3, 0.1, 3))
    runs = [
        {"draft": "ngram", "gamma": g, "temperature": 0.0, "kind": "speculative", **f,
         "speedup_spread": _spread(f["speedup_measured"])}
        for g, f in ((4, IMPOSSIBLE), (2, POSSIBLE))
    ]  # fmt: skip
    store.set_progress(sid, 6, 6)
    store.finish_session(sid, status, summary={"runs": runs, "noisy_runs": []})
    return sid


def _metrics(at) -> dict:
    return {m.label: m for m in at.metric}


# ---------------------------------------------------------------------------------------------------------------------
# 1. an impossible speedup is flagged everywhere


def test_run_page_flags_an_impossible_speedup_instead_of_a_green_gain(env) -> None:  # noqa: F811
    sid = _session(env.store)
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    assert "ngram γ=4 T=0 (done" in unescape_md(texts(at.caption)).replace("**", "")
    tokens = _metrics(at)["Tokens/s"].proto
    assert "impossible" in tokens.delta and not tokens.delta.startswith("+"), tokens.delta
    assert "GREEN" not in str(tokens) and "direction: UP" not in str(tokens)  # grey, no arrow: not a gain
    assert any("impossible" in w and "1.09 tokens per target call" in w for w in (x.value for x in at.warning))


def test_speed_check_flags_a_live_ratio_above_its_bound() -> None:
    from app import run_view as rv

    run = {"kind": "speculative", "gamma": 4, "status": "running", "draft": "ngram"}
    check = rv.speed_check(run, {"tokens_per_s": 3.4, "tokens_per_call": 1.09}, {"tokens_per_s": 1.72}, final=False)
    assert check.flag and "1.09 tokens per target call" in check.flag
    assert check.colour == "off" and check.arrow == "off" and "impossible" in check.delta
    fine = rv.speed_check(run, {"tokens_per_s": 1.8, "tokens_per_call": 1.09}, {"tokens_per_s": 1.72}, final=False)
    assert fine.flag is None and fine.delta == "+5% vs baseline (1.05×)" and fine.colour == "normal"


def test_a_finished_runs_delta_is_its_whole_run_speedup_not_a_third_ratio() -> None:
    """Finished, the Tokens/s delta is the stored whole-run speedup (what the one model predicts and the
    quick session confirms), named so; the live ratio of end-to-end tokens/s is only for a run still decoding."""
    from app import run_view as rv

    run = {"kind": "speculative", "gamma": 2, "status": "done", "draft": "ngram",
           "summary": {"speedup_whole_run": 1.41, "speedup_measured": 1.44}}  # fmt: skip
    now, base = {"tokens_per_s": 2.72, "tokens_per_call": 2.34}, {"tokens_per_s": 2.0}
    done = rv.speed_check(run, now, base, final=True)
    assert done.flag is None and done.delta == "+41% vs baseline (1.41× whole run)"
    assert rv.speed_check(run, now, base, final=False).delta == "+36% vs baseline (1.36×)"
    policy = {**run, "summary": {"policy_live": {"speedup_whole_run": 1.2}}}
    assert rv.speed_check(policy, now, base, final=True).delta == "+20% vs baseline (1.20× whole run)"
    older = {**run, "summary": {}}  # stored before the whole-run figure existed: the tokens/s ratio, unnamed
    assert rv.speed_check(older, now, base, final=True).delta == "+36% vs baseline (1.36×)"
    impossible = {**run, "summary": {"speedup_whole_run": 3.0}}
    first, beside = {"id": 1, "kind": "baseline", "temperature": 0.0}, {"id": 3, "kind": "baseline", "temperature": 0.0}
    confirming = {**run, "id": 4, "temperature": 0.0}
    runs = [first, {**run, "id": 2, "temperature": 0.0}, beside, confirming]
    from engine.service.report.runs import baseline_tps, compared_baseline

    assert compared_baseline(runs, confirming) is beside and compared_baseline(runs, runs[1]) is first
    assert compared_baseline(runs, beside) is beside  # a baseline is its own
    assert baseline_tps([{**first, "tokens_per_s": 101.2}, {**beside, "tokens_per_s": 95.5}], confirming) == 95.5
    assert "impossible" in rv.speed_check(impossible, now, base, final=True).delta


@pytest.mark.parametrize("legacy", [True, False])
def test_sessions_page_flags_it_in_the_runs_table_and_history_never_picks_it(env, legacy) -> None:  # noqa: F811
    sid = _session(env.store, legacy=legacy)
    at = page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(at)
    frames = [d.value for d in at.dataframe]
    history = next(f for f in frames if "best speedup" in f.columns)
    assert history["best speedup"].iloc[0].startswith("1.16×")  # the possible one, never the impossible 1.93
    runs = next(f for f in frames if "speedup measured" in f.columns and "kind" in f.columns)
    four = runs[runs["γ"] == 4].iloc[0]
    two = runs[runs["γ"] == 2].iloc[0]
    assert four["bound"] == "⚠ impossible" and "impossible" in four["verdict"]
    assert two["verdict"] == "faster" and not isinstance(two["bound"], str)
    warning = unescape_md(texts(at.warning))
    assert "ngram γ=4 T=0" in warning and "1.09 tokens per target call" in warning


def test_compare_sessions_flags_it_too(env) -> None:  # noqa: F811
    first, second = _session(env.store), _session(env.store)
    at = page("pages/3_Sessions.py")
    at.multiselect(key="compare_sessions").set_value([first, second])
    at.run()
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "session" in d.value.columns and "config" in d.value.columns)
    flagged = table[table["config"].str.contains("γ=4")]
    assert len(flagged) == 2 and (flagged["bound"] == "⚠ impossible").all()
    assert not table[table["config"].str.contains("γ=2")]["bound"].notna().any()


def test_cli_sessions_shows_the_best_possible_speedup_and_flags_the_impossible_one(env, capsys) -> None:  # noqa: F811
    from engine.service.cli.queue import cmd_sessions

    _session(env.store)
    assert cmd_sessions(type("Args", (), {"json": False})()) == 0
    out = capsys.readouterr().out
    assert "1.16×" in out and "1.93" not in out.splitlines()[1]
    assert "impossible, not a result: ngram γ=4 T=0: measurement error" in out


def test_a_run_is_stored_with_its_flag_decided_once_by_its_summary() -> None:
    from engine.core.counters import SpecCounters
    from engine.session.runner import RunKey
    from engine.session.summarise import RunTally, stored_speedup_flag, summarise
    from engine.session.sweep import SweepReport

    key, base_key = RunKey("ngram", 4, 0.0), RunKey("none", 0, 0.0)
    base = RunTally(base_key, None, decoded={0: (17, 10.0), 1: (18, 10.0)})  # 1.7 and 1.8 tokens/s
    tally = RunTally(key, None, decoded={0: (33, 10.0), 1: (35, 10.0)}, tokens=109, decode_s=32.0,
                     counters=SpecCounters(drafts=10, draft_tokens=40, accepted_tokens=9, target_calls=100,
                                           emitted=109))  # fmt: skip
    summary = summarise(tally, base, 0.0, {1: 1.0}, "llama.cpp")
    assert summary.speedup_measured == pytest.approx(1.94, abs=0.01) and summary.speedup_spread["verdict"] == "faster"
    assert summary.speedup_flag and "1.09 tokens per target call" in summary.speedup_flag
    stored = {"kind": "speculative", "gamma": 4, "summary": json.loads(json.dumps(summary.to_dict()))}
    assert stored_speedup_flag(stored) == summary.speedup_flag  # read back as stored, not checked again
    assert "impossible_runs" in SweepReport("t", "e", "float32", "cpu", {}, {}, {}, []).to_dict()


# ---------------------------------------------------------------------------------------------------------------------
# 6. the live view's phase and per-position chart


@pytest.mark.parametrize("phase", ["starting llama-server 3 of 6", "measuring v(k)", "loading models"])
def test_no_run_is_called_running_before_its_first_step(env, phase) -> None:  # noqa: F811
    sid = _session(env.store, "running", phase=phase)
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    caption = unescape_md(texts(at.caption)).replace("**", "")
    assert "Current run" not in caption and "ngram γ" not in caption  # no run named, the session's phase instead
    assert f"{phase[:1].upper()}{phase[1:]}… (no run has decoded a token yet)" in caption
    assert not [m for m in at.metric if m.label == "Tokens/s"]


def _running_with_steps(store, steps: list[StepRecord], phase: str, gamma: int = 2) -> tuple[int, int]:
    sid = _session(store, "running", phase=phase)
    run = next(r for r in store.list_runs(sid) if r["gamma"] == 2)["id"] if gamma == 2 else None
    if run is None:
        run = next(r for r in store.list_runs(sid) if r["gamma"] == gamma)["id"]
    with store.step_writer(run) as w:
        for i, step in enumerate(steps):
            w.add(step, t=time.time() + i * 0.01)
    return sid, run


def test_a_run_is_current_only_while_it_decodes(env) -> None:  # noqa: F811
    steps = [StepRecord(0, i, 2, 1, [True, False], [], 0.0, 0.3, 0, 2) for i in range(3)]
    sid, _ = _running_with_steps(env.store, steps, "decoding prompt 1 of 2")
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert "Current run: **ngram γ=2 T=0** (decoding" in texts(at.caption) or "Current run:" in texts(at.caption)
    env.store.set_phase(sid, {"name": "measuring v(k)", "done": 0, "total": 1})
    at = page("pages/2_Run.py", {"session": str(sid)})
    caption = unescape_md(texts(at.caption)).replace("**", "")
    assert "Current run" not in caption and "Last run measured: ngram γ=2 T=0" in caption
    assert "now: measuring v(k)" in caption and "paused between prompts" in caption
    env.store.set_progress(sid, 4, 4)  # every prompt decoded; the session records a trace before it ends
    env.store.set_phase(sid, {"name": "recording the draft's trace for the policy replay", "done": 0, "total": 1})
    caption = unescape_md(texts(page("pages/2_Run.py", {"session": str(sid)}).caption)).replace("**", "")
    assert "Last run measured: ngram γ=2 T=0 (every prompt decoded" in caption and "paused" not in caption


def _chart_positions(at) -> list[dict]:
    """The rows the per-position chart draws (its data travels as Arrow beside the spec)."""
    import pyarrow as pa

    for chart in at.get("vega_lite_chart"):
        if "Acceptance by draft position" in json.dumps(json.loads(chart.proto.spec).get("title")):
            frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
            return [row for frame in frames for row in frame.to_dict("records")]
    return []


def test_an_engines_request_totals_are_no_step_of_gamma_their_draft_tokens(env) -> None:  # noqa: F811
    # llama.cpp logs one record per request: 20 tokens drafted over 12 target calls at γ=2, 10 accepted
    totals = [StepRecord(i, 0, 20, 10, [], [], 0.0, 1.0, 0, 22, target_calls=12) for i in range(2)]
    sid, _ = _running_with_steps(env.store, totals, "decoding prompt 2 of 2")
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    assert _metrics(at)["Draft acceptance rate"].value == "0.500"
    positions = _chart_positions(at)
    assert len(positions) <= 2, positions  # never 20 positions on a γ=2 run, never 1.0 at positions 1–10
    assert "logs only each request's totals" in texts(at.caption)


def test_the_chart_is_the_conditional_rate_of_the_steps_behind_the_figure_beside_it(env) -> None:  # noqa: F811
    # γ=2 steps: 2 accepted, 0 accepted, 1 accepted, 2 accepted → position 1: 3/4, position 2: 2/3 (conditional)
    steps = [
        StepRecord(0, i, 2, a, mask, [], 0.0, 0.3, 0, a + 1)
        for i, (a, mask) in enumerate([(2, [True, True]), (0, [False]), (1, [True, False]), (2, [True, True])])
    ]
    sid, _ = _running_with_steps(env.store, steps, "decoding prompt 1 of 2")  # fmt: skip
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    assert _metrics(at)["Draft acceptance rate"].value == f"{5 / 8:.3f}"  # accepted ÷ draft tokens
    positions = sorted(_chart_positions(at), key=lambda r: r["position"])
    assert [round(r["rate"], 3) for r in positions] == [0.75, round(2 / 3, 3)]
    assert sum(r["rate"] * r["evaluated"] for r in positions) == pytest.approx(5)  # the same accepted tokens


def test_the_chart_is_of_the_run_beside_it_even_within_the_chart_interval(env) -> None:  # noqa: F811
    from app.run_view import LiveCache

    sid = _session(env.store, "running", phase="decoding prompt 1 of 2")
    two, four = (next(r["id"] for r in env.store.list_runs(sid) if r["gamma"] == g) for g in (2, 4))
    cache = LiveCache(sid, chart_every_s=60.0)
    with env.store.step_writer(four) as w:
        w.add(StepRecord(0, 0, 4, 4, [True] * 4, [], 0.0, 0.3, 0, 5), t=time.time())
    assert cache.refresh(env.store, 0.0).current["id"] == four and cache.chart_builds == 1
    charted = json.dumps(cache.positions_spec, default=str)
    with env.store.step_writer(two) as w:  # the interleaved sweep moves on to the γ=2 run a moment later
        w.add(StepRecord(0, 0, 2, 1, [True, False], [], 0.0, 0.3, 0, 2), t=time.time() + 1)
    frame = cache.refresh(env.store, 0.5)
    assert frame.current["id"] == two and cache.chart_builds == 2
    assert json.dumps(frame.positions_spec, default=str) != charted  # the γ=2 run's positions, not the γ=4 run's
