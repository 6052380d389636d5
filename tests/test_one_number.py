"""One number per run, judged where it is shown (streamlit.testing.v1.AppTest and the report, on sessions written
straight through the store API with fixed figures: nothing here depends on timing).

1. A run's speedup is its whole-run figure on every page, in the report and in History (the figure its bound
   check judges); the per-prompt median lives only inside the spread, and a prompt above its own bound is
   flagged there.
2. A measured run of the recommended configuration is shown beside the Recommend headline and bounds it: when the
   prediction disagrees with it beyond the noise, the headline says so and shows the measurement.
3. The Run page's predicted figures are the stored ones the Sessions page shows, and it says "off" where the
   Recommend page does.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.session.summarise import stored_speedup_flag
from tests.test_app_pages import add_prompts, assert_clean, env, page, texts, unescape_md  # noqa: F401 - env: fixture

TARGET = "tiny:1:48:2:64"
PROMPTS = [("def add(a, b):", "code"), ("Fix the spelling: teh cat", "spelling"), ("a | b\n1 | 2", "table"),
           ("Summarise: the cat sat.", "summary")]  # fmt: skip
RATES = [0.6, 0.5, 0.3, 0.2]  # n-gram's conditional acceptance per draft position
VERIFY = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.3, 5: 1.6}  # a k-token verify costs more as k grows: γ=2 predicts best


def spread(low: float, median: float, high: float, verdict: str, n: int = 4) -> dict[str, Any]:
    return {"median": median, "min": low, "max": high, "n": n, "verdict": verdict}


def run_figures(gamma: int, whole: float, median: float, band: dict, tokens_per_call: float, **extra: Any) -> dict:
    """A speculative n-gram run as the sweep stores it: the per-prompt median in the column and the spread, the
    whole run's speedup in the summary, and the flag its bound check decided from them."""
    figures = {"draft": "ngram", "gamma": gamma, "tokens_per_s": 10.0 * whole, "tokens_per_call": tokens_per_call,
               "speedup_measured": median, "speedup_predicted": extra.pop("predicted", 1.2), "alpha": 0.5, "c": 0.0,
               "per_position_acceptance": RATES[:gamma], "verify_cost": VERIFY}  # fmt: skip
    summary = {**figures, "speedup_whole_run": whole, "speedup_spread": band, "steps": 100, "draft_calls": 0,
               "kind": "speculative", **extra}  # fmt: skip
    summary["speedup_flag"] = stored_speedup_flag(summary)
    return summary


def store_session(store, runs: list[dict], *, options: dict | None = None, summary: dict | None = None) -> int:
    """A finished session: the target alone at 10 tokens/s, then each run; the session summary lists the runs as
    the worker keeps them (History reads its best speedup from there)."""
    set_id = add_prompts(store, PROMPTS, name="hold-out")
    sid = store.create_session(
        name="hold-out", target=TARGET, drafts=["ngram"], gammas=sorted({r["gamma"] for r in runs}),
        temperatures=[0.0], max_new_tokens=32, prompt_set_id=set_id, n_prompts=len(PROMPTS), options=options or {},
    )  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {"kind": "baseline"}, tokens_per_s=10.0, tokens_per_call=1.0, speedup_measured=1.0)
    columns = ("tokens_per_s", "tokens_per_call", "speedup_measured", "speedup_predicted", "alpha", "c",
               "per_position_acceptance", "verify_cost")  # fmt: skip
    for r in runs:
        run = store.create_run(sid, "ngram", r["gamma"], 0.0, "speculative")
        store.finish_run(run, r, **{k: r[k] for k in columns}, baseline_tokens_per_s=10.0)
    kept = {"runs": [{k: v for k, v in r.items() if k != "verify_cost"} for r in runs],
            "verify_cost": {str(k): v for k, v in VERIFY.items()}, **(summary or {})}  # fmt: skip
    store.finish_session(sid, "done", summary=kept)
    return sid


# ---------------------------------------------------------------------------------------------------------------------
# 1. the number shown is the number judged


