"""The regime evidence says one consistent thing (issue #21, defect 5).

Seen on the Recommend page of a llama.cpp session: "v(5) = 3.20 (measured)" beside "Regime unknown (no batch
sweep, v(k) or roofline decided it)"; "Memory-bound: … cost per token falls by the speedup" beside speedups below
1 and costs of +23% and +33%; and with the cost objective an explanation about speed. Each sentence is checked here
on those inputs, in the explanation functions and on the page.
"""

from __future__ import annotations

import pytest
import streamlit as st

from engine.analysis.explain import explain_off, notes
from engine.analysis.recommend_types import UNKNOWN, DraftSummary
from engine.analysis.regime import evidence_said, judge_regime
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND
from engine.service.decide.evidence import recommend_from_store
from foundation.paths import default_database_url
from store import open_store
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean, texts, unescape_md
from tests.test_app_pages import page as app_page

# the llama.cpp session: v(k) measured up to k = 5, 55% billed (partial: takes no side), no batch sweep or roofline
LLAMACPP_VERIFY = {2: 1.6, 3: 2.2, 4: 2.7, 5: 3.2}
SLOW_DRAFTS = {"qwen2.5-coder-0.5b": (0.5, 0.3, 0.75), "ngram": (0.3, 0.0, 0.95)}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    opened = open_store(default_database_url())
    yield opened
    opened.close()


def llamacpp_session(store) -> int:
    return store_session(store, SLOW_DRAFTS, gamma=1, verify_cost=LLAMACPP_VERIFY, target="qwen2.5-coder-1.5b")


def summary(name: str, speedup: float, ops: float, cost: float, regime: str, why: str) -> DraftSummary:
    return DraftSummary(name=name, method="draft_model", model_ref=None, alpha=0.5, c=0.1, c_effective=None,
                        best_gamma=2, best_speedup=speedup, ops_multiplier=ops, cost_change=cost, crossover_gamma=1,
                        measured_speedup={}, pays=False, why_not=why, regime=regime)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# the judgement and its words


def test_a_measured_v_k_is_never_called_missing() -> None:
    report = judge_regime(None, 1, gamma=1, verify_cost=LLAMACPP_VERIFY)
    said = "\n".join(report.evidence)
    assert report.label == "unknown" and report.votes == {"verify curve": "mixed"}
    assert "v(5) = 3.20 (measured)" in said
    assert "measure v(k)" not in said and "measure v(k)" not in report.source
    # which evidence abstained and why, which was not measured
    assert "measured but taking no side: v(k) (partly billed, between free and fully billed)" in said
    assert "not measured: batch sweep, roofline" in said and "run a batch sweep at the serving batch" in said
    assert "v(k) (partly billed" in report.source
    # with nothing measured, v(k) is the missing evidence
    bare = judge_regime(None, 1)
    assert "not measured: batch sweep, v(k), roofline" in bare.evidence[-1] and "measure v(k)" in bare.evidence[-1]


def test_evidence_said_names_what_decided_and_what_abstained() -> None:
    said = evidence_said({"batch sweep": MEMORY_BOUND, "verify curve": "measurement error"})
    assert said == ("the batch sweep says memory-bound; measured but taking no side: v(k) (outside its physical "
                    "bounds, so not evidence); not measured: roofline")  # fmt: skip


def test_the_unknown_note_names_the_measured_v_k() -> None:
    out = notes(None, None, MEMORY_BOUND, UNKNOWN, 1, None, [], votes={"verify curve": "mixed"})
    unknown = next(n for n in out if n.startswith("Regime unknown"))
    assert "no batch sweep, v(k) or roofline decided it" not in unknown and "assumed memory-bound" in unknown
    assert "taking no side: v(k) (partly billed" in unknown and "not measured: batch sweep, roofline" in unknown
    # seen in a walk: "Regime unknown — … assumed memory-bound …" then "Memory-bound: the extra arithmetic runs in
    # idle capacity …", a flat claim; under an assumed regime the note says it is one
    assumed = [n for n in out if n.startswith("Memory-bound")]
    assert len(assumed) == 1 and assumed[0].startswith("Memory-bound (assumed): "), out
    decided = notes(None, None, MEMORY_BOUND, MEMORY_BOUND, 1, None, [])
    assert [n for n in decided if n.startswith("Memory-bound")][0].startswith("Memory-bound: "), decided


