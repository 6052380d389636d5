"""Recommendations rest on the deploying engine's own numbers: stored spectune and llama.cpp sessions side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.analysis.calibrate import calibration
from engine.errors import SpectuneError
from engine.service.decide.evidence import choose_engine, engine_comparison, gather, recommend_from_store
from store import Store, open_store

ROOT = Path(__file__).resolve().parents[1]
DRAFT = "qwen2.5-coder-0.5b"


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    return open_store(f"sqlite:///{tmp_path / 'spectune.db'}")


def session(store: Store, engine: str, runs: list[dict[str, Any]], verify: dict[str, float]) -> int:
    """A finished session measured with `engine`; `runs` are (gamma, column values, summary extras)."""
    set_id, _, _ = store.add_prompt_set(f"set-{engine}", None, [{"text": "def f(x):"}])
    sid = store.create_session(target="qwen2.5-coder-1.5b", drafts=[DRAFT], gammas=[r["gamma"] for r in runs],
                               temperatures=[0.0], max_new_tokens=16, prompt_set_id=set_id, n_prompts=1,
                               options={"engine": engine})  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {"engine": engine}, tokens_per_s=10.0, tokens_per_call=1.0, speedup_measured=1.0)
    for r in runs:
        run = store.create_run(sid, DRAFT, r["gamma"], 0.0, "speculative")
        columns = {k: r[k] for k in ("alpha", "c", "tokens_per_s", "speedup_measured", "tokens_per_call",
                                     "per_position_acceptance", "speedup_predicted")}  # fmt: skip
        store.finish_run(run, {"engine": engine, **r.get("summary", {})}, **columns, verify_cost=verify)
    store.finish_session(sid, "done", summary={"verify_cost": verify})
    return sid


def spectune_session(store: Store) -> int:
    """The PyTorch loop on a CPU with bf16 instructions: verification nearly free, the draft wins."""
    return session(store, "spectune", [{
        "gamma": 4, "alpha": 0.82, "c": 0.2, "tokens_per_s": 13.0, "speedup_measured": 1.3,
        "tokens_per_call": 3.4, "per_position_acceptance": [0.9, 0.85, 0.8, 0.75], "speedup_predicted": 1.35,
        "summary": {"speedup_spread": {"median": 1.3, "min": 1.2, "max": 1.4, "n": 3, "verdict": "faster"}},
    }], {"1": 1.0, "2": 1.02, "5": 1.05})  # fmt: skip


def llamacpp_session(store: Store, spread_verdict: str = "slower") -> int:
    """llama.cpp on the same machine: Q4 kernels make a 5-token verify cost ~2.4 target calls; the draft loses."""
    lo, hi = (0.6, 0.8) if spread_verdict == "slower" else (0.7, 1.3)
    return session(store, "llama.cpp", [{
        "gamma": 4, "alpha": None, "c": 0.45, "tokens_per_s": 7.0, "speedup_measured": 0.7,
        "tokens_per_call": 3.3, "per_position_acceptance": [0.88, 0.85, 0.8, 0.78], "speedup_predicted": 0.75,
        "summary": {"alpha_from_acceptance_length": 0.8, "draft_acceptance_rate": 0.77,
                    "speedup_spread": {"median": 0.7, "min": lo, "max": hi, "n": 3, "verdict": spread_verdict}},
    }], {"1": 1.0, "2": 1.2, "4": 2.1, "5": 2.4})  # fmt: skip


def test_engine_choice_follows_the_export_target(store: Store) -> None:
    both = [spectune_session(store), llamacpp_session(store)]
    assert choose_engine(store, both, None) == "spectune"
    assert choose_engine(store, both, None, "llamacpp") == "llama.cpp"
    assert choose_engine(store, both[:1], None, "llamacpp") == "spectune"  # no llama.cpp session chosen
    assert choose_engine(store, both[1:], None) == "llama.cpp"
    with pytest.raises(SpectuneError, match="engine 'nonesuch'"):
        choose_engine(store, both, "nonesuch")
    with pytest.raises(SpectuneError, match="none of the chosen sessions was measured with llama.cpp"):
        gather(store, both[:1], "llama.cpp")


def test_llamacpp_numbers_decide_a_llamacpp_recommendation(store: Store) -> None:
    both = [spectune_session(store), llamacpp_session(store)]
    on_torch, ev_torch, _ = recommend_from_store(store, both, "latency", engine="spectune")
    on_llama, ev_llama, _ = recommend_from_store(store, both, "latency", engine="llama.cpp")
    assert ev_torch.session_ids == both[:1] and ev_llama.session_ids == both[1:]
    assert not on_torch.off and on_torch.gamma >= 1  # verification is nearly free in the PyTorch loop here
    assert on_llama.off  # in llama.cpp the same draft loses on this machine: the recommendation says so
    assert any("measured with llama.cpp" in note for note in on_llama.notes)
    # α carries over: llama.cpp's comes from its mean acceptance length, not from β it cannot report
    assert ev_llama.measurements[0].alpha == pytest.approx(0.8)


def test_engines_side_by_side_and_noisy_speedups_are_not_calibrated_to(store: Store) -> None:
    both = [spectune_session(store), llamacpp_session(store, spread_verdict="too noisy to tell")]
    rows = engine_comparison(store, both)
    assert [r["engine"] for r in rows] == ["llama.cpp", "spectune"]
    assert rows[0]["α measured as"] == "from acceptance length" and rows[1]["α measured as"] == "mean β"
    assert "too noisy to tell" in rows[0]["spread"]
    ev = gather(store, both[1:], "llama.cpp")
    m = ev.measurements[0]
    assert m.measured_speedup == {4: 0.7}  # shown as measured …
    assert "too noisy to calibrate to" in m.noisy_speedup[4]  # … but never calibrated to
    assert calibration(m) is None


def test_cli_recommend_uses_llamacpp_numbers_for_a_llamacpp_export(store: Store, tmp_path: Path) -> None:
    spectune_session(store)
    llamacpp_session(store)
    env = {"SPECTUNE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "engine", "recommend", "--session", "1", "--session", "2",
                           "--export", "llamacpp"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "measured with llama.cpp: sessions 2" in done.stdout


def test_engines_side_by_side_flag_an_impossible_speedup(store: Store) -> None:
    """2.76× at 1.04 tokens per call (seen on a busy machine) carries the one bound flag beside it."""
    impossible = session(store, "llama.cpp", [{
        "gamma": 4, "alpha": None, "c": 0.0, "tokens_per_s": 27.6, "speedup_measured": 2.76, "tokens_per_call": 1.04,
        "per_position_acceptance": [0.1], "speedup_predicted": 1.0,
        "summary": {"speedup_spread": {"median": 2.76, "min": 2.5, "max": 3.0, "n": 3, "verdict": "faster"}},
    }], {"1": 1.0})  # fmt: skip
    rows = engine_comparison(store, [spectune_session(store), impossible])
    assert [(r["engine"], r["bound"]) for r in rows] == [("llama.cpp", "⚠ impossible"), ("spectune", None)]
