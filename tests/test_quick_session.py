"""A quick session through the worker (real SQLite, tiny in-process models): the target alone and each draft
once at the widest γ, the grid predicted from that pass by the same recommendation and policy replay the pages
show, and what they chose confirmed live beside the target alone."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.engines import registry
from engine.errors import SettingsError
from engine.models.pool import ModelPool
from engine.service.decide.policies import recommendation_for, session_policies
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.session.aa_check import aa_count
from engine.session.quick import Choice, ConfirmChoices, confirm_plan, confirm_reserve, probe_gamma, probe_plan
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec, validate
from engine.session.summary import RUN_COLUMNS
from store import Store, open_store
from tests.test_llamacpp import no_server_left_behind as no_server_left_behind  # autouse: every server stops

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
PROMPTS = [f"count {i}: one two three four five six seven eight" for i in range(4)]
LLAMA_PROMPTS = ["Write a Python function that returns the sum of a list.", "List the first ten prime numbers."]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    yield s
    s.close()


def spec(**over: Any) -> SessionSpec:
    base = {"target": TARGET, "drafts": [DRAFT, "ngram"], "gammas": [1, 2, 3], "temperatures": [0.0],
            "max_new_tokens": 24, "dtype": "float32", "device": "cpu", "chat_template": False,
            "detect_regime": False, "mode": "quick"}  # fmt: skip
    return SessionSpec(**(base | over))


def run(store: Store, settings: SessionSpec) -> int:
    set_id, _, _ = store.add_prompt_set("q", "q.txt", [{"text": p, "category": None} for p in PROMPTS])
    sid = submit_session(store, settings, set_id)
    assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
    return sid


def test_the_probe_is_the_baseline_and_each_draft_once_at_the_widest_gamma() -> None:
    s = spec(temperatures=[0.0, 0.7])
    assert probe_gamma(s) == 3 and probe_gamma(spec(gammas=[], policies=["confidence:0.6:16:0"])) == 8
    assert [k.label() for k in probe_plan(s)] == [
        "baseline T=0", "baseline T=0.7", f"{DRAFT} γ=3 T=0", f"{DRAFT} γ=3 T=0.7", "ngram γ=3 T=0", "ngram γ=3 T=0.7",
    ]  # fmt: skip
    best = [Choice("best fixed γ", DRAFT, 3, 0.0, 1.5), Choice("best fixed γ", "ngram", 2, 0.0, 1.2)]
    decision = ConfirmChoices(best)
    plan = confirm_plan(s, decision, probe_plan(s))
    assert plan == [RunKey("none", 0, 0.0), RunKey("ngram", 2, 0.0)]  # the probe measured the draft at γ=3 already
    assert confirm_plan(s, ConfirmChoices([Choice("best fixed γ", DRAFT, 3, 0.0, 1.5)]), probe_plan(s)) == []
    with pytest.raises(SettingsError, match="mode 'fast'"):
        validate(spec(mode="fast"))


def test_an_engine_whose_loop_costs_a_step_more_probes_each_draft_model_at_two_widths() -> None:
    # llama.cpp's step overhead is fitted per step and per verified token: one width cannot tell them apart
    s = spec(gammas=[1, 2, 4])
    assert registry.get("llama.cpp").two_width_probe and not registry.get("spectune").two_width_probe
    assert [k.label() for k in probe_plan(s, two_widths=True)] == [
        "baseline T=0", f"{DRAFT} γ=1 T=0", f"{DRAFT} γ=4 T=0", "ngram γ=4 T=0",  # n-gram lookup: no draft forward
    ]  # fmt: skip
    assert [k.label() for k in probe_plan(spec(gammas=[4]), two_widths=True)][1:] == [f"{DRAFT} γ=4 T=0",
                                                                                    "ngram γ=4 T=0"]  # fmt: skip


def test_a_quick_session_confirms_what_the_one_model_chose(store: Store) -> None:
    sid = run(store, spec())
    session = store.get_session(sid)
    quick = session["summary"]["quick"]
    runs = store.list_runs(sid)
    speculative = [r for r in runs if r["kind"] == "speculative"]
    probed = [(r["draft"], r["gamma"]) for r in speculative[:2]]
    assert probed == [(DRAFT, 3), ("ngram", 3)]  # the probe: each draft once, at the widest γ
    assert quick["probe"] == ["baseline T=0", f"{DRAFT} γ=3 T=0", "ngram γ=3 T=0"]
    assert len(speculative) < 2 * 3  # fewer live runs than the full grid (2 drafts × 3 γ)
    confirmed = quick["confirmed"]
    assert confirmed and {c["role"] for c in confirmed} <= {"recommended", "best fixed γ"}
    for c in confirmed:  # each choice has its live measurement (the confirmation's run, or the probe's)
        matching = [
            r
            for r in speculative
            if r["draft"] == c["draft"]
            and (
                r["gamma"] == c["gamma"]
                if c["policy"] is None
                else (r.get("summary") or {}).get("policy") == c["policy"]
            )
        ]
        assert matching, c
        assert c["predicted_speedup"] > 0 and c["measured_speedup"] > 0
        # like with like: the whole run's speedup (tokens/s over every prompt ÷ the baseline's) ÷ the prediction
        stored = matching[-1].get("summary") or {}
        whole = stored.get("speedup_whole_run") or (stored.get("policy_live") or {}).get("speedup_whole_run")
        assert c["measured_whole_run"] == pytest.approx(whole) and whole > 0
        assert c["measured_over_predicted"] == pytest.approx(c["measured_whole_run"] / c["predicted_speedup"])
    baselines = [r for r in runs if r["kind"] == "baseline"]
    assert len(baselines) == (2 if len(speculative) > 2 else 1)  # a confirmation brings its own baseline
    assert 0 < quick["probe_s"] <= quick["time_to_confirmed_s"]
    # the choice is what the pages say for the probe's runs alone: the recommendation and the policy replay
    fixed = next(c for c in confirmed if c["role"] == "best fixed γ")
    assert fixed["gamma"] >= 1 and fixed["draft"] in (DRAFT, "ngram")


def test_the_full_mode_still_measures_every_configuration(store: Store) -> None:
    sid = run(store, spec(mode="full", drafts=["ngram"], gammas=[1, 2]))
    session = store.get_session(sid)
    assert "quick" not in session["summary"] or session["summary"]["quick"] is None
    assert sorted(r["gamma"] for r in store.list_runs(sid) if r["kind"] == "speculative") == [1, 2]


def test_a_full_session_runs_a_headline_its_grid_did_not_measure_live(store: Store) -> None:
    """The grid (n-gram γ=1 only) cannot hold the one model's recommendation for text that repeats: with
    `confirm`, the session ends by running that γ live beside the target alone, and the Run page says so."""
    from app.run_view import confirmation_lines

    sid = run(store, spec(mode="full", drafts=["ngram"], gammas=[1], confirm=True))
    session = store.get_session(sid)
    done = session["summary"]["confirmation"]
    fixed = next(c for c in done["confirmed"] if c["role"] == "best fixed γ")
    assert fixed["gamma"] > 1, done  # repeated text: the model predicts more than one token a step pays
    assert done["ran"] == [f"ngram γ={fixed['gamma']} T=0"]
    runs = store.list_runs(sid)
    assert [(r["kind"], r["gamma"]) for r in runs] == [("baseline", 0), ("speculative", 1), ("baseline", 0),
                                                        ("speculative", fixed["gamma"])]  # fmt: skip
    assert fixed["measured_speedup"] > 0 and fixed["measured_over_predicted"] > 0
    assert 0 < done["grid_s"] and 0 < done["confirm_s"]
    # the total planned at the start never changes: the grid (the target alone and n-gram γ=1 on every prompt, the A/A
    # decode on one rotation of 3) and the most a confirmation may add; what it did not need counts as done at its end
    reserved = confirm_reserve(spec(mode="full", drafts=["ngram"], gammas=[1], confirm=True), len(PROMPTS))
    assert session["progress_done"] == session["progress_total"] == 2 * len(PROMPTS) + aa_count(4, 2) + reserved
    lines = confirmation_lines(session)
    assert lines[0].startswith(f"The grid's recommendation was not in the grid: ran ngram γ={fixed['gamma']}")
    assert any(f"ngram γ={fixed['gamma']} T=0 — predicted" in line for line in lines), lines


def test_a_full_session_whose_grid_holds_its_best_fixed_gamma_runs_no_fixed_gamma_again(store: Store) -> None:
    """Every fixed γ the model can choose here (n-gram saturates below γ=8) is in the grid: none runs again. A
    policy the replay predicts above every fixed γ is not in the grid, and is the one thing that may run."""
    sid = run(store, spec(mode="full", drafts=["ngram"], gammas=[1, 2, 3, 4, 5, 6, 7, 8], confirm=True,
                          max_new_tokens=16))  # fmt: skip
    done = store.get_session(sid)["summary"]["confirmation"]
    fixed = next(c for c in done["confirmed"] if c["role"] == "best fixed γ")
    assert 1 <= fixed["gamma"] <= 8 and f"ngram γ={fixed['gamma']} T=0" not in done["ran"], done
    policies = [c["configuration"] for c in done["confirmed"] if c["role"] == "recommended"]
    assert done["ran"] == policies, done  # only the recommended policy, when there is one
    assert len(store.list_runs(sid)) == 9 + (1 + len(policies) if policies else 0)  # the grid, + its confirmation


def test_the_decision_equals_the_recommendation_from_the_probe(store: Store) -> None:
    """The probe's runs, read back as a finished session would be, give the same fixed γ the quick session
    confirmed: one model, one answer."""
    sid = run(store, spec(drafts=["ngram"], gammas=[1, 2, 4]))
    quick = store.get_session(sid)["summary"]["quick"]
    probe_only = open_probe_copy(store, sid)
    report = session_policies(store, [probe_only], engine="spectune", temperature=0.0)
    rec = report.recommendation if not report.recommendation.off else recommendation_for(report)
    fixed = next(c for c in quick["confirmed"] if c["role"] == "best fixed γ")
    assert (fixed["draft"], fixed["gamma"]) == (rec.draft_name, rec.gamma)
    assert fixed["predicted_speedup"] == pytest.approx(rec.predicted_speedup)


@pytest.mark.real_model  # the draft's trace is recorded in PyTorch (float32)
def test_a_quick_llamacpp_session_confirms_the_headline_recommendation(store: Store) -> None:
    """In llama.cpp n-gram lookup has no recorded pass (no policy to replay), so the policy report's chosen draft
    can be the draft model while the headline recommends n-gram: the quick session confirms the headline, the
    recommendation every page and export gives for the probe's runs."""
    settings = spec(target="qwen2.5-coder-1.5b", drafts=["qwen2.5-coder-0.5b", "ngram"], gammas=[1, 3],
                    max_new_tokens=16, engine="llama.cpp", dtype="float32")  # fmt: skip
    set_id, _, _ = store.add_prompt_set("q", "q.txt", [{"text": p, "category": None} for p in LLAMA_PROMPTS])
    sid = submit_session(store, settings, set_id)
    assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
    quick = store.get_session(sid)["summary"]["quick"]
    widths = sorted(int(label.split("γ=")[1].split()[0]) for label in quick["probe"] if "0.5b" in label)
    assert widths == [1, 3]  # llama.cpp's loop overhead is fitted at two widths
    runs = [r for r in store.list_runs(sid) if r["draft"] == "qwen2.5-coder-0.5b" and r["kind"] == "speculative"]
    probed = runs[: len(widths)]  # the probe's runs, stored first: the two widths its loop overhead is fitted on
    # each probed run measured its verify inside the loop, and both carry the one overhead fitted over them (None
    # where the fit is zero: a busy machine can time the loop's verify below the fit)
    assert all(r["summary"]["verify_in_loop"] for r in probed)
    assert len({json.dumps(r["summary"]["step_overhead"]) for r in probed}) == 1
    probe_only = open_probe_copy(store, sid, probe_runs=4)
    headline = session_policies(store, [probe_only], engine="llama.cpp", temperature=0.0).recommendation
    fixed = next(c for c in quick["confirmed"] if c["role"] == "best fixed γ")
    if not headline.off:
        assert (fixed["draft"], fixed["gamma"]) == (headline.draft_name, headline.gamma)
        assert fixed["predicted_speedup"] == pytest.approx(headline.predicted_speedup)
    assert fixed["measured_speedup"] and fixed["measured_over_predicted"] > 0


