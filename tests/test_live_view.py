"""The live view: the phase with its own progress and time left (through AppTest), a refresh that re-reads
only what changed and rebuilds charts only when new data arrived, the pace it polls at, the busy-machine
note and the speedup spread on the Run and Sessions pages, and the Run form's prompt sample."""

from __future__ import annotations

import re
import time
from typing import Any

from test_app_pages import DRAFT, add_prompts, assert_clean, env, make_session, page, texts, unescape_md  # noqa: F401

from app import run_view as rv
from app.run_view.cache import _totals_numbers
from engine.core.records import StepRecord


def phase(store: Any, sid: int, name: str, done: int, total: int, eta: float | None) -> None:
    store.set_phase(sid, {"name": name, "done": done, "total": total, "eta_s": eta})


def test_the_phase_is_shown_with_its_progress_and_time_left(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="phases")
    phase(env.store, sid, "decoding prompt 2 of 3", 4, 9, 75.0)
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    bars = [b.proto.text for b in at.get("progress")]
    assert len(bars) == 1 and "Progress: 2 / 4 prompt decodes" in bars[0]  # one bar counts the prompt decodes
    shown = [unescape_md(c.value) for c in at.caption if "Phase" in c.value]
    assert shown == ["Phase: decoding prompt 2 of 3, about 75 s left"]
    phase(env.store, sid, "batch sweep up to batch 2", 0, 1, 600.0)
    at = page("pages/2_Run.py", {"session": str(sid)})
    bars = [unescape_md(b.proto.text) for b in at.get("progress")]
    assert "Phase: batch sweep up to batch 2, about 10 min left" in bars


def test_a_phase_time_left_counts_down_and_never_goes_stale(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="counting")
    said_at = time.time()
    env.store.set_phase(sid, {"name": "batch sweep up to batch 2", "done": 0, "total": 1, "eta_s": 120.0,
                              "at": said_at - 30})  # fmt: skip
    at = page("pages/2_Run.py", {"session": str(sid)})
    bars = [unescape_md(b.proto.text) for b in at.get("progress")]
    left = [re.fullmatch(r"Phase: batch sweep up to batch 2, about (\d+) s left", b) for b in bars]
    seconds = [int(m.group(1)) for m in left if m]
    rendered_in = time.time() - said_at  # the page counts from its own clock: a busy machine renders late
    assert len(seconds) == 1 and 90 - rendered_in - 1 <= seconds[0] <= 90, bars
    env.store.set_phase(sid, {"name": "batch sweep up to batch 2", "done": 0, "total": 1, "eta_s": 120.0,
                              "at": said_at - 240})  # fmt: skip
    at = page("pages/2_Run.py", {"session": str(sid)})
    bars = [unescape_md(b.proto.text) for b in at.get("progress")]
    assert "Phase: batch sweep up to batch 2, taking longer than estimated (about 2 min)" in bars, bars
    decoding = {"name": "decoding prompt 2 of 3", "done": 4, "total": 9, "eta_s": 200.0, "at": 1000.0}
    assert rv.phase_text(decoding, "running", now=1010.0) == "Phase: decoding prompt 2 of 3, about 3 min left"
    assert rv.phase_text(decoding, "running", now=1140.0) == "Phase: decoding prompt 2 of 3, about 60 s left"


def test_the_latest_output_of_a_policy_run_names_its_policy(env) -> None:  # noqa: F811
    from engine.core.records import PromptOutput
    from engine.service.worker.store_hooks import StoreHooks

    sid = make_session(env.store, "running", name="policy live")
    hooks = StoreHooks(env.store, sid, "test-worker")
    policy = "confidence:0.6:4:0"
    run = hooks.run_started({"draft": DRAFT, "gamma": 0, "temperature": 0.0, "kind": "speculative",
                             "policy": policy})  # fmt: skip
    hooks.step(run, StepRecord(0, 0, 3, 2, [True, True, False], [0.9, 0.8, 0.1], 0.002, 0.01, 3, 3, [2, 3, 4]))
    hooks.output(run, PromptOutput(0, "1", 5, [2, 3, 4], "bcd", [True, True, False], 0.05, 1), None)
    hooks.close_writer()
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    latest = [unescape_md(m.value) for m in at.markdown if "Latest output" in m.value]
    assert latest == [f"**Latest output** — {DRAFT} policy {policy} T=0, prompt 1"], latest
    assert policy in unescape_md(texts(at.caption))  # the run caption above the numbers too


