"""The Recommend page under streamlit.testing.v1.AppTest, on sessions stored with the seed's T5 numbers.

Sessions are written straight through the store API (no worker, no model); the page must pick the
draft the chapter picks (T5-small: the best balance of α and c, not the best α), mark the
recommended γ and the crossover, export every format, turn speculation off where the extra
arithmetic is billed, and refuse unusable sessions with one clear error.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.analysis.export import format_names
from engine.analysis.regime import classify_batch_sweep
from foundation.paths import default_database_url
from store import open_store
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean, texts, unescape_md
from tests.test_app_pages import page as app_page

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "app" / "Home.py"
PAGE = "pages/5_Recommend.py"
XSS = "<script>alert(1)</script>"

# a decode-step sweep that is flat to batch 8 and linear from 16 on: knee at 16
# v(k) nearly free, as the paper measured its speedups (with v(8) = 1.2 its 3.4× at γ=7 beats the model even with
# a free draft: flagged, not calibrated to)
T5_VERIFY = {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.04}
SWEEP = ([1, 2, 4, 8, 16, 32, 64], [0.010, 0.0102, 0.0105, 0.011, 0.018, 0.034, 0.068])


def sweep_regime(serving_batch: int = 1) -> dict:
    cls = classify_batch_sweep(*SWEEP, serving_batch)
    return {
        "label": cls.label,
        "serving_batch": serving_batch,
        "evidence": [f"batch sweep: {e}" for e in cls.evidence],
        "votes": {"batch sweep": cls.label},
        "batch_sweep": {"batch_sizes": SWEEP[0], "step_times_s": SWEEP[1]},
        "batch_classification": asdict(cls),
    }


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    store = open_store(default_database_url())
    yield SimpleNamespace(store=store, home=tmp_path)
    store.close()


def page(query: dict | None = None) -> AppTest:
    return app_page(PAGE, query)


def expected(store, ids, objective="latency", budget=None, batch=1, price=None, regime=None):
    from engine.service.decide.evidence import recommend_from_store

    rec, _, _ = recommend_from_store(store, ids, objective, budget, batch, price, regime)
    return rec


def frame_with(at: AppTest, column: str):
    return next(d for d in at.dataframe if column in d.value.columns)


def chart_texts(at: AppTest) -> list[str]:
    """Each Altair chart's spec plus its datasets as text (the page's frames travel apart from the spec)."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df

    out = []
    for chart in at.get("vega_lite_chart"):
        frames = [convert_arrow_bytes_to_pandas_df(d.data.data).to_csv() for d in chart.proto.datasets]
        out.append(chart.proto.spec + "\n" + "\n".join(frames))
    return out


def codes(at: AppTest) -> dict[str, str]:
    """Export previews by format, in format_names() order (one st.code per format)."""
    assert len(at.code) == len(format_names()), [c.value[:40] for c in at.code]
    return dict(zip(format_names(), (c.value for c in at.code), strict=True))


# ---------------------------------------------------------------------------------------------------------------------
# empty states


def test_empty_database_points_to_the_run_page(env):
    at = page()
    assert_clean(at)
    assert at.title and not at.error
    assert "No finished sessions yet" in texts(at.info) and "Run page" in texts(at.info)
    assert len(at.get("page_link")) == 1


def test_only_unfinished_sessions_is_the_same_friendly_message(env):
    set_id, _, _ = env.store.add_prompt_set("x", "x.txt", [{"text": "a"}])
    env.store.create_session(target="t", drafts=["d"], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                             prompt_set_id=set_id)  # fmt: skip
    at = page()
    assert_clean(at)
    assert not at.error
    assert "none of them done" in texts(at.info)


# ---------------------------------------------------------------------------------------------------------------------
# the T5 sessions: decision, regime, crossover, comparison, schedule, exports