def test_memory_bound_off_never_says_cost_falls_beside_speedups_below_1() -> None:
    best = summary("ngram", 0.8125, 1.54, 1 / 0.8125 - 1, MEMORY_BOUND, "not faster than the target alone")
    for objective in ("latency", "cost"):
        note = next(n for n in notes(None, None, MEMORY_BOUND, MEMORY_BOUND, 1, None, [], objective,
                                     summaries=[best]) if n.startswith("Memory-bound"))  # fmt: skip
        assert "falls" not in note and "+23%" in note and "0.81×" in note
    cost_note = next(n for n in notes(None, None, MEMORY_BOUND, MEMORY_BOUND, 1, None, [], "cost", summaries=[best])
                     if n.startswith("Memory-bound"))  # fmt: skip
    assert "none lowers it" in cost_note


def test_the_cost_objective_off_explanation_speaks_of_cost() -> None:
    # compute-bound: the fastest candidate is not the cheapest; the sentence names the cheapest and its cost rule
    fast = summary("big", 1.3, 1.9, 0.9, COMPUTE_BOUND, "does not lower the cost per token")
    cheap = summary("small", 1.1, 1.05, 0.05, COMPUTE_BOUND, "does not lower the cost per token")
    text = explain_off([fast, cheap], "cost", None)
    assert text.startswith("Speculation off: no candidate lowers the cost per token")
    assert "the cheapest, small at γ=2, raises it by +5%" in text and "ops multiplier, 1.05×" in text
    assert "faster" not in text
    slow = summary("ngram", 0.8125, 1.54, 1 / 0.8125 - 1, MEMORY_BOUND, "does not lower the cost per token")
    text = explain_off([slow], "cost", None)
    assert "raises it by +23%" in text and "1/speedup" in text and "0.81×" in text and "faster" not in text


def test_recommendation_notes_on_the_llamacpp_session(store) -> None:
    sid = llamacpp_session(store)
    for objective in ("latency", "cost"):
        rec, _, report = recommend_from_store(store, [sid], objective)
        assert rec.off and report.label == "unknown"
        said = "\n".join(rec.notes + report.evidence + [report.source, rec.explanation])
        assert "v(5) = 3.20 (measured)" in said
        assert "measure v(k)" not in said and "decided it" not in said and "falls by the speedup" not in said
        assert "v(k) (partly billed" in next(n for n in rec.notes if n.startswith("Regime unknown"))
    assert "lowers the cost per token" in rec.explanation and "faster" not in rec.explanation


def test_memory_bound_on_says_what_the_chosen_speedup_does_to_cost(store) -> None:
    sid = store_session(store, T5, regime=None, verify_cost={2: 1.01, 4: 1.02, 8: 1.04})
    rec, _, _ = recommend_from_store(store, [sid], "latency", regime_override=MEMORY_BOUND)
    assert not rec.off and rec.predicted_speedup > 1
    note = next(n for n in rec.notes if n.startswith("Memory-bound"))
    assert "falls by the speedup" not in note
    assert f"{rec.cost_change * 100:+.0f}% at the chosen {rec.predicted_speedup:.2f}× (γ={rec.gamma})" in note
    assert "below 1×) raises it" in note


# ---------------------------------------------------------------------------------------------------------------------
# the page


def test_the_recommend_page_says_one_thing_about_the_regime(store) -> None:
    llamacpp_session(store)
    at = app_page("pages/5_Recommend.py")
    for objective in ("latency", "cost"):
        at.radio(key="rec_objective").set_value(objective)
        at.run()
        assert_clean(at)
        assert not at.error, texts(at.error)
        shown = unescape_md("\n".join(texts(getattr(at, kind)) for kind in ("markdown", "caption", "warning")))
        assert "v(5) = 3.20 (measured)" in shown
        assert "measure v(k)" not in shown and "decided it" not in shown and "falls by the speedup" not in shown
        assert "taking no side: v(k) (partly billed" in shown
    explanation = unescape_md(texts(at.markdown))
    assert "no candidate lowers the cost per token — the cheapest" in explanation
    assert "none lowers it" in unescape_md(texts(at.caption))
