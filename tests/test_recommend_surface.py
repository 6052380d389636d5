"""The Recommend page shows a vLLM session's measured speedup surface: γ × concurrency, each cell's speedup and
noise flag, and where each γ stops paying (speedup ≤ 1).

No recorded vLLM session is kept in tests/data, so the session is written as the worker writes one: queued by
engine.service.jobs.submit_session (engine vllm, concurrency 1, 2, 4), claimed, each run started and finished
through engine.service.worker.store_hooks.StoreHooks (the worker's hooks) with a RunSummary as the sweep makes it (the
baseline at every level, the per-prompt spread from engine.measure.noise), then finished as done.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import streamlit as st

from engine.measure.noise import spread_of
from engine.service.decide.surface import session_surface, surfaces
from engine.service.jobs import submit_session
from engine.service.worker.store_hooks import StoreHooks
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec
from engine.session.summary import RunSummary
from foundation.paths import default_database_url
from store import open_store
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean, texts, unescape_md
from tests.test_app_pages import page as app_page

LEVELS = [1, 2, 4]
# per γ, per level: the per-prompt speedups measured side by side (their median is the run's speedup)
MEASURED = {
    2: {1: [1.25, 1.30, 1.35], 2: [0.95, 1.08, 1.20], 4: [0.88, 0.92, 0.97]},
    4: {1: [1.45, 1.50, 1.55], 2: [1.15, 1.20, 1.25], 4: [1.02, 1.05, 1.08]},
}


def run_summary(**values: Any) -> RunSummary:
    """A RunSummary from those of `values` that are its fields (tokens per call and mean acceptance length both
    given, as a vLLM run measures them)."""
    names = {f.name for f in fields(RunSummary)}
    return RunSummary(**{k: v for k, v in values.items() if k in names})


def store_vllm_session(store, measured: dict[int, dict[int, list[float]]] | None = None,
                       prompts: list[str] | None = None, flags: dict[tuple[int, int], str] | None = None,
                       **spec: Any) -> int:  # fmt: skip
    """A finished vLLM session whose n-gram runs measured `measured` (γ → level → per-prompt speedups; MEASURED
    by default) against a baseline at every level, on `prompts` (three short code prompts by default); `spec`
    overrides the session's other settings; `flags` the stored bound verdict of a run, by (γ, level)."""
    measured = measured or MEASURED
    levels = sorted({level for by_level in measured.values() for level in by_level})
    texts = prompts or ["def add(a, b):", "class Stack:", "for i in range(10):"]
    set_id, _, _ = store.add_prompt_set("code", "code.txt", [{"text": t} for t in texts])
    settings = SessionSpec(**{"target": "smollm2-135m", "drafts": ["ngram"], "gammas": sorted(measured),
                              "engine": "vllm", "concurrency": levels, "dtype": "float32"} | spec)  # fmt: skip
    sid = submit_session(store, settings, set_id, name="vllm surface")
    store.claim_next_session("test:1")
    hooks = StoreHooks(store, sid, "test:1")
    for level in levels:
        run = hooks.run_started(RunKey("none", 0, 0.0, concurrency=level).as_dict())
        hooks.run_finished(run, run_summary(tokens_per_s=40.0 / level ** 0.5, steps=192, tokens=192,
                                            tokens_per_call=1.0, mean_acceptance_length=None, engine="vllm",
                                            concurrency=level, ttft_p50_s=0.05, itl_p50_s=0.02))  # fmt: skip
    for gamma, by_level in measured.items():
        for level, ratios in by_level.items():
            spread = spread_of(ratios)
            run = hooks.run_started(RunKey("ngram", gamma, 0.0, concurrency=level).as_dict())
            hooks.run_finished(run, run_summary(
                tokens_per_s=40.0 * spread.median, steps=120, tokens=192, tokens_per_call=1.6,
                mean_acceptance_length=1.6,
                draft_acceptance_rate=0.3, per_position_acceptance=[0.4, 0.3, 0.2, 0.1][:gamma], engine="vllm",
                method="ngram", concurrency=level, speedup_measured=spread.median, speedup_predicted=None,
                speedup_spread=spread.to_dict(), ttft_p50_s=0.05, itl_p50_s=0.02,
                speedup_flag=(flags or {}).get((gamma, level)),
            ))  # fmt: skip
    store.finish_session(sid, "done", summary={"verify_cost": {}, "engine": "vllm",
                                               "noisy_runs": ["ngram γ=2 T=0 ×2", "ngram γ=2 T=0 ×4"]})  # fmt: skip
    return sid


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    store = open_store(default_database_url())
    yield SimpleNamespace(store=store, sid=store_vllm_session(store))
    store.close()