def session_two(store) -> int:
    """The issue's session #2: n-gram γ=4 at 1.53 tokens per call, 1.54× per-prompt median, 1.45× over the whole
    run (too noisy to tell); γ=2 clear at 1.20× (1.22× median)."""
    four = run_figures(4, 1.45, 1.54, spread(1.02, 1.54, 1.80, "too noisy to tell"), 1.53)
    two = run_figures(2, 1.20, 1.22, spread(1.12, 1.22, 1.30, "faster"), 1.40)
    return store_session(store, [two, four])


def test_the_sessions_page_shows_the_whole_run_speedup_and_keeps_the_median_in_the_spread(env) -> None:  # noqa: F811
    sid = session_two(env.store)
    at = page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(at)
    frames = [d.value for d in at.dataframe]
    runs = next(f for f in frames if "speedup measured" in f.columns and "kind" in f.columns)
    four = runs[runs["γ"] == 4].iloc[0]
    assert four["speedup measured"] == pytest.approx(1.45)  # never the 1.54× median
    assert four["per-prompt spread"] == "1.02–1.80× (median 1.54×)"
    history = next(f for f in frames if "best speedup" in f.columns)
    assert history["best speedup"].iloc[0] == "1.20×"  # the clear best, by its whole run


def test_the_report_and_the_recommend_comparison_show_the_whole_run_speedup(env) -> None:  # noqa: F811
    from engine.service.decide.evidence import recommend_from_store
    from engine.service.report.document import session_report_html as session_report

    sid = session_two(env.store)
    report = session_report(env.store, sid)
    assert '<td class="num">1.45×</td>' in report and '<td class="num">1.54×</td>' not in report
    assert "1.02–1.80× (median 1.54×)" in report
    _, ev, _ = recommend_from_store(env.store, [sid])
    assert ev.measurements[0].measured_speedup == {2: pytest.approx(1.20), 4: pytest.approx(1.45)}
    assert ev.measurements[0].measured_band[4] == (1.02, 1.80)


def test_a_prompt_above_its_own_bound_is_flagged_in_the_spread(env) -> None:  # noqa: F811
    """Session #3: n-gram γ=2 at 1.00 tokens per call, one prompt at 2.61×: no prompt can beat the target alone by
    more than its own tokens per call ÷ (v_min + the draft's share), here 1.00."""
    above = [{"prompt": 3, "speedup": 2.61, "bound": 1.0}]
    two = run_figures(2, 0.95, 0.92, spread(0.61, 0.92, 2.61, "too noisy to tell"), 1.0, speedup_above_bound=above)
    sid = store_session(env.store, [two])
    at = page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(at)
    runs = next(d.value for d in at.dataframe if "per-prompt spread" in d.value.columns)
    assert runs["per-prompt spread"].iloc[1] == ("0.61–2.61× (median 0.92×) ⚠ prompt 3 above its bound "
                                                 "(2.61× > 1.00×): impossible")  # fmt: skip
    from engine.service.report.document import session_report_html as session_report

    report = session_report(env.store, sid)
    assert "prompt 3 above its bound" in report and "⚠ flagged" in report