def open_probe_copy(store: Store, sid: int, probe_runs: int = 2) -> int:
    """A finished session holding only the quick session's probe runs (the first `probe_runs`, baseline included:
    the evidence the decision had)."""
    session = store.get_session(sid)
    runs = store.list_runs(sid)
    probe = {(r["draft"], r["gamma"], r["kind"]) for r in runs[:probe_runs]}
    copy = store.create_session(target=session["target"], drafts=session["drafts"], gammas=session["gammas"],
                                temperatures=session["temperatures"], max_new_tokens=session["max_new_tokens"],
                                options=session["options"])  # fmt: skip
    for r in runs:
        if (r["draft"], r["gamma"], r["kind"]) not in probe or r["kind"] == "baseline" and r["id"] != runs[0]["id"]:
            continue
        run_id = store.create_run(copy, r["draft"], r["gamma"], r["temperature"], r["kind"])
        store.finish_run(run_id, r.get("summary") or {}, **{k: r[k] for k in SUMMARY_COLUMNS if k in r})
    store.finish_session(copy, "done", summary=session["summary"])
    return copy


SUMMARY_COLUMNS = RUN_COLUMNS


def test_submit_defaults_to_quick_and_takes_policies(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    env = {"SPECTUNE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "engine", "submit", "--target", TARGET, "--draft", "ngram",
                           "--gamma", "2", "--policy", "confidence:0.6:16:0", "--prompts", str(prompts),
                           "--dtype", "float32", "--no-chat-template"], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    s = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    try:
        options = s.list_sessions()[0]["options"]
    finally:
        s.close()
    assert options["mode"] == "quick" and options["policies"] == ["confidence:0.6:16:0"]
    bad = subprocess.run([sys.executable, "-m", "engine", "submit", "--mode", "fast", "--prompts", str(prompts)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'fast'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_progress_bar_starts_at_the_planned_total_and_never_goes_back(store: Store) -> None:
    """Queued, the session shows the decodes it plans (its confirmation at its most); running, the total never
    grows, so the bar never falls back (it once went from 100% to 60% when the confirmation began)."""
    from engine.service.sizing.estimate import planned_decodes

    writes: list[tuple[int, int]] = []
    recorded = store.set_progress

    def set_progress(session_id: int, done: int, total: int) -> None:
        writes.append((done, total))
        recorded(session_id, done, total)

    store.set_progress = set_progress  # type: ignore[method-assign]
    settings = spec()
    sid = run(store, settings)
    planned = planned_decodes(settings, len(PROMPTS))
    assert writes[0] == (0, planned) and planned > len(PROMPTS) * len(probe_plan(settings))
    totals = [total for _, total in writes]
    assert all(later <= earlier for earlier, later in zip(totals, totals[1:], strict=False)), str(writes)
    fractions = [done / total for done, total in writes if total]
    assert all(later >= earlier for earlier, later in zip(fractions, fractions[1:], strict=False)), writes
    session = store.get_session(sid)
    assert session["progress_done"] == session["progress_total"] > 0
