"""A prediction never overrules a clear measured loss: where a draft lost at every γ measured at a batch (and at
least one loss is not too noisy to tell), nothing of that draft is recommended there — no unmeasured γ between or
beyond the measured ones, no policy — and a γ schedule that turns speculation off in a range says what that range
still costs an engine that keeps its speculative path running (vLLM) and how much traffic the schedule needs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.analysis.calibrate import measured_loss
from engine.analysis.choice import judge_for
from engine.analysis.export.vllm import OFF_RANGE_MEASURED
from engine.analysis.recommend import DraftMeasurement, recommend
from engine.analysis.schedule import break_even_share, gamma_schedule
from engine.service.decide.evidence import recommend_from_store
from engine.service.decide.recommendations import recommend_and_export
from engine.service.decide.surface import LevelChoice, SurfaceCell, measured_choices
from foundation.paths import default_database_url
from store import open_store
from tests.test_export_check import MEASURED
from tests.test_recommend_surface import store_vllm_session


def ngram(measured: dict[int, float], noisy: tuple[int, ...] = ()) -> DraftMeasurement:
    """An n-gram lookup whose one model predicts ~2× at γ 4–6 (α 0.6 per position, free draft, v(k) to k = 5)."""
    return DraftMeasurement(
        name="ngram", method="ngram", model_ref=None, alpha=0.6, per_position_acceptance=[0.6] * 6,
        verify_cost={2: 1.02, 3: 1.04, 5: 1.08}, measured_speedup=dict(measured),
        measured_tokens_per_call={1: 1.5, 2: 1.8, 4: 2.1}, noisy_speedup={g: "straddles 1" for g in noisy},
    )  # fmt: skip


def test_a_clear_loss_at_every_measured_gamma_turns_the_draft_off() -> None:
    assert recommend([ngram({})], "latency", "memory-bound").gamma == 5  # the prediction alone: γ=5, ~2.2×
    rec = recommend([ngram({1: 0.97, 2: 0.96, 4: 0.95})], "latency", "memory-bound")
    assert rec.off and rec.predicted_speedup == 1.0 and rec.schedule is None
    assert "lost at every γ measured at batch 1 (γ=1 0.97×, γ=2 0.96×, γ=4 0.95×)" in rec.explanation
    assert "measure γ=5 to know" in rec.explanation  # the extrapolated γ is named as a thing to measure
    assert rec.comparison[0].why_not.startswith("lost at every γ measured")
    # the same rule at every batch of a schedule: batch 1 is off, a batch nothing measured keeps the prediction
    assert gamma_schedule(ngram({1: 0.97, 2: 0.96, 4: 0.95}), [1, 2]) == {1: 0, 2: 5}


def test_a_noisy_loss_or_one_win_leaves_the_prediction_standing() -> None:
    all_noisy = ngram({1: 0.97, 2: 0.99}, noisy=(1, 2))
    assert measured_loss(all_noisy, 1) == "" and recommend([all_noisy], "latency", "memory-bound").gamma == 5
    one_clear = ngram({1: 0.97, 2: 0.99}, noisy=(1,))
    assert "γ=1 0.97× (too noisy to tell), γ=2 0.99×" in measured_loss(one_clear, 1)
    assert recommend([one_clear], "latency", "memory-bound").off
    one_win = ngram({1: 0.97, 4: 1.30})
    assert measured_loss(one_win, 1) == "" and not recommend([one_win], "latency", "memory-bound").off


@pytest.mark.parametrize(("on", "off"), [(1.15, 0.83), (1.5, 0.68), (1.08, 0.95)])
def test_the_break_even_share_is_where_the_schedule_and_no_speculation_take_as_long(on: float, off: float) -> None:
    p = break_even_share(on, off)
    assert 0.0 < p < 1.0
    assert p / on + (1.0 - p) / off == pytest.approx(1.0)  # per token, relative to the target alone
    below, above = p - 0.05, p + 0.05
    assert below / on + (1 - below) / off > 1.0 > above / on + (1 - above) / off
    assert break_even_share(on, 1.0) == 0.0 and break_even_share(1.0, off) == 1.0


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    yield SimpleNamespace(store=store, sid=store_vllm_session(store, MEASURED))
    store.close()


def test_serving_where_the_surface_lost_everywhere_is_off_in_every_answer(env: SimpleNamespace) -> None:
    """MEASURED: γ 2 and 4 pay at 1 and 2 in flight and both lose clearly at 4 (0.95×, 0.88×)."""
    rec, ev, _ = recommend_from_store(env.store, [env.sid], batch_size=4, engine="vllm")
    assert ev.measurements[0].level_speedups[4] == {2: (pytest.approx(0.95), False), 4: (pytest.approx(0.88), False)}
    assert rec.off and "lost at every γ measured at batch 4 (γ=2 0.95×, γ=4 0.88×)" in rec.explanation
    m = ev.measurements[0]  # the policy table judges with the same judge: at batch 4 it refuses every row
    assert judge_for(m, "latency", None, "memory-bound", 4).lost.startswith("lost at every γ measured at batch 4")
    assert judge_for(m, "latency", None, "memory-bound", 2).lost == ""
    config = json.loads(recommend_and_export(env.store, [env.sid], batch_size=4, formats=("vllm",),
                                             engine="vllm").files["vllm"][1])  # fmt: skip
    assert config["speculative_config"] is None and "lost at every γ measured at batch 4" in config["reason"]


def test_a_schedule_with_an_off_range_weighs_itself_against_no_speculation(env: SimpleNamespace) -> None:
    result = recommend_and_export(env.store, [env.sid], formats=("vllm",), engine="vllm")
    rec = result.recommendation
    assert rec.schedule[1] == rec.gamma > 0 and rec.schedule[4] == 0
    assert rec.off_range_speedups == {4: pytest.approx(0.95)}  # the best γ measured where it is off
    shares = sorted(break_even_share(on, 0.95) for on in (rec.predicted_speedup, 1.15))  # batch 1 and 2's
    line = next(n for n in rec.notes if "serving without a speculative config" in n)
    assert "(batch 4: 0.95×, the best γ measured there)" in line
    assert f"at least {shares[0] * 100:.0f}–{shares[1] * 100:.0f}% of the tokens" in line
    assert f"where it speculates (batch 1: {rec.predicted_speedup:.2f}×, batch 2: 1.15×)" in line
    doc = json.loads(result.files["vllm"][1])
    assert OFF_RANGE_MEASURED in doc["comments"]
    assert line in doc["notes"]


def test_a_speedup_that_breaks_its_bound_is_no_measured_choice() -> None:
    """Seen on a real vLLM surface: γ=1 measured 1.62× at 1.15 tokens per call (impossible, flagged) was cited as
    the level's best measured γ beside the note that flagged it."""
    impossible = SurfaceCell("ngram T=0", 1, 1, 1.62, "faster", False, flag="1.62× at 1.15 tokens per call")
    honest = SurfaceCell("ngram T=0", 4, 1, 1.39, "faster", False)
    assert measured_choices([impossible, honest], "ngram", 0.0) == [LevelChoice(1, 4, 1.39, False)]
    assert measured_choices([impossible], "ngram", 0.0) == []