def test_t5_sessions_recommend_t5_small_with_everything_shown(env):
    sid = store_session(env.store, T5, regime=sweep_regime(), verify_cost=T5_VERIFY)
    rec = expected(env.store, [sid])
    at = page()
    assert_clean(at)
    assert not at.error, texts(at.error)
    assert at.multiselect(key="rec_sessions").value == [sid]

    # the decision in one line, and its sentence
    decision = unescape_md(texts(at.success))
    assert "t5-small" in decision and f"γ = {rec.gamma}" in decision and f"{rec.predicted_speedup:.2f}×" in decision
    assert f"{rec.cost_change * 100:+.0f}%" in decision and f"{rec.ops_multiplier:.2f}×" in decision
    assert "t5-large has the best α" in unescape_md(texts(at.markdown))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Draft"] == "t5-small" and metrics["γ"] == str(rec.gamma)

    # the regime with its evidence: judged at the chosen batch, the sweep chart with the knee, v(k), the NVML note
    assert "Regime: memory-bound" in [h.value for h in at.subheader]
    evidence = unescape_md(texts(at.markdown))
    assert "knee at batch 16" in evidence
    # a verify step processes batch × (γ+1) token rows: that width, not the batch, is compared with the knee
    width = rec.gamma + 1
    assert f"serving batch 1 × {width} tokens per verify step (γ+1) = {width} token rows, below the knee 16" in evidence
    assert "v(8) = 1.04" in evidence
    assert "NVML" in texts(at.info)
    specs = chart_texts(at)
    assert any("knee: batch 16" in s for s in specs)  # the batch sweep, knee marked
    assert any("billed: v = k" in s for s in specs)  # the verify curve
    curve_chart = next(s for s in specs if "recommended γ=" in s)
    assert f"recommended γ={rec.gamma}" in curve_chart and '"diamond"' in curve_chart  # measured points overlaid

    # the crossover table: γ = 1..32, recommended γ highlighted, crossover marked
    table = frame_with(at, "mark").value
    assert list(table["γ"]) == list(range(1, 33))
    marks = dict(zip(table["γ"], table["mark"], strict=True))
    assert marks[rec.gamma] == "◀ recommended"
    cross = rec.crossover["t5-small"]
    assert cross is not None and "crossover" in marks[cross]
    assert table.loc[table["γ"] == 7, "measured speedup"].iloc[0] == pytest.approx(3.4)
    styles = frame_with(at, "mark").proto.arrow_data.styler.styles
    assert f"_row{rec.gamma - 1}_col0" in styles and "background-color" in styles
    # one predicted speedup per γ: the seed's single-α Theorem 3.8 is one labelled line below, not a column
    assert [c for c in table.columns if "speedup" in c] == ["predicted speedup", "measured speedup"]
    chosen = next(p for p in rec.curve if p.gamma == rec.gamma)
    reference = [c for c in texts(at.caption).split("\n") if "Theorem 3.8" in c]
    assert len(reference) == 1 and reference[0].startswith("Reference, not a prediction")
    assert f"gives {chosen.speedup_one_alpha:.2f}× at γ = {rec.gamma}" in unescape_md(reference[0])

    # the draft comparison in the seed's T5 shape
    comparison = frame_with(at, "best γ").value.set_index("draft")
    assert {"α", "c", "best γ", "predicted speedup", "measured speedup"} <= set(comparison.columns)
    assert comparison.loc["t5-large", "α"] > comparison.loc["t5-small", "α"]
    assert comparison.loc["t5-small", "measured speedup"] == pytest.approx(3.4)
    assert comparison.loc["t5-small", "decision"] == "◀ recommended"
    assert comparison.loc["t5-small", "predicted speedup"] > comparison.loc["t5-large", "predicted speedup"]

    # the γ-by-batch schedule: the same objective at every batch; compute-bound caps γ below the crossover, not off
    schedule = frame_with(at, "batch size").value.set_index("batch size")
    assert schedule.loc[1, "γ"] == str(rec.schedule[1]) == str(rec.gamma)
    assert schedule.loc[64, "γ"] == str(rec.schedule[64]) != "off" and rec.schedule[64] < cross
    assert schedule.loc[16, "note"] == "knee"

    # every export format: a download button and a preview
    buttons = [b for b in at.get("download_button") if b.proto.label != "⬇ Report (one HTML file)"]
    assert len(buttons) == len(format_names())
    assert {b.proto.help for b in buttons} == {
        "vllm-speculative-config.json", "sglang-flags.txt", "transformers-generate-kwargs.json",
        "llama-server-flags.txt", "spectune-recommendation.json",
    }  # fmt: skip
    code = codes(at)
    doc = json.loads(code["vllm"])
    vllm = doc["speculative_config"] if "speculative_config" in doc else doc
    assert vllm["model"] == "t5-small" and vllm["num_speculative_tokens"] == rec.gamma
    # the schedule is the headline γ at every batch here, so no per-batch ranges are exported
    assert set(rec.schedule.values()) == {rec.gamma} and "num_speculative_tokens_per_batch_size" not in vllm
    assert "--speculative-draft-model-path t5-small" in code["sglang"]
    tf = json.loads(code["transformers"])
    assert (tf.get("assistant_generation_config") or tf["generate_kwargs"])["num_assistant_tokens"] == rec.gamma
    assert f"--draft-max {rec.gamma}" in code["llamacpp"] or f"--spec-draft-n-max {rec.gamma}" in code["llamacpp"]
    own = json.loads(code["spectune"])
    assert own["recommendation"]["gamma"] == rec.gamma and own["evidence"]["regime"]["label"] == "memory-bound"
    assert any("judged at batch 1" in line for line in own["evidence"]["regime"]["evidence"])
    assert "None saved yet" in texts(at.caption)


