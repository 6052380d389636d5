"""Time and memory said before a session starts (issue #21, item 8): at the pace of the newest comparable session
on this machine, with what its models' weights hold; the Run page's Estimate and `submit --estimate` agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.measure.hardware import describe_hardware
from engine.service.sizing.estimate import LONG_S, _minutes, estimate_for
from engine.service.sizing.plan import planned_configurations
from engine.session.spec import SessionSpec
from store import Store, open_store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))  # this machine's pace probes live there too
    return open_store(f"sqlite:///{tmp_path / 'spectune.db'}")


def finished(store: Store, spec: SessionSpec, runs: int, hardware: str) -> int:
    """A finished session as the worker leaves one (its timestamps are the store's own)."""
    sid = store.create_session(target=spec.target, drafts=spec.drafts, gammas=spec.gammas,
                               temperatures=spec.temperatures, max_new_tokens=spec.max_new_tokens, dtype=spec.dtype,
                               n_prompts=4, options={"engine": spec.engine})  # fmt: skip
    store.claim_next_session("test:1")
    store.set_hardware(sid, hardware)
    store.finish_session(sid, "done", summary={"runs": [{}] * (runs - 1), "baselines": [{}]})
    return sid


def test_the_estimate_runs_at_the_pace_of_the_last_comparable_session_here(store: Store) -> None:
    spec = SessionSpec(target="qwen2.5-coder-1.5b", drafts=["qwen2.5-coder-0.5b", "ngram"], gammas=[1, 2, 4],
                       max_new_tokens=32, dtype="float32", mode="full")  # fmt: skip
    assert planned_configurations(spec) == 7  # the target alone + 2 drafts × 3 γ
    confirming = SessionSpec(**(spec.to_dict() | {"confirm": True}))
    assert planned_configurations(confirming) == 7 + 3  # and, at most, a headline the grid lacks with its baseline
    nothing = estimate_for(store, spec, 10)
    assert nothing.seconds is None and "time unknown" in nothing.sentences()[0]
    # 1.5B + 0.5B parameters in float32: the weights alone
    assert nothing.memory_bytes is not None and 6 * 1024**3 < nothing.memory_bytes < 9 * 1024**3
    here = str(describe_hardware()["label"])
    finished(store, spec, 5, "another machine")  # never the pace of another machine
    sid = finished(store, spec, 5, here)
    session = store.get_session(sid)
    wall = (session["finished_at"] - session["started_at"]).total_seconds()
    got = estimate_for(store, spec, 10)
    assert got.seconds == pytest.approx(wall / (5 * 4 * 32) * 7 * 10 * 32)
    assert f"session #{sid}" in got.sentences()[0] and got.configurations == 7
    # seen in a walk: the same session, just run in 6.3 min, was estimated at "about 9 min", its optional
    # confirmation charged as certain; a confirming full session gives the range
    both = estimate_for(store, confirming, 10)
    assert both.configurations == 10 and both.optional == 3 and both.seconds == pytest.approx(got.seconds * 10 / 7)
    assert "(3 of them only if the grid does not measure the recommendation)" in both.sentences()[0]
    assert f"about {_minutes(got.seconds)} to {_minutes(both.seconds)} on this machine" in both.sentences()[0]
    quick = SessionSpec(**{**spec.__dict__, "mode": "quick"})
    assert planned_configurations(quick) == 3 + 3  # probe: baseline + each draft at γ=4; a confirmation
    long = type(got)(7, LONG_S + 1, "x", None, cheaper=("a quick session",))
    assert "That is long: a quick session would take less." in long.sentences()


def test_submit_estimate_prints_it_and_queues_nothing(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("Say hello.\nName a colour.\n")
    db = tmp_path / "spectune.db"
    env = {"SPECTUNE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "engine", "submit", "--prompts", str(prompts), "--estimate",
                           "--draft", "ngram", "--gamma", "2", "--engine", "spectune"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "configuration(s) to run live" in done.stdout and "Memory: about" in done.stdout
    assert not db.exists() or open_store(f"sqlite:///{db}").list_sessions() == []


def test_the_batch_sweep_eta_counts_its_compiles_in_the_compiled_loop() -> None:
    """The compiled loop's batch sweep compiles a one-row step and one for every other batch before it times them:
    its estimate carries what one width took this session to compile, twice; the eager loop's carries none."""
    from engine.session.estimates import BATCH_SWEEP_COMPILES, batch_sweep_eta_s, compile_each_s

    eager = batch_sweep_eta_s(0.01, 1)
    assert eager is not None and eager > 0
    each = compile_each_s(90.0, widths=9, models=2)  # 18 widths compiled in 90 s
    assert each == 5.0
    assert batch_sweep_eta_s(0.01, 1, each) == pytest.approx(eager + BATCH_SWEEP_COMPILES * 5.0)
    assert compile_each_s(None, 9, 1) == 0.0 and batch_sweep_eta_s(None, 1, each) is None
