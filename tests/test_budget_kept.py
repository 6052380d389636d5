"""A session keeps its time budget and, once done, says how it kept it; the Run page sizes its form on its own.

Sessions are queued through the service (submit_session, `submit --budget`) into a real store; their start and end
are the store's own clock, set by the test. The Run page runs under streamlit's AppTest; a pace comes from a
finished session stored here, or from a probe whose measurement is given (nothing decodes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from processes import RUN_VARIABLE
from streamlit.testing.v1 import AppTest
from test_app_pages import (  # noqa: F401 - env: fixture
    DRAFT,
    HOME,
    TARGET,
    add_prompts,
    assert_clean,
    env,
    fill_run_form,
    page,
    texts,
    unescape_md,
)

from engine.errors import SettingsError
from engine.measure.hardware import describe_hardware
from engine.service.jobs import submit_session
from engine.service.report.document import session_report_html
from engine.service.sizing.budget import budget_facts, budget_outcome
from engine.session.spec import SessionSpec, validate
from store import Store
from store import sessions as store_sessions

ROOT = Path(__file__).resolve().parents[1]
SPEC = SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[2], max_new_tokens=8, dtype="float32", device="cpu")
START = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)  # a session's start, where only its wall time matters


def ended(store: Store, took_s: float, budget_s: float | None, ago_s: float = 0.0) -> int:
    """A session queued with `budget_s` through the service, started `ago_s` + `took_s` ago and ended `took_s`
    later, with no runs."""
    set_id = add_prompts(store, [("p1", "a"), ("p2", "b")], name=f"set {took_s} {budget_s}")
    sid = submit_session(store, replace(SPEC, time_budget_s=budget_s), set_id, 2, f"took {took_s}")
    end = datetime.now(UTC) - timedelta(seconds=ago_s)
    with pytest.MonkeyPatch.context() as clock:
        clock.setattr(store_sessions, "utcnow", lambda: end - timedelta(seconds=took_s))
        assert store.claim_next_session("test:1")["id"] == sid
        clock.setattr(store_sessions, "utcnow", lambda: end)
        store.finish_session(sid, "done", summary={"runs": []})
    return sid


# ---------------------------------------------------------------------------------------------------------------------
# the budget as stored, and said once the session ends


def test_the_spec_keeps_its_budget_in_its_options_and_refuses_a_bad_one():
    row = replace(SPEC, time_budget_s=600.0).to_row()
    assert row["options"]["time_budget_s"] == 600.0 and SessionSpec.from_row(row).time_budget_s == 600.0
    assert SessionSpec.from_row({**SPEC.to_row(), "options": {}}).time_budget_s is None  # a row from before budgets
    for bad in (0, -5.0, float("nan"), "10m", True):
        with pytest.raises(SettingsError, match="time budget"):
            validate(replace(SPEC, time_budget_s=bad))


@pytest.mark.parametrize("took, said", [(492.0, "10 min: took 8.2 min (within)"),
                                        (786.0, "10 min: took 13.1 min (over by 31%)"),
                                        (600.0, "10 min: took 10.0 min (within)"),
                                        (45.0, "10 min: took 45 s (within)")])  # fmt: skip
def test_a_done_session_says_how_it_kept_its_budget(took, said):
    session = {"status": "done", "options": {"time_budget_s": 600.0}, "started_at": START,
               "finished_at": START + timedelta(seconds=took)}  # fmt: skip
    assert budget_outcome(session) == said and budget_facts(session) == [("time budget", said)]


def test_without_a_budget_nothing_is_said_and_unfinished_says_the_budget_alone():
    assert budget_outcome({"status": "done", "options": {}, "started_at": START, "finished_at": START}) is None
    assert budget_facts({"status": "done"}) == []
    assert budget_outcome({"status": "running", "options": {"time_budget_s": 600}, "started_at": START}) == "10 min"
    assert budget_outcome({"status": "cancelled", "options": {"time_budget_s": 90.0}, "started_at": START,
                           "finished_at": START + timedelta(minutes=5)}) == "2 min"  # fmt: skip


def test_the_pages_and_the_report_say_within_or_over_by(env):  # noqa: F811 - the pages\' fixture
    over = ended(env.store, 786.0, 600.0)
    within = ended(env.store, 492.0, 600.0)
    none = ended(env.store, 786.0, None)
    for sid, said in ((over, "10 min: took 13.1 min (over by 31%)"), (within, "10 min: took 8.2 min (within)")):
        sessions = page("pages/3_Sessions.py", {"session": str(sid)})
        assert_clean(sessions)
        assert f"**time budget** {said}" in unescape_md(texts(sessions.markdown))
        run = page("pages/2_Run.py", {"session": str(sid)})
        assert_clean(run)
        assert f"Time budget {said}." in unescape_md(texts(run.caption))
        assert f"<tr><th>time budget</th><td>{said}</td></tr>" in session_report_html(env.store, sid)
    sessions, run = page("pages/3_Sessions.py", {"session": str(none)}), page("pages/2_Run.py", {"session": str(none)})
    assert "time budget" not in texts(sessions.markdown).lower() and "Time budget" not in texts(run.caption)
    assert "time budget" not in session_report_html(env.store, none)


def test_the_run_page_keeps_the_budget_a_session_starts_with(env):  # noqa: F811 - the pages\' fixture
    add_prompts(env.store, [("p1", None), ("p2", None)])
    at = page("pages/2_Run.py")
    fill_run_form(at)
    at.text_input(key="budget").input("1.5h")
    at.button(key="start_session").click()
    at.run()
    at.text_input(key="budget").input("")
    at.button(key="start_session").click()
    at.run()
    assert_clean(at)
    kept = [(s.get("options") or {}).get("time_budget_s") for s in env.store.list_sessions()]  # newest first
    assert kept == [None, 5400.0]


def _submit(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    variables = {"SPECTUNE_HOME": str(home), "PATH": "/usr/bin:/bin", RUN_VARIABLE: os.environ.get(RUN_VARIABLE, "")}
    return subprocess.run([sys.executable, "-m", "engine", "submit", *args], cwd=ROOT, env=variables,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_submit_keeps_the_budget_with_the_session(tmp_path):
    from store import open_store

    prompts = tmp_path / "p.txt"
    prompts.write_text("Say hello.\nName a colour.\n")
    base = ["--prompts", str(prompts), "--target", TARGET, "--draft", DRAFT, "--gamma", "2", "--dtype", "float32",
            "--engine", "spectune"]  # fmt: skip
    for budget in ("7m", "none"):
        done = _submit(tmp_path, *base, "--budget", budget)
        assert done.returncode == 0, done.stderr
    rows = open_store(f"sqlite:///{tmp_path / 'spectune.db'}").list_sessions()  # newest first
    assert [(r.get("options") or {}).get("time_budget_s") for r in rows] == [None, 420.0]
    variables = {"SPECTUNE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    listing = subprocess.run([sys.executable, "-m", "engine", "sessions"], cwd=ROOT, env=variables,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listing.returncode == 0 and listing.stdout.count("time budget 7 min") == 1, listing.stdout


# ---------------------------------------------------------------------------------------------------------------------
# the Run page sizes its form on its own, once


def comparable(store: Store, at: AppTest, seconds: float) -> int:
    """A finished session of the form's target, engine and dtype on this machine that took `seconds` for 2
    configurations × 2 prompts × 8 tokens: the pace the page sizes its form at."""
    sid = store.create_session(target=at.selectbox(key="target_choice").value, drafts=["ngram"], gammas=[2],
                               temperatures=[0.0], max_new_tokens=8, n_prompts=2, dtype=at.selectbox(key="dtype").value,
                               options={"engine": at.radio(key="engine").value})  # fmt: skip
    now = datetime.now(UTC)
    with pytest.MonkeyPatch.context() as clock:
        clock.setattr(store_sessions, "utcnow", lambda: now - timedelta(seconds=seconds))
        store.claim_next_session("test:1")
        clock.setattr(store_sessions, "utcnow", lambda: now)
        store.set_hardware(sid, str(describe_hardware()["label"]))
        store.finish_session(sid, "done", summary={"runs": [{}], "baselines": [{}]})
    return sid


def first_visit(budget: str) -> AppTest:
    at = AppTest.from_file(str(HOME), default_timeout=30)
    at.session_state["budget"] = budget  # the budget a machine without a GPU starts with, wherever this runs
    at.switch_page("pages/2_Run.py")
    return at.run()


def test_a_first_visit_is_sized_at_a_finished_sessions_pace_once(env):  # noqa: F811 - the pages\' fixture
    add_prompts(env.store, [(f"p{i}", "ab"[i % 2]) for i in range(10)])
    defaults = page("pages/2_Run.py")  # the form as a first visit draws it
    assert_clean(defaults)
    asked = (defaults.number_input(key="max_new").value, defaults.number_input(key="n_prompts").value)
    sid = comparable(env.store, defaults, 320.0)  # 10 s per configuration × prompt × token
    at = first_visit("10m")
    assert_clean(at)
    said = unescape_md(texts(at.info))
    assert "Sized to the 10 min budget: " in said and f"at the pace of session #{sid}" in said, said
    sized = (at.number_input(key="max_new").value, at.number_input(key="n_prompts").value)
    assert sized[0] < asked[0] or sized[1] < asked[1], (asked, sized)
    at.number_input(key="max_new").set_value(64)  # widened by hand: never sized again, the budget only warns
    at.button(key="estimate_session").click()
    at.run()
    assert_clean(at)
    assert at.number_input(key="max_new").value == 64
    assert "exceeds its 10 min budget" in unescape_md(texts(at.warning)) and "Sized to" not in texts(at.info)
    at.switch_page("pages/3_Sessions.py").run()
    at.switch_page("pages/2_Run.py").run()  # a later visit: the form as the user left it
    assert at.number_input(key="max_new").value == 64 and "Sized to" not in texts(at.info)


def test_a_first_visit_without_a_finished_session_is_left_as_it_is(env):  # noqa: F811 - the pages\' fixture
    add_prompts(env.store, [(f"p{i}", "ab"[i % 2]) for i in range(10)])
    at = first_visit("10m")
    assert_clean(at)
    assert at.number_input(key="max_new").value == 64 and "Sized to" not in texts(at.info)


def test_a_probe_sizes_the_form_on_its_own_once_and_then_only_warns(env, monkeypatch):  # noqa: F811 - the pages\' fixture
    import engine.service.sizing.estimate
    from engine.service.sizing.pace_probe import PaceProbe, _dtype, keep

    def probe_for(store, spec, prompt, n_prompts, on_progress=None):  # the target alone at 0.5 s a token
        probe = PaceProbe(str(describe_hardware()["label"]), spec.engine, spec.target, _dtype(spec), 20.0, 0.5, 16,
                          "now")  # fmt: skip
        keep(probe)
        return probe, 28.0

    monkeypatch.setattr(engine.service.sizing.estimate, "probe_for", probe_for)
    add_prompts(env.store, [(f"p{i}", "ab"[i % 2]) for i in range(10)])
    at = first_visit("2m")
    fill_run_form(at)
    at.radio(key="engine").set_value("spectune")
    at.number_input(key="max_new").set_value(64)
    at.number_input(key="n_prompts").set_value(8)
    at.button(key="probe_pace").click()
    at.run()
    assert_clean(at)
    said = unescape_md(texts(at.info))
    assert said.startswith("Probed the target alone in 28 s") and "Sized to the 2 min budget: " in said, said
    assert re.search(r"new tokens per prompt 64 → \d+", said), said
    assert at.number_input(key="max_new").value < 64
    at.number_input(key="max_new").set_value(64)  # widened by hand after the fit: a second probe leaves it
    at.button(key="probe_pace").click()
    at.run()
    assert_clean(at)
    assert at.number_input(key="max_new").value == 64 and "Sized to" not in texts(at.info)
    assert "exceeds its 2 min budget" in unescape_md(texts(at.warning))