def test_save_to_history_stores_the_recommendation_and_every_file_once(env):
    sid = store_session(env.store, T5)
    at = page()
    code = codes(at)
    at.button(key="rec_save").click()
    at.run()
    assert_clean(at)
    assert "in the history" in unescape_md(texts(at.success))
    recs = env.store.list_recommendations()
    assert len(recs) == 1 and recs[0]["session_ids"] == [sid] and recs[0]["objective"] == "latency"
    payload = recs[0]["payload"]
    assert payload["draft"] == "t5-small" and payload["inputs"]["batch_size"] == 1
    assert payload["record"]["format"] == "spectune.recommendation/1"
    exports = env.store.list_exports(recs[0]["id"])
    assert [e["format"] for e in exports] == list(format_names())
    assert {e["format"]: e["content"].rstrip("\n") for e in exports} == {k: v.rstrip("\n") for k, v in code.items()}
    history = frame_with(at, "explanation").value
    assert list(history["id"]) == [f"#{recs[0]['id']}"] and "t5-small" in history["decision"].iloc[0]
    # current exports, the saved ones again, the report
    assert len(at.get("download_button")) == 2 * len(format_names()) + 1
    at.button(key="rec_save").click()
    at.run()
    assert len(env.store.list_recommendations()) == 1  # the same result is not stored twice
    assert "already saved" in unescape_md(texts(at.success))


# ---------------------------------------------------------------------------------------------------------------------
# regime and objective: speculation off where the arithmetic is billed


def test_compute_bound_override_with_cost_objective_turns_speculation_off(env):
    store_session(env.store, T5)
    at = page()
    at.radio(key="rec_objective").set_value("cost")
    at.selectbox(key="rec_regime").set_value("compute-bound")
    at.run()
    assert_clean(at)
    assert not at.error, texts(at.error)
    assert "Speculation OFF" in texts(at.warning)
    assert "compute-bound" in unescape_md(texts(at.markdown))
    assert {m.label: m.value for m in at.metric}["γ"] == "0 (off)"
    assert "Regime: compute-bound" in [h.value for h in at.subheader]
    assert "set by hand to compute-bound" in unescape_md(texts(at.markdown))
    code = codes(at)
    assert json.loads(code["vllm"])["speculative_config"] is None
    assert json.loads(code["spectune"])["speculation"] == "off"
    marks = frame_with(at, "mark").value["mark"]
    assert not any("◀" in m for m in marks)  # off is off: no γ marked recommended or best in the crossover table
    shown = unescape_md(texts(at.markdown))
    assert "speculation off: no γ pays" in shown and "best γ = " not in shown and "recommended γ = " not in shown


