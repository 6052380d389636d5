"""Sessions sized to a time budget (engine.service.sizing.budget), and the fastest faithful engine by default.

The sizing is a pure function of a spec, a pace and a budget: tested here without a model. `submit --budget` and the
Run page's "Time budget" are tested with a kept probe of a tiny model's pace (nothing decodes), and the default engine
with the registry's own availability."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from processes import RUN_VARIABLE

from engine.errors import SettingsError
from engine.measure.hardware import describe_hardware
from engine.service.sizing import default_engine as de
from engine.service.sizing.budget import (
    MIN_PROMPTS,
    MIN_TOKENS,
    Pace,
    default_budget,
    pace_from,
    parse_budget,
    plan_seconds,
    size_to_budget,
)
from engine.service.sizing.pace_probe import PaceProbe, _dtype, keep
from engine.session.spec import SessionSpec

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
QUICK = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[1, 2, 4], max_new_tokens=64, dtype="float32",
                    mode="quick", prompt_sample="stratified")  # fmt: skip
FULL = replace(QUICK, mode="full", detect_regime=False)
SLOW = Pace(token_s=0.5, setup_s=60.0, step_s=0.5, source="from a probe")


# ---------------------------------------------------------------------------------------------------------------------
# the budget as typed


@pytest.mark.parametrize("text, seconds", [("600s", 600), ("10m", 600), ("1.5h", 5400), (" 90 sec ", 90),
                                           ("2min", 120), ("", None), ("none", None), (None, None)])  # fmt: skip
def test_a_budget_reads_as_seconds(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["10", "ten minutes", "10x", "-5m", "0s", "30d"])
def test_a_bad_budget_is_one_clear_line(text):
    with pytest.raises(SettingsError, match="time budget"):
        parse_budget(text)


def test_ten_minutes_by_default_without_a_gpu_and_none_on_one():
    assert default_budget({"kind": "cpu"}) == 600 and default_budget({"kind": "cuda"}) is None


# ---------------------------------------------------------------------------------------------------------------------
# the sizing, a pure function


def test_no_budget_or_no_pace_leaves_the_plan_as_it_is():
    for budget, pace in ((None, SLOW), (600.0, None)):
        sized = size_to_budget(QUICK, 8, pace, budget)
        assert (sized.spec, sized.n_prompts, sized.cuts, sized.over) == (QUICK, 8, (), False)
    assert size_to_budget(QUICK, 8, SLOW, None).sentences() == []
    unknown = " ".join(size_to_budget(QUICK, 8, None, 600.0).sentences())
    assert "No pace is known" in unknown and "probe" in unknown  # nothing guessed


def test_a_plan_that_fits_is_not_cut():
    sized = size_to_budget(QUICK, 8, SLOW, 10 * 3600.0)
    assert (sized.spec, sized.n_prompts, sized.cuts) == (QUICK, 8, ())
    assert sized.sentences()[0].startswith("Fits the 10.0 h budget")


def test_the_plan_shrinks_to_fit_and_says_what_was_cut():
    before = plan_seconds(QUICK, 8, SLOW)
    sized = size_to_budget(QUICK, 8, SLOW, 600.0)
    assert before > 600 >= sized.seconds == plan_seconds(sized.spec, sized.n_prompts, SLOW)
    cut = {c.what.split(" (")[0]: c for c in sized.cuts}
    assert "batch sweep" in cut and not sized.spec.detect_regime  # first: it is not on the way to a recommendation
    assert sized.spec.max_new_tokens < 64 and cut["new tokens per prompt"].before == "64"
    assert all(c.saved_s > 0 for c in sized.cuts)
    said = " ".join(sized.sentences())
    assert "Sized to the 10 min budget: batch sweep on → off" in said and "widen any of it" in said
    assert sized.spec.prompt_sample == "stratified"  # the same selection, of fewer prompts


def test_a_full_grid_loses_its_widest_gammas_then_drafts_and_keeps_one_of_each():
    sized = size_to_budget(FULL, 8, SLOW, 240.0)
    assert sized.spec.gammas and set(sized.spec.gammas) <= {1, 2, 4} and sized.spec.drafts == [DRAFT]
    assert sized.spec.gammas == FULL.gammas[: len(sized.spec.gammas)]  # the widest went first
    unsorted = size_to_budget(replace(FULL, gammas=[4, 1, 2]), 8, SLOW, 240.0)
    assert 4 not in unsorted.spec.gammas and unsorted.spec.gammas == sized.spec.gammas
    assert [c.what for c in sized.cuts if c.what in ("γs", "drafts")]


def test_never_below_one_prompt_and_the_fewest_tokens_and_says_it_is_still_over():
    sized = size_to_budget(QUICK, 8, SLOW, 30.0)  # less than the probe's own load
    assert sized.n_prompts == MIN_PROMPTS and sized.spec.max_new_tokens == MIN_TOKENS
    assert sized.over and "Over the 30 s budget" in " ".join(sized.sentences())
    short = replace(QUICK, max_new_tokens=8)  # a plan below the floors is not grown
    assert size_to_budget(short, 1, SLOW, 30.0).spec.max_new_tokens == 8


def test_new_tokens_grow_back_after_a_draft_is_cut():
    sized = size_to_budget(FULL, 6, SLOW, 900.0)
    assert sized.spec.max_new_tokens % 8 == 0 and sized.seconds <= 900
    assert size_to_budget(FULL, 6, SLOW, 900.0, fit=False).spec == FULL


def test_a_kept_plan_only_warns():
    kept = size_to_budget(QUICK, 8, SLOW, 600.0, fit=False)
    assert (kept.spec, kept.n_prompts, kept.cuts) == (QUICK, 8, ()) and kept.over
    assert (
        kept.warning().startswith("This session's estimate, about ") and "exceeds its 10 min budget" in kept.warning()
    )
    assert size_to_budget(QUICK, 8, SLOW, 600.0).warning() is None


def test_the_sizing_charges_what_the_estimate_charges():
    from engine.service.sizing.estimate import estimate_session

    hardware = "CPU: test"
    probe = PaceProbe(hardware, "spectune", TARGET, "float32", 5.0, 0.1, 16, "now")
    for spec in (FULL, replace(QUICK, detect_regime=False)):
        estimate = estimate_session([], spec, 6, hardware, probe)
        assert estimate.rough and estimate.seconds == pytest.approx(
            plan_seconds(spec, 6, pace_from([], spec, hardware, probe))
        )
        assert estimate.decodes * spec.max_new_tokens * 0.1 + 5.0 == pytest.approx(estimate.seconds)  # every decode


def test_the_pace_is_a_finished_sessions_before_a_probe():
    hardware, now = "CPU: test", datetime.now(UTC)
    probe = PaceProbe(hardware, "spectune", TARGET, "float32", 5.0, 0.1, 16, "now")
    assert pace_from([], QUICK, hardware, probe) == Pace(0.1, 5.0, 0.1, f"from {probe.describe()}", probed=True)
    assert pace_from([], QUICK, hardware, None) is None
    done = {"id": 3, "status": "done", "hardware": hardware, "target": TARGET, "dtype": "float32", "n_prompts": 2,
            "max_new_tokens": 10, "options": {"engine": "spectune"}, "summary": {"runs": [{}], "baselines": [{}]},
            "started_at": now - timedelta(seconds=40), "finished_at": now}  # fmt: skip
    pace = pace_from([done], QUICK, hardware, probe)
    assert pace.token_s == pytest.approx(1.0) and pace.setup_s == 0 and "session #3" in pace.source


# ---------------------------------------------------------------------------------------------------------------------
# the default engine


def test_spectunes_loop_on_a_gpu_or_without_a_gguf_and_llamacpp_otherwise(monkeypatch):
    import engine.engines.llamacpp.binaries as binaries

    assert de.default_engine("qwen2.5-coder-1.5b", {"kind": "cuda"}) == de.EngineDefault("spectune")
    assert de.default_engine(TARGET, {"kind": "cpu"}).engine == "spectune"  # a tiny model has no GGUF
    monkeypatch.setattr(binaries, "llama_status", lambda: (object(), "llama-server test"))
    chosen = de.default_engine("qwen2.5-coder-1.5b", {"kind": "cpu"})
    assert chosen.engine == "llama.cpp" and "faster than spectune's PyTorch loop" in chosen.why
    monkeypatch.setattr(binaries, "llama_status", lambda: (None, "not installed"))
    assert de.default_engine("qwen2.5-coder-1.5b", {"kind": "cpu"}).engine == "spectune"
    assert not de.has_gguf("/nowhere/model.gguf") and de.has_gguf("qwen2.5-coder-0.5b")


# ---------------------------------------------------------------------------------------------------------------------
# submit --budget


def _submit(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"SPECTUNE_HOME": str(home), "PATH": "/usr/bin:/bin", RUN_VARIABLE: os.environ.get(RUN_VARIABLE, "")}
    return subprocess.run([sys.executable, "-m", "engine", "submit", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _slow_probe(home: Path, monkeypatch: pytest.MonkeyPatch, spec: SessionSpec) -> None:
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    keep(PaceProbe(str(describe_hardware()["label"]), spec.engine, spec.target, _dtype(spec), 60.0, 0.5, 16, "now"))


def test_submit_budget_sizes_the_estimate_and_warns_before_queueing(tmp_path, monkeypatch):
    from store import open_store

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "p{i}", "category": "{"ab"[i % 2]}"}}\n' for i in range(10)))
    base = ["--prompts", str(prompts), "--target", TARGET, "--draft", DRAFT, "--gamma", "2", "--dtype", "float32",
            "--engine", "spectune", "--max-prompts", "8"]  # fmt: skip
    bad = _submit(tmp_path, *base, "--budget", "10 minutes")
    assert bad.returncode == 2 and "time budget '10 minutes'" in bad.stderr and "Traceback" not in bad.stderr
    unknown = _submit(tmp_path, *base, "--budget", "2m", "--estimate")
    assert unknown.returncode == 0 and "budget: No pace is known" in unknown.stdout

    _slow_probe(tmp_path, monkeypatch, SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[2], dtype="float32"))
    sized = _submit(tmp_path, *base, "--budget", "3m", "--estimate")
    assert sized.returncode == 0, sized.stderr
    assert "budget: Sized to the 3 min budget: " in sized.stdout and "new tokens per prompt 64 → " in sized.stdout
    assert "configuration(s) to run live" in sized.stdout  # the estimate, of the sized plan
    assert (
        not (tmp_path / "spectune.db").exists()
        or open_store(f"sqlite:///{tmp_path / 'spectune.db'}").list_sessions() == []
    )

    queued = _submit(tmp_path, *base, "--budget", "3m")
    assert queued.returncode == 0, queued.stderr
    kept = _submit(tmp_path, *base, "--budget", "3m", "--keep-plan")
    assert kept.returncode == 0 and kept.stderr.startswith("warning: This session's estimate, about ")
    rows = open_store(f"sqlite:///{tmp_path / 'spectune.db'}").list_sessions()  # newest first
    assert [(r["n_prompts"], r["max_new_tokens"]) for r in rows][0] == (8, 64)  # as given
    assert rows[1]["max_new_tokens"] < 64 or rows[1]["n_prompts"] < 8  # sized


def test_submit_defaults_to_llamacpp_without_a_gpu_and_says_why(tmp_path):
    from engine.engines import registry

    if describe_hardware()["kind"] != "cpu" or not registry.get("llama.cpp").availability()[0]:
        pytest.skip("llama.cpp is the default only on a machine without a GPU where it is installed")
    prompts = tmp_path / "p.txt"
    prompts.write_text("Say hello.\n")
    done = _submit(tmp_path, "--prompts", str(prompts), "--draft", "ngram", "--gamma", "2", "--estimate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("engine: llama.cpp (llama-server) is the default here: ")
    assert "--engine spectune runs that loop" in done.stdout
    loop = _submit(tmp_path, "--prompts", str(prompts), "--draft", "ngram", "--estimate", "--engine", "spectune")
    assert loop.returncode == 0 and "is the default here" not in loop.stdout
    suffix = _submit(tmp_path, "--prompts", str(prompts), "--draft", "suffix", "--estimate")  # llama.cpp refuses it
    assert suffix.returncode == 0, suffix.stderr
    assert suffix.stdout.startswith("engine: spectune's loop, since llama.cpp (llama-server) would refuse this session")