def test_phase_text_and_poll_pace() -> None:
    assert rv.phase_text(None) is None
    assert rv.phase_text({"name": "loading models", "done": 0, "total": 1, "eta_s": None}) == "Phase: loading models"
    assert rv.phase_text({"name": "agreement pass", "done": 1, "total": 2, "eta_s": 3}) == (
        "Phase: agreement pass — 1 / 2 (50%), a few seconds left"
    )
    # an ended session: its banner says "Done."; one that stopped says where, with no count or time left
    assert rv.phase_text({"name": "done", "done": 1, "total": 1, "eta_s": 0}, "done") is None
    stopped = {"name": "starting llama-server 3 of 6", "done": 2, "total": 6, "eta_s": 50}
    assert rv.phase_text(stopped, "cancelled") == "Stopped during: starting llama-server 3 of 6"
    # a decoding phase counts the session's prompt decodes, which the progress bar says: no second count
    assert rv.phase_text({"name": "decoding prompt 3 of 6", "done": 20, "total": 42, "eta_s": 120}) == (
        "Phase: decoding prompt 3 of 6, about 2 min left"
    )
    assert rv.fmt_eta(4000) == "about 1 h 6 min"
    decoding = {"name": "decoding prompt 1 of 4", "done": 0, "total": 8}
    assert rv.poll_interval("running", decoding) == rv.POLL_S == 1.0
    for slow in ("loading models", "measuring v(k)", "agreement pass", "batch sweep up to batch 2"):
        assert rv.poll_interval("running", {"name": slow}) == rv.LONG_PHASE_POLL_S > rv.POLL_S
    assert rv.poll_interval("queued", None) == rv.LONG_PHASE_POLL_S