def test_the_sweep_finds_the_prompts_above_their_bound_from_each_prompts_own_calls() -> None:
    from engine.core.counters import SpecCounters
    from engine.session.runner import RunKey
    from engine.session.summarise import RunTally, summarise

    base = RunTally(RunKey("none", 0, 0.0), None, decoded={0: (32, 10.0), 1: (32, 10.0), 2: (32, 10.0)})
    calls = {0: (32.0, 32.0), 1: (32.0, 16.0), 2: (32.0, 32.0)}  # prompt 2 delivered 2 tokens per call
    tally = RunTally(RunKey("ngram", 2, 0.0), None, decoded={0: (32, 10.0), 1: (32, 6.25), 2: (32, 7.7)},
                     calls=calls, tokens=96, decode_s=23.95,
                     counters=SpecCounters(drafts=16, draft_tokens=32, accepted_tokens=16, target_calls=80,
                                           emitted=96))  # fmt: skip
    summary = summarise(tally, base, 0.0, {}, "spectune")
    # per prompt: 1.00× at 1.00 tokens per call and 1.60× at 2.00 stand; 1.30× at 1.00 cannot happen
    assert summary.speedup_above_bound == [{"prompt": 3, "speedup": pytest.approx(1.2987, abs=1e-4), "bound": 1.0}]
    assert summary.speedup_flag is None  # the whole run, 1.25× at 1.20 tokens per call, stands
    assert summary.speedup_whole_run == pytest.approx(1.2526, abs=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# 2. a measured run of the recommended configuration bounds the headline


def test_the_headline_prefers_a_measured_run_of_its_configuration_that_disagrees_beyond_the_noise(env) -> None:  # noqa: F811
    """Session #3: the one model predicts n-gram γ=2 far above what a live run of exactly that configuration
    measured (0.80×, too noisy to tell): the headline shows the measurement, says the two disagree, and asks for a
    confirmation; the prediction is still named."""
    noisy = spread(0.60, 0.82, 0.95, "too noisy to tell")
    sid = store_session(env.store, [run_figures(g, 0.80, 0.82, noisy, 1.3) for g in (1, 2, 4)])
    at = page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    banner = unescape_md(texts(at.success))
    assert "**ngram** with **γ = 2**: measured **0.80×** (predicted 1.73×: they disagree beyond the noise)" in banner
    metrics = {m.label: m.value for m in at.metric}
    assert metrics.get("Measured speedup") == "0.80×" and "Predicted speedup" not in metrics
    beside = unescape_md(texts(at.warning))
    assert "measured 0.80× on this very configuration over the whole run (prompts 0.60–0.95×" in beside
    assert "confirm it with another run before deploying" in beside


def test_a_measured_run_that_agrees_is_shown_beside_the_prediction(env) -> None:  # noqa: F811
    clear = spread(1.55, 1.70, 1.85, "faster")
    sid = store_session(env.store, [run_figures(g, 1.70, 1.71, clear, 1.9) for g in (1, 2, 4)])
    at = page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    assert "predicted **1.73×** faster" in unescape_md(texts(at.success))
    assert {m.label: m.value for m in at.metric}["Predicted speedup"] == "1.73×"
    assert "the prediction 1.73× lies within its noise" in unescape_md(texts(at.info))


def test_the_noise_band_takes_in_a_whole_run_figure_outside_its_prompts_ratios() -> None:
    """Prompts that decode different numbers of tokens weigh by their time in the whole run, so its figure can lie
    outside every prompt's ratio: the band is judged around both, and a prediction beside the whole run agrees."""
    from engine.analysis.calibrate import measured_check
    from engine.analysis.recommend_types import DraftMeasurement

    def check(whole: float) -> Any:
        m = DraftMeasurement("ngram", "ngram", None, 0.6, RATES[:1], 0.0, measured_speedup={1: whole},
                             measured_band={1: (0.83, 0.93)})  # fmt: skip
        return measured_check(m, 1, 1, 1.02)

    beside = check(0.98)
    assert (beside.low, beside.high) == (0.83, 0.98) and not beside.disagrees
    assert "the prediction 1.02× lies within its noise" in beside.words()
    below = check(0.88)
    assert (below.low, below.high) == (0.83, 0.93) and below.disagrees and below.headline == 0.88
    assert "lies above it beyond the noise" in below.words()


def test_the_report_and_the_cli_say_the_measurement_too(env, capsys) -> None:  # noqa: F811
    from engine.service.cli.recommend import print_recommendation
    from engine.service.decide.recommendations import recommend_and_export
    from engine.service.report.document import session_report_html

    noisy = spread(0.60, 0.82, 0.95, "too noisy to tell")
    sid = store_session(env.store, [run_figures(g, 0.80, 0.82, noisy, 1.3) for g in (1, 2, 4)])
    report = session_report_html(env.store, sid)
    assert "measured 0.80× (predicted 1.73×: they disagree beyond the noise)" in report
    assert "Measured speedup" in report
    print_recommendation(recommend_and_export(env.store, [sid], formats=()))
    out = capsys.readouterr().out
    assert "with γ=2: 0.80× measured" in out and "measured: ngram γ=2: measured 0.80× on this very" in out


# ---------------------------------------------------------------------------------------------------------------------
# 3. the Run page predicts what the others say


def test_the_run_page_takes_its_figures_from_the_stored_runs_and_says_off_as_recommend_does(env) -> None:  # noqa: F811
    """Session #2: the quick session chose n-gram γ=1 on a probe's prediction of 1.26×; its stored run predicts
    1.01× (the Sessions page's figure) and measured 0.90×, clearly slower, so the Recommend page says off."""
    slower = run_figures(1, 0.90, 0.91, spread(0.88, 0.91, 0.93, "slower"), 1.05, predicted=1.01)
    confirmed = {"role": "best fixed γ", "configuration": "ngram γ=1 T=0", "draft": "ngram", "gamma": 1,
                 "policy": None, "temperature": 0.0, "predicted_speedup": 1.26, "measured_speedup": 0.91,
                 "measured_whole_run": 0.90, "measured_over_predicted": 0.90 / 1.26, "noisy": False}  # fmt: skip
    quick = {"probe": ["baseline T=0", "ngram γ=4 T=0"], "confirmed": [confirmed], "off": {"0.0": False},
             "notes": [], "probe_s": 60.0, "time_to_confirmed_s": 150.0}  # fmt: skip
    sid = store_session(env.store, [slower], options={"mode": "quick"}, summary={"quick": quick})
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    shown = unescape_md(texts(at.caption))
    assert "Decision: Speculation off at T=0: serve the target alone" in shown
    assert (
        "Speculation OFF; best candidate, not recommended: ngram γ=1 T=0 — predicted 1.01×, measured 0.90× over "
        "the whole run (0.88–0.93× (median 0.91×))."
    ) in shown
    assert "1.26" not in shown
    sessions = page("pages/3_Sessions.py", {"session": str(sid)})
    runs = next(d.value for d in sessions.dataframe if "speedup predicted" in d.value.columns and "kind" in
                d.value.columns)  # fmt: skip
    assert runs[runs["γ"] == 1].iloc[0]["speedup predicted"] == pytest.approx(1.01)
    recommend = page("pages/5_Recommend.py", {"session": str(sid)})
    assert "Speculation OFF" in unescape_md(texts(recommend.warning))


# ---------------------------------------------------------------------------------------------------------------------
# 7. a cancelled session is no error, and shows no figure its runs table does not


def cancelled_session(store) -> int:
    """Cancelled while its speculative run decoded: the target alone finished, the speculative run did not (its
    outputs are stored, its figures never summarised)."""
    from tests.test_app_pages import make_session

    sid = make_session(store, "running", name="cancelled")
    store.close_open_runs(sid, "cancelled", "cancelled by the user")
    store.finish_session(sid, "cancelled", error="cancelled by the user")
    return sid


def test_a_cancelled_sessions_categories_show_no_figure_its_runs_table_lacks(env) -> None:  # noqa: F811
    sid = cancelled_session(env.store)
    at = page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(at)
    frames = [d.value for d in at.dataframe]
    runs = next(f for f in frames if "speedup measured" in f.columns and "kind" in f.columns)
    assert runs[runs["kind"] == "speculative"]["speedup measured"].isna().all()
    assert not [f for f in frames if "category" in f.columns and "speedup" in f.columns]  # no "By category" figures
    captions = unescape_md(texts(at.caption))
    assert "No figures by category for runs that did not finish" in captions
    history = next(f for f in frames if "best speedup" in f.columns)
    assert history[history["id"] == sid].iloc[0]["error"] == ""  # cancelled by the user: no error
    assert "Cancelled by the user." in texts(at.info)


def test_a_cancelled_sessions_report_does_not_call_it_an_error(env) -> None:  # noqa: F811
    from engine.service.report.document import session_report_html

    report = session_report_html(env.store, cancelled_session(env.store))
    assert "ended with an error" not in report
    assert '<div class="info">The session was stopped before it finished. Cancelled by the user.' in report


# ---------------------------------------------------------------------------------------------------------------------
# 10. wording


def test_a_noisy_verdict_is_said_once() -> None:
    from app.data import noisy_verdict
    from engine.service.decide.policies import live_flag

    figures = {"speedup": 1.2, "tokens_per_call": 1.5, "speedup_flag": None,
               "speedup_spread": spread(0.7, 1.2, 1.9, "too noisy to tell")}  # fmt: skip
    flag = live_flag(figures, 4, 0.0)
    assert flag == "too noisy to tell (per-prompt ratios 0.70–1.90×): not calibrated to"
    one = live_flag({**figures, "speedup_spread": spread(1.2, 1.2, 1.2, "single measurement", n=1)}, 4, 0.0)
    assert one == "too noisy to tell (one prompt): not calibrated to"
    assert noisy_verdict("too noisy to tell", True) == "too noisy to tell"
    assert noisy_verdict("faster", True) == "faster (noisy)" and noisy_verdict("slower", False) == "slower"


def test_the_report_gives_times_to_the_minute(env) -> None:  # noqa: F811
    import re

    from engine.service.report.document import session_report_html

    report = session_report_html(env.store, session_two(env.store))
    stamps = re.findall(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}[^<]*", report)
    assert stamps and not [s for s in stamps if re.search(r":\d{2}:\d{2}|\.\d{3,}", s)], stamps


def test_previous_recommendations_name_every_number(env) -> None:  # noqa: F811
    from engine.service.decide.recommendations import recommend_and_export

    noisy = spread(0.60, 0.82, 0.95, "too noisy to tell")
    sid = store_session(env.store, [run_figures(g, 0.80, 0.82, noisy, 1.3) for g in (1, 2, 4)])
    recommend_and_export(env.store, [sid], save=True)
    at = page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    history = next(d.value for d in at.dataframe if "decision" in d.value.columns and "sessions" in d.value.columns)
    row = history.iloc[0]
    assert row["id"] == "#1" and row["sessions"] == f"#{sid}" and row["serving batch"] == 1
    assert row["speedup"] == pytest.approx(0.80) and row["speedup is"] == "measured"  # what the headline said


# ---------------------------------------------------------------------------------------------------------------------
# 9. the Run form


def test_the_run_form_offers_only_drafts_the_engine_runs_and_no_larger_than_the_target(env) -> None:  # noqa: F811
    from app import run_view as rv

    assert "suffix" not in rv.draft_options("qwen2.5-coder-1.5b", "llama.cpp")  # refused after Start before
    assert "suffix" in rv.draft_options("qwen2.5-coder-1.5b", "spectune")
    assert rv.draft_options("smollm2-135m", "spectune") == ["ngram", "suffix"]  # no 0.5B or 1.5B drafting a 135M
    at = page("pages/2_Run.py")
    at.selectbox(key="target_choice").set_value("smollm2-135m")
    at.run()
    assert_clean(at)
    drafts = at.multiselect(key="drafts_choice")
    assert "qwen2.5-coder-0.5b" not in drafts.options and "qwen2.5-coder-0.5b" not in drafts.value


def test_enter_never_starts_a_session_and_quick_mode_shows_no_full_grid_checkbox(env) -> None:  # noqa: F811
    from app import run_view as rv

    add_prompts(env.store, PROMPTS, name="form")
    at = page("pages/2_Run.py")
    assert_clean(at)
    assert [f.proto.form.enter_to_submit for f in at.get("form")] == [False]
    labels = [c.label for c in at.checkbox]
    assert at.radio(key="mode").value == "quick" and rv.CONFIRM_LABEL not in labels
    at.radio(key="mode").set_value("full")
    at.run()
    assert at.checkbox(key="confirm").value is True  # the full grid's own choice, shown only there


def test_the_regime_switch_is_off_and_says_why_for_an_engine_that_runs_no_batch_sweep(env) -> None:  # noqa: F811
    from app import run_view as rv

    add_prompts(env.store, PROMPTS, name="form")
    at = page("pages/2_Run.py")
    at.radio(key="engine").set_value("spectune").run()  # without a GPU, llama.cpp may be the default
    assert at.checkbox(key="detect_regime").value is True  # the PyTorch loop runs it
    at.radio(key="engine").set_value("llama.cpp")
    at.run()
    assert_clean(at)
    switch = at.checkbox(key="detect_regime_off")
    assert switch.value is False and switch.disabled
    note = rv.no_regime_note("llama.cpp")
    assert "runs no batch sweep" in note and note in unescape_md(texts(at.caption))
    form = rv.RunForm.from_state(at.session_state)
    assert form.detect_regime and rv.session_spec(form)[0].detect_regime is False  # what is stored is what runs


def test_the_run_form_is_as_the_user_left_it_after_another_page(env) -> None:  # noqa: F811
    from app import run_view as rv

    add_prompts(env.store, PROMPTS, name="form")
    at = page("pages/2_Run.py")
    at.text_input(key="target_text").input("tiny:1:48:2:64")
    at.radio(key="mode").set_value("full")
    at.run()
    at.text_input(key="gammas_text").input("3,5")
    at.number_input(key="max_new").set_value(40)
    at.text_input(key="session_name").input("kept")
    at.button(key="estimate_session").click()  # the form's fields reach the server when one of its buttons is pressed
    at.run()
    for other in ("pages/3_Sessions.py", "Home.py"):  # a page with widgets of its own, then one without
        at.switch_page(other)
        at.run()
        assert_clean(at)
    at.switch_page("pages/2_Run.py")
    at.run()
    assert_clean(at)
    kept = {key: at.session_state[key] for key in ("target_text", "mode", "gammas_text", "max_new", "session_name")}
    assert kept == {"target_text": "tiny:1:48:2:64", "mode": "full", "gammas_text": "3,5", "max_new": 40,
                    "session_name": "kept"}  # fmt: skip
    assert at.text_input(key="gammas_text").value == "3,5" and at.number_input(key="max_new").value == 40
    # every input of the form is kept (a new one forgotten in FORM_KEYS fails here)
    inputs = {w.key for kind in ("text_input", "number_input", "selectbox", "multiselect", "checkbox", "radio")
              for w in at.get(kind) if w.key and not w.key.startswith("cancel_")}  # fmt: skip
    assert inputs <= set(rv.FORM_KEYS), sorted(inputs - set(rv.FORM_KEYS))


def test_a_quick_sessions_unchosen_gamma_is_explained() -> None:
    """A quick session chose γ 2 and 4 and confirmed γ=1: the Run page says why γ=1 ran at all."""
    from app.run_view import unchosen_gamma_lines

    confirmed = {"role": "best fixed γ", "configuration": "ngram γ=1 T=0", "draft": "ngram", "gamma": 1,
                 "policy": None, "temperature": 0.0, "predicted_speedup": 1.26}  # fmt: skip
    quick = {"confirmed": [confirmed], "off": {}, "notes": []}
    assert unchosen_gamma_lines({"gammas": [2, 4]}, quick) == [
        "Why γ=1: it was not among the γs chosen (2, 4); a quick session predicts every γ from its probe and runs "
        "the one it recommends live, so γ=1 was measured to confirm it."
    ]
    assert unchosen_gamma_lines({"gammas": [1, 2]}, quick) == []


def test_a_rule_at_the_right_end_of_a_chart_writes_its_label_to_its_left() -> None:
    """'knee: batch 64' at the last batch of the sweep ran under the legend: written to the rule's left there."""
    import pandas as pd

    from app import charts

    frame = pd.DataFrame({"batch": [1, 2, 4, 8, 16, 32, 64] * 2, "quantity": ["step time"] * 7 + ["per row"] * 7,
                          "ms": [1.0] * 14})  # fmt: skip

    def label_align(knee: int) -> str:
        layers = charts.batch_sweep(frame, knee, 1).to_dict()["layer"]
        marks = [layer["mark"] for layer in layers if isinstance(layer["mark"], dict)]
        (text,) = [mark for mark in marks if mark["type"] == "text"]
        return text["align"]

    assert label_align(64) == "right" and label_align(40) == "right"
    assert label_align(8) == "left"