def test_batch_past_the_knee_is_compute_bound_from_the_stored_sweep(env):
    store_session(env.store, T5, regime=sweep_regime())
    at = page()
    at.radio(key="rec_objective").set_value("cost")
    at.number_input(key="rec_batch").set_value(32)
    at.run()
    assert_clean(at)
    assert "Speculation OFF" in texts(at.warning)
    assert "Regime: compute-bound" in [h.value for h in at.subheader]
    evidence = unescape_md(texts(at.markdown))
    assert "serving batch 32 ≥ knee 16" in evidence
    assert "is at or past the knee at batch 16" in unescape_md(texts(at.caption))


def test_budget_slider_only_for_the_budget_objective_and_price_gives_money(env):
    store_session(env.store, T5)
    at = page()
    assert not at.slider
    at.radio(key="rec_objective").set_value("latency_within_budget")
    at.number_input(key="rec_price").set_value(2.0)
    at.run()
    assert_clean(at)
    assert at.slider(key="rec_budget").value == 20
    at.slider(key="rec_budget").set_value(0)
    at.run()
    assert_clean(at)
    assert "budget +0%" in unescape_md(texts(at.success))  # memory-bound: faster is cheaper, fits a 0% budget
    metrics = {m.label: m.value for m in at.metric}
    before = 2.0 / (10.0 * 3600.0) * 1e6  # baseline 10 tokens/s, batch 1
    assert metrics["$ per million tokens, target alone"] == f"${before:,.2f}"
    assert metrics["$ per million tokens, recommended"].startswith("$")


# ---------------------------------------------------------------------------------------------------------------------
# the address bar and bad input


def test_session_from_the_query_param_is_preselected(env):
    older = store_session(env.store, {"t5-large": T5["t5-large"]}, name="older")
    newer = store_session(env.store, {"t5-small": T5["t5-small"]}, name="newer")
    at = page()
    assert at.multiselect(key="rec_sessions").value == [newer]  # default: the newest finished session
    at = page({"session": str(older)})
    assert_clean(at)
    assert at.multiselect(key="rec_sessions").value == [older]
    assert {m.label: m.value for m in at.metric}["Draft"] == "t5-large"
    at = page({"session": f"{older},{newer}"})
    assert at.multiselect(key="rec_sessions").value == [older, newer]
    assert {m.label: m.value for m in at.metric}["Draft"] == "t5-small"
    at.multiselect(key="rec_sessions").set_value([newer])
    at.run()
    assert at.query_params.get("session") in (str(newer), [str(newer)])
    assert at.multiselect(key="rec_sessions").value == [newer]


def test_unfinished_or_missing_session_in_the_query_is_a_clear_error(env):
    store_session(env.store, T5)
    set_id, _, _ = env.store.add_prompt_set("x", "x.txt", [{"text": "a"}])
    running = env.store.create_session(target="t", drafts=["d"], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                                       prompt_set_id=set_id)  # fmt: skip
    at = page({"session": str(running)})
    assert_clean(at)
    message = unescape_md(texts(at.error))
    assert f"session #{running} is queued, not done" in message and "only finished sessions" in message
    assert "Pick at least one finished session" in texts(at.info)
    at = page({"session": "999"})
    assert_clean(at)
    assert "session #999 (from the address bar) does not exist" in unescape_md(texts(at.error))


def test_session_without_speculative_runs_is_a_clear_error(env):
    set_id, _, _ = env.store.add_prompt_set("b", "b.txt", [{"text": "a"}])
    sid = env.store.create_session(target="t", drafts=["d"], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                                   prompt_set_id=set_id)  # fmt: skip
    env.store.claim_next_session("test:1")
    base = env.store.create_run(sid, "none", 0, 0.0, "baseline")
    env.store.finish_run(base, {}, tokens_per_s=10.0, speedup_measured=1.0)
    env.store.finish_session(sid, "done", summary={})
    at = page()
    assert_clean(at)
    message = unescape_md(texts(at.error))
    assert "Could not compute the recommendation" in message and "no finished speculative runs" in message
    assert not at.get("download_button")