def test_a_noisy_measurement_is_marked_in_the_crossover_table_and_the_draft_comparison() -> None:
    """Defect 4 of the pages issue: a measured speedup too noisy to tell was shown as a plain figure on the
    Recommend page (a llama.cpp session whose runs the Sessions page called 'too noisy to tell')."""
    from app import recommend_view as rv
    from engine.analysis.curve import gamma_curve

    m = ngram({1: 1.05, 4: 1.07}, noisy=(1, 4))
    frame = rv.curve_frame(gamma_curve(m, [1, 2, 4]), "memory-bound", 4).set_index("γ")
    assert frame.loc[1, "check"] == frame.loc[4, "check"] == rv.NOISY_MEASURED_MARK
    assert rv.NOISY_MEASURED_MARK not in frame.loc[2, "check"]  # not measured: nothing to be noisy
    rec = recommend([m], "latency", "memory-bound")
    table = rv.comparison_frame(rec.comparison, 0)
    assert table.loc[0, "check"] == f"{rv.NOISY_MEASURED_MARK} (γ = 4)" and table.loc[0, "at γ"] == 4
    clear = rv.comparison_frame(recommend([ngram({1: 1.05, 4: 1.07})], "latency", "memory-bound").comparison, 0)
    assert clear.loc[0, "check"] == ""
    from engine.analysis.export import export

    record = json.loads(export(rec, "spectune")[1])["evidence"]
    assert record["measurement"]["noisy_speedup"] == {"1": "straddles 1", "4": "straddles 1"}
    assert [r["measured_noisy"] for r in record["gamma_curve"][:4]] == ["straddles 1", None, None, "straddles 1"]