class Counting:
    """The store with every reader call counted."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if not callable(target):
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args, **kwargs)

        return counted


def test_a_refresh_with_nothing_new_reads_only_the_version_and_redraws_nothing(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="cached")
    store = Counting(env.store)
    cache = rv.LiveCache(sid, chart_every_s=2.0)
    first = cache.refresh(store, now=100.0)
    assert first.charts_rebuilt and cache.chart_builds == 1
    assert first.positions_spec is not None and first.util_spec is not None
    assert first.now["steps"] == 4 and first.base["steps"] == 6  # the speculative run logged last
    reads = dict(store.calls)
    assert reads["live_version"] == 1 and reads["step_totals_since"] == 1 and reads["list_runs"] == 1

    again = cache.refresh(store, now=100.5)  # nothing new, and within chart_every_s
    later = cache.refresh(store, now=110.0)  # nothing new, charts due: looked at, not rebuilt
    assert not again.charts_rebuilt and not later.charts_rebuilt and cache.chart_builds == 1
    assert later.positions_spec is first.positions_spec and later.util_spec is first.util_spec  # sent as they were
    new_reads = {k: v - reads.get(k, 0) for k, v in store.calls.items() if v != reads.get(k, 0)}
    assert new_reads == {"live_version": 2, "utilisation_series": 1}  # no steps, runs, session or outputs re-read

    spec_run = next(r for r in env.store.list_runs(sid) if r["kind"] == "speculative")
    with env.store.step_writer(spec_run["id"]) as w:
        w.add(StepRecord(1, 9, 2, 2, [True, True], [0.9, 0.9], 0.002, 0.01, 2, 3), t=time.time())
    fresh = cache.refresh(store, now=111.0)  # new data, but the charts were looked at 1 s ago
    assert not fresh.charts_rebuilt and fresh.now["steps"] == 5  # the numbers follow at once
    assert store.calls["step_totals_since"] == 2
    rebuilt = cache.refresh(store, now=113.0)
    assert rebuilt.charts_rebuilt and cache.chart_builds == 2
    assert store.calls["step_totals_since"] == 2  # the new step was read once, never again


def test_incremental_totals_match_the_stored_totals(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="totals")
    cache = rv.LiveCache(sid)
    cache.refresh(env.store, now=0.0)
    for run in env.store.list_runs(sid):
        stored = env.store.run_progress(run["id"])
        mine = _totals_numbers(cache.totals[run["id"]])
        for key in ("steps", "tokens_per_s", "draft_acceptance_rate", "tokens_per_call"):
            assert mine[key] == stored[key], key
        if run["kind"] == "speculative":
            counts = cache.histogram[run["id"]]
            positions = env.store.positions_from_histogram([(g, a, n) for (g, a), n in counts.items()])
            assert positions == env.store.per_position_acceptance(run["id"])


def test_version_changes_with_steps_outputs_runs_and_state(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="versions")
    v0 = env.store.live_version(sid)
    assert (v0["steps"], v0["outputs"], v0["runs"], v0["runs_done"], v0["status"]) == (10, 4, 2, 1, "running")
    assert env.store.live_version(sid)["version"] == v0["version"]
    env.store.set_phase(sid, {"name": "agreement pass", "done": 0, "total": 1, "eta_s": None})
    v1 = env.store.live_version(sid)
    assert v1["version"] != v0["version"] and v1["data_version"] == v0["data_version"]
    assert env.store.live_version(10_000)["status"] is None


def busy_summary() -> dict[str, Any]:
    load = {"other_cpu_pct_median": 62.0, "other_cpu_pct_max": 97.0, "n": 8}
    from engine.measure.noise import busy_note

    return {"runs": [], "machine_load": load, "machine_note": busy_note(load), "noisy_runs": [f"{DRAFT} γ=2 T=0"]}


def test_busy_machine_note_and_speedup_spread_on_run_and_sessions_pages(env) -> None:  # noqa: F811
    sid = make_session(env.store, "done", name="busy")
    env.store.finish_session(sid, "done", summary=busy_summary())
    spec_run = next(r for r in env.store.list_runs(sid) if r["kind"] == "speculative")
    spread = {"median": 1.6, "min": 0.9, "max": 2.1, "n": 2, "verdict": "too noisy to tell"}
    env.store.update_run(spec_run["id"], summary=spec_run["summary"] | {"speedup_spread": spread})

    run_page = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(run_page)
    assert "busy machine" in unescape_md(texts(run_page.warning)) and "62%" in texts(run_page.warning)

    at = page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(at)
    warnings = unescape_md(texts(at.warning))
    assert "busy machine" in warnings and "Too noisy to calibrate to" in warnings
    runs = next(d.value for d in at.dataframe if "per-prompt spread" in d.value.columns)
    row = runs[runs["kind"] == "speculative"].iloc[0]
    assert row["per-prompt spread"] == "0.90–2.10× (median 1.60×)" and row["verdict"] == "too noisy to tell"
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert any('"errorbar"' in s for s in specs), "the measured speedup has its spread as an error bar"


def test_running_session_on_a_busy_machine_warns_live(env) -> None:  # noqa: F811
    sid = make_session(env.store, "running", name="busy now")
    env.store.add_utilisation_samples(
        sid, [{"t": time.time(), "source": "cpu", "metrics": {"cpu_util_pct": 99.0, "other_cpu_pct": 80.0}}]
    )
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    assert "other processes are using 80%" in unescape_md(texts(at.warning))


def test_run_form_samples_by_category_by_default_when_the_set_has_categories(env) -> None:  # noqa: F811
    set_id = add_prompts(env.store, [(f"c{i}", "code") for i in range(4)] + [("p1", "prose"), ("m1", "math")])
    at = page("pages/2_Run.py")
    assert at.checkbox(key="stratified").value is True and not at.checkbox(key="stratified").disabled
    at.text_input(key="target_text").input("tiny:1:48:2:64")
    at.multiselect(key="drafts_choice").set_value([])
    at.text_input(key="drafts_text").input(DRAFT)
    at.number_input(key="n_prompts").set_value(3)
    at.button(key="start_session").click()
    at.run()
    assert_clean(at)
    session = env.store.list_sessions()[0]
    assert session["options"]["prompt_sample"] == "stratified" and session["prompt_set_id"] == set_id
    from engine.session.sampling import session_prompts

    chosen = session_prompts(env.store.get_prompts, session)
    assert sorted(p["category"] for p in chosen) == ["code", "math", "prose"]
    captions = unescape_md(texts(at.caption))
    assert "v(k): cost unknown until a session with this target has run here" in captions


def test_a_set_without_categories_keeps_the_first_prompts(env) -> None:  # noqa: F811
    add_prompts(env.store, [("p1", None), ("p2", None)])
    at = page("pages/2_Run.py")
    assert at.checkbox(key="stratified").value is False and at.checkbox(key="stratified").disabled


def test_measurement_costs_come_from_the_last_session_with_this_target() -> None:
    sessions = [
        {"id": 3, "status": "done", "target": "other", "dtype": "float32", "summary": {"phase_times_s": {}}},
        {"id": 2, "status": "done", "target": "t", "dtype": "float32",
         "summary": {"phase_times_s": {"measuring v(k)": 12.0, "batch sweep": 150.0}, "baseline_tokens_per_s": 10}},
    ]  # fmt: skip
    costs = rv.measurement_costs(sessions, "t", "float32", 4, 1)
    assert costs == {"verify": 12.0, "regime": 150.0, "source": "session #2"}
    assert rv.cost_caption(costs["regime"], costs["source"]) == "about 2 min on this machine (from session #2)"
    sessions[1]["summary"] = {"baseline_tokens_per_s": 10.0}  # an older session: estimated from its step time
    estimated = rv.measurement_costs(sessions, "t", "float32", 4, 1)
    assert estimated["verify"] > 0 and estimated["regime"] > estimated["verify"]
    assert rv.measurement_costs(sessions, "t", "bfloat16", 4, 1)["regime"] is None


def test_steps_of_another_session_are_not_counted(env) -> None:  # noqa: F811
    mine = make_session(env.store, "running", name="mine")
    other = make_session(env.store, "running", name="other")
    cache = rv.LiveCache(mine)
    before = {k: dict(v) for k, v in (cache.refresh(env.store, now=0.0) and cache.totals).items()}
    run = next(r for r in env.store.list_runs(other) if r["kind"] == "speculative")
    with env.store.step_writer(run["id"]) as w:
        w.add(StepRecord(0, 50, 2, 1, [True, False], [0.9, 0.1], 0.002, 0.01, 2, 2), t=time.time())
    cache.refresh(env.store, now=1.0)
    assert cache.totals == before
    assert env.store.live_version(mine)["steps"] == sum(t["steps"] for t in before.values())