def test_hostile_draft_and_session_names_are_shown_as_text(env):
    name = f"{XSS} **bold** [x](javascript:alert(1))"
    store_session(env.store, {name: (0.8, 0.01, 2.5)}, name=name)
    at = page()
    assert_clean(at)
    for md in [*at.markdown, *at.caption, *at.error, *at.info, *at.success, *at.warning]:
        assert "<script>" not in md.value and "](javascript" not in md.value
    assert XSS in unescape_md(texts(at.success))
    assert name in list(frame_with(at, "best γ").value["draft"])  # tables show text as text


# ---------------------------------------------------------------------------------------------------------------------
# one payload, one regime judgement: the page and `python -m engine recommend` export the same bytes


def test_cli_and_page_export_byte_identical_files_and_payloads(env, capsys):
    from engine.service.cli.main import main

    sid = store_session(env.store, T5, regime=sweep_regime(), verify_cost=T5_VERIFY)
    at = page()
    at.radio(key="rec_objective").set_value("latency_within_budget")
    at.run()
    at.slider(key="rec_budget").set_value(30)
    at.number_input(key="rec_batch").set_value(32)
    at.run()
    at.button(key="rec_save").click()
    at.run()
    assert_clean(at)
    assert not at.error, texts(at.error)
    (saved,) = env.store.list_recommendations()
    page_files = {e["format"]: e["content"] for e in env.store.list_exports(saved["id"])}
    assert list(page_files) == list(format_names())
    args = ["recommend", "--session", str(sid), "--objective", "latency_within_budget", "--budget", "0.3",
            "--batch-size", "32"]  # fmt: skip
    for fmt in format_names():
        out = env.home / f"cli-{fmt}.txt"
        assert main([*args, "--export", fmt, "--out", str(out)]) == 0
        assert out.read_bytes() == page_files[fmt].encode("utf-8"), fmt
    capsys.readouterr()
    assert main([*args, "--export", "vllm"]) == 0
    assert capsys.readouterr().out == page_files["vllm"]  # stdout too, byte for byte
    cli_saved = [r for r in env.store.list_recommendations() if r["id"] != saved["id"]]
    assert len(cli_saved) == len(format_names()) + 1
    assert all(r["payload"] == saved["payload"] for r in cli_saved)
    # the export says what the page says: the regime judged at batch 32 with the chosen γ
    own = json.loads(page_files["spectune"])
    rec = expected(env.store, [sid], "latency_within_budget", 0.3, 32)
    assert own["recommendation"]["gamma"] == rec.gamma and own["evidence"]["regime"]["label"] == rec.regime
    assert own["recommendation"]["schedule"][str(32)] == rec.gamma


def test_an_impossible_measurement_is_shown_as_a_measurement_error(env):
    # a loaded machine: 3.07× measured at γ=4 from a run that delivered 1.35 tokens per target call
    store_session(env.store, {"ngram": (0.35, 0.0, 3.07)}, gamma=4, tokens_per_call={"ngram": 1.35})
    at = page()
    assert_clean(at)
    assert not at.error, texts(at.error)
    captions = unescape_md(texts(at.caption))
    assert "measurement error" in captions and "load changed between runs" in captions
    assert "scaled" not in captions  # never calibrated to
    checks = dict(zip(frame_with(at, "mark").value["γ"], frame_with(at, "mark").value["check"], strict=True))
    assert "measurement error" in checks[4]
    assert "measurement error" in frame_with(at, "best γ").value["check"].iloc[0]
    rec = expected(env.store, [env.store.list_sessions()[0]["id"]])
    assert rec.off or rec.predicted_speedup <= rec.gamma + 1
    assert any("measurement error (impossible)" in s for s in chart_texts(at))


def test_the_page_is_layout_only() -> None:
    text = (ROOT / "app" / PAGE).read_text()
    assert len(text.splitlines()) <= 220
    views = "".join(path.read_text() for path in (ROOT / "app" / "recommend_view").glob("*.py"))
    assert "def schedule_gamma_at" not in views
    for domain in ("classify_batch_sweep", "regime_report", "RegimeReport(", "gamma_curve(", "json.loads"):
        assert domain not in text, domain