def test_the_service_shapes_the_surface(env: SimpleNamespace) -> None:
    surface = session_surface(env.store, env.sid)
    assert surface is not None and surface.levels == LEVELS and surface.name == "vllm surface"
    cells = {(c.gamma, c.concurrency): c for c in surface.cells}
    assert sorted(cells) == [(g, n) for g in (2, 4) for n in LEVELS]  # the baselines are what they divide by
    assert cells[2, 1].speedup == pytest.approx(1.30) and cells[2, 1].verdict == "faster" and not cells[2, 1].noisy
    assert cells[2, 2].noisy and cells[2, 2].verdict == "too noisy to tell" and cells[2, 2].pays
    assert cells[2, 4].verdict == "slower" and not cells[2, 4].pays
    assert [s.line() for s in surface.stops] == [
        "ngram T=0 γ=2: stops paying at concurrency 4 (measured)",
        "ngram T=0 γ=4: pays at every level measured (up to 4)",
    ]
    one_level = store_session(env.store, {"t5-small": T5["t5-small"]})
    assert session_surface(env.store, one_level) is None  # measured at one level: no surface
    assert [s.session_id for s in surfaces(env.store, [one_level, env.sid])] == [env.sid]


def test_the_recommend_page_shows_the_surface(env: SimpleNamespace) -> None:
    at = app_page("pages/5_Recommend.py", {"session": str(env.sid)})
    assert_clean(at)
    assert "Measured speedup: γ × concurrency" in texts(at.subheader)
    table = next(d for d in at.dataframe if "stops paying at" in d.value.columns).value
    assert list(table.columns) == ["configuration", "γ", "×1 in flight", "×2 in flight", "×4 in flight",
                                   "stops paying at"]  # fmt: skip
    rows = table.set_index("γ")
    assert rows.loc["2", "×1 in flight"] == "1.30×" and rows.loc["2", "×2 in flight"] == "1.08× ⚠ noisy"
    assert rows.loc["2", "×4 in flight"] == "0.92×" and rows.loc["2", "stops paying at"] == "concurrency 4"
    assert rows.loc["4", "×4 in flight"] == "1.05×" and rows.loc["4", "stops paying at"] == "pays at every level"
    styles = next(d for d in at.dataframe if "stops paying at" in d.value.columns).proto.arrow_data.styler.styles
    assert "font-weight: bold" in styles  # the cell where γ = 2 stops paying
    shown = unescape_md(texts(at.markdown))
    assert "ngram T=0 γ=2: stops paying at concurrency 4 (measured)" in shown
    assert "ngram T=0 γ=4: pays at every level measured (up to 4)" in shown
    assert any("requests in flight" in c.proto.spec for c in at.get("vega_lite_chart"))  # the surface chart


def test_an_impossible_cell_is_marked_on_both_pages_and_never_decides_where_paying_stops(
    env: SimpleNamespace,
) -> None:
    """γ=2 at 4 in flight measured 2.40× at 1.6 tokens per call: its stored verdict says impossible. The surface
    table marks it, greys it, the chart names it, and whether γ=2 pays is judged without it (up to 2 in flight)."""
    measured = {2: {1: [1.25, 1.30, 1.35], 2: [1.10, 1.15, 1.20], 4: [2.3, 2.4, 2.5]}}
    flag = "measurement error: the measured 2.40× at γ=2 is impossible — that run delivered 1.60 tokens per call"
    sid = store_vllm_session(env.store, measured, flags={(2, 4): flag})
    surface = session_surface(env.store, sid)
    assert [s.line() for s in surface.stops] == ["ngram T=0 γ=2: pays at every level measured (up to 2)"]
    at = app_page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    shown = next(d for d in at.dataframe if "stops paying at" in d.value.columns)
    row = shown.value.set_index("γ").loc["2"]
    assert row["×4 in flight"] == "2.40× ⚠ impossible" and row["×1 in flight"] == "1.30×"
    assert "line-through" in shown.proto.arrow_data.styler.styles
    assert "ngram T=0 γ=2: pays at every level measured (up to 2)" in unescape_md(texts(at.markdown))
    sessions = app_page("pages/3_Sessions.py", {"session": str(sid)})
    assert_clean(sessions)
    assert "ngram T=0 γ=2: pays at every level measured (up to 2)" in unescape_md(texts(sessions.markdown))
    from app import sessions_view as sv

    frame = sv.concurrency_surface(env.store.list_runs(sid))
    assert frame.set_index("concurrency").loc[4, "verdict"] == "impossible (a measurement error)"


def test_a_session_at_one_level_shows_no_surface(env: SimpleNamespace) -> None:
    sid = store_session(env.store, {"t5-small": T5["t5-small"]})
    at = app_page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    assert "Measured speedup: γ × concurrency" not in texts(at.subheader)
