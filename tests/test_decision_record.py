"""One decision per query, made once when a session ends, stored, and read by every place that shows it.

A real quick session runs through the worker (real SQLite, tiny in-process models); then the stored decision, the
Run page's summary, the Recommend page, `engine recommend` and a second read are compared: one configuration,
one predicted figure, its measured run or the words "not measured"."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.models.pool import ModelPool
from engine.service.decide.decisions import Decision, DecisionQuery, canonical, decision_for
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.session.spec import SessionSpec
from store import Store, open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
PROMPTS = [f"count {i}: one two three four five six seven eight" for i in range(4)]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, int, Path]]:
    home = tmp_path_factory.mktemp("home")
    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    set_id, _, _ = store.add_prompt_set("q", "q.txt", [{"text": p, "category": None} for p in PROMPTS])
    spec = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[1, 2, 3], temperatures=[0.0],
                       max_new_tokens=24, dtype="float32", device="cpu", chat_template=False, detect_regime=False,
                       mode="quick")  # fmt: skip
    sid = submit_session(store, spec, set_id)
    assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
    yield store, sid, home
    store.close()


def test_the_worker_stores_one_decision_and_every_reader_reads_it(session) -> None:
    store, sid, _ = session
    query = DecisionQuery(temperature=0.0)
    stored = store.get_decision([sid], _key(store, sid))
    assert stored is not None, "the worker stored the decision when the session ended"
    decision = Decision.from_dict(stored["payload"])
    assert decision_for(store, [sid], query) == decision
    again = decision_for(store, [sid], DecisionQuery())  # the same question asked without its defaults spelled out
    assert again == decision
    assert decision.floor is not None and "Measurement floor" in decision.floor["sentence"]
    if decision.off:
        assert decision.headline().startswith("Speculation off")
        return
    assert decision.predicted_speedup is not None
    figure = f"predicted {decision.predicted_speedup:.2f}×"
    assert figure in decision.headline()
    assert (decision.measured is None) == ("not measured" in decision.headline())
    # a quick session confirms the configuration its final decision names
    assert decision.measured is not None, decision.headline()
    assert decision.measured["session_id"] == sid and decision.measured["speedup"] > 0


def _key(store: Store, sid: int) -> str:
    from engine.service.decide.decisions import canonical

    return canonical(store, [sid], DecisionQuery(temperature=0.0)).key()


def test_the_run_page_and_the_cli_say_the_stored_decision(session) -> None:
    from app.run_view import choice_lines

    store, sid, home = session
    decision = decision_for(store, [sid], DecisionQuery(temperature=0.0))
    runs = store.list_runs(sid)
    lines = choice_lines(store.get_session(sid), runs, {0.0: decision})
    assert lines.count(f"Decision: {decision.headline()}") == 1
    recommended = [line for line in lines if line.startswith("Recommended")]
    assert len(recommended) <= 1, lines  # one answer: never a second configuration called recommended
    if not decision.off and decision.measured is not None:
        assert len(recommended) == 1 and (decision.policy or f"γ={decision.gamma}") in recommended[0], lines
        assert f"predicted {decision.predicted_speedup:.2f}×" in recommended[0], lines  # one figure, not two
    env = {**os.environ, "SPECTUNE_HOME": str(home), "SPECTUNE_DB_URL": f"sqlite:///{home / 'spectune.db'}"}
    done = subprocess.run([sys.executable, "-m", "engine", "recommend", "--session", str(sid)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"decision: {decision.headline()}" in done.stdout
    out = home / "report.html"
    done = subprocess.run([sys.executable, "-m", "engine", "report", "--session", str(sid), "--html", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert html.escape(decision.headline(), quote=False) in out.read_text(), "the report says the stored decision"


def test_confirm_it_queues_that_configuration_alone_and_its_run_is_then_the_measurement(session) -> None:
    """A decision no run measured (a γ the session never ran) queues a session of that configuration alone, on the
    same prompts; once it has run, the decision's measured run is found for it."""
    from dataclasses import replace

    from engine.errors import SpectuneError
    from engine.service.decide.decisions import measured_run, queue_confirmation

    store, sid, _ = session
    decided = decision_for(store, [sid], DecisionQuery(temperature=0.0))
    if decided.measured is not None:  # a quick session confirmed what it decided: nothing more to queue
        with pytest.raises(SpectuneError, match="measured already"):
            queue_confirmation(store, [sid], decided)
    unmeasured = replace(decided, configuration="ngram γ=5", draft="ngram", gamma=5, policy=None, measured=None)
    new = queue_confirmation(store, [sid], unmeasured)
    row = store.get_session(new)
    assert row["drafts"] == ["ngram"] and row["gammas"] == [5] and row["prompt_set_id"] == store.get_session(sid)[
        "prompt_set_id"]  # fmt: skip
    assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
    runs = [r for i in (sid, new) for r in store.list_runs(i)]
    found = measured_run(store, runs, {"draft": "ngram", "gamma": 5, "policy": None}, 0.0)
    assert found is not None and found["session_id"] == new and found["speedup"] > 0
    assert [r["kind"] for r in store.list_runs(new)] == ["baseline", "speculative"]  # that configuration alone
    with pytest.raises(SpectuneError, match="off"):
        queue_confirmation(store, [sid], replace(decided, configuration=None, draft=None, gamma=0, measured=None))


def test_a_read_only_store_still_answers_and_is_left_untouched(session, tmp_path) -> None:
    """A query never asked before, on a database that cannot be written: the decision is made and shown, nothing
    is written, and the file is byte for byte what it was."""
    import hashlib
    import shutil

    store, sid, home = session
    copy = tmp_path / "ro.db"
    store.engine.dispose()  # the WAL checkpointed into the file before it is copied
    shutil.copy(home / "spectune.db", copy)
    copy.chmod(0o444)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    ro = open_store(f"sqlite:///{copy}")
    try:
        assert ro.read_only
        asked = DecisionQuery(objective="cost", batch_size=3, temperature=0.0)  # stored by nobody yet
        decision = decision_for(ro, [sid], asked)
        assert decision.query["objective"] == "cost" and decision.headline()
    finally:
        ro.close()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest


def test_a_stored_analysis_that_no_longer_reads_is_made_again(session) -> None:
    """An analysis stored by other records (here: not an analysis at all) is made again and stored readable."""
    store, sid, _ = session
    query = DecisionQuery(objective="cost", temperature=0.0)
    made = decision_for(store, [sid], query)
    key = canonical(store, [sid], query).key()  # the key it was stored under
    row = store.get_decision([sid], key)
    assert row is not None and "analysis" in row["payload"]
    store.save_decision([sid], key, row["runs_seen"], made.to_dict() | {"analysis": {"recommendation": 3}})
    assert decision_for(store, [sid], query) == made
    assert store.get_decision([sid], key)["payload"]["analysis"]["recommendation"] != 3


def test_a_stale_decision_is_made_again_and_a_fresh_one_is_read(session, monkeypatch) -> None:
    """A stored decision is read as it is (nothing predicts again); a run stored since makes it stale."""
    import engine.service.decide.decisions as decisions

    store, sid, _ = session
    query = DecisionQuery(temperature=0.0)
    decision_for(store, [sid], query)
    calls: list[int] = []
    made = decisions.analyse
    monkeypatch.setattr(decisions, "analyse", lambda *a, **k: calls.append(1) or made(*a, **k))
    decision_for(store, [sid], query)
    assert calls == [], "a stored decision was made again on a read"
    run = next(r for r in store.list_runs(sid) if r["kind"] == "speculative")
    store.update_run(run["id"], speedup_measured=(run.get("speedup_measured") or 1.0) + 0.5)  # a stored row changes
    decision_for(store, [sid], query)
    assert calls == [1], "a decision stayed stored after a row it rests on changed"
    store.update_run(run["id"], speedup_measured=run.get("speedup_measured"))
    decision_for(store, [sid], query)
    store.create_run(sid, "ngram", 9, 0.0, "speculative")  # the last test of the module: the session changes
    decision_for(store, [sid], query)
    assert calls == [1, 1, 1]


def test_no_page_or_command_predicts_again_once_the_decision_is_stored(session, monkeypatch, tmp_path) -> None:
    """Once the worker stored the decision, the Recommend and Policies pages, `recommend`, `policies` and the
    report read its analysis: the recommender and the policy replay are never called."""
    import streamlit as st

    import engine.service.decide.analysis as analysis
    import engine.service.report.recommendation as report_recommendation
    from app.recommend_view import evidence as recommend_view
    from engine.service.decide.policies import PolicyReport
    from engine.service.decide.recommendations import recommend_and_export
    from engine.service.report.document import session_report_html
    from tests.test_app_pages import assert_clean
    from tests.test_app_pages import page as app_page

    store, sid, home = session
    stored = decision_for(store, [sid], DecisionQuery(temperature=0.0))

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("predicted again on a read")

    for module, name in ((analysis, "recommend_from_store"), (analysis, "session_policies"),
                         (recommend_view, "gamma_curve"), (report_recommendation, "gamma_curve")):  # fmt: skip
        monkeypatch.setattr(module, name, refuse)
    st.cache_resource.clear()  # nothing kept by the dashboard process from another test
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    monkeypatch.setenv("SPECTUNE_DB_URL", f"sqlite:///{home / 'spectune.db'}")
    assert_clean(app_page("pages/7_Policies.py", {"session": str(sid)}))
    at = app_page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    pickers = [box for box in at.selectbox if box.label == "Draft"]
    assert pickers and len(pickers[0].options) == 2, "both drafts' curves are offered"
    for index in range(len(pickers[0].options)):  # each draft's curve, the one not recommended too
        assert_clean(pickers[0].set_value(index).run())
    result = recommend_and_export(store, [sid], temperature=0.0)
    assert result.decision == stored and isinstance(result.policies, PolicyReport)
    assert result.recommendation.measurement in result.evidence.measurements  # one object, as when made
    assert html.escape(stored.headline()) in session_report_html(store, [sid], temperature=0.0)
    cli = subprocess.run([sys.executable, "-m", "engine", "policies", "--session", str(sid), "--temperature", "0"],
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert cli.returncode == 0, cli.stderr


def test_the_recommend_page_shows_the_stored_decision(session, monkeypatch) -> None:
    from tests.test_app_pages import assert_clean
    from tests.test_app_pages import page as app_page

    store, sid, home = session
    decision = decision_for(store, [sid], DecisionQuery(temperature=0.0))
    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    monkeypatch.setenv("SPECTUNE_DB_URL", f"sqlite:///{home / 'spectune.db'}")
    at = app_page("pages/5_Recommend.py", {"session": str(sid)})
    assert_clean(at)
    banners = [b.value.replace("\\", "").replace("**", "") for b in [*at.success, *at.warning]]
    assert sum(f"Decision: {decision.headline()}" in b for b in banners) == 1, banners
    if decision.measured is None and not decision.off:
        assert any(b.startswith("Not measured") for b in banners), banners


def test_every_export_is_the_stored_decision(session) -> None:
    """The Recommend page's and `recommend --export`'s files deploy the decision's configuration: its drafting
    policy's files (the Policies page's) where it is a policy, its fixed γ's otherwise; the saved payload keeps it."""
    import json

    from engine.service.decide.policies import export_best, session_policies
    from engine.service.decide.recommendations import recommend_and_export

    store, sid, _ = session
    result = recommend_and_export(store, [sid], temperature=0.0)
    decision = decision_for(store, [sid], DecisionQuery(temperature=0.0))
    assert result.decision == decision and result.payload["decision"] == decision.to_dict()
    record = json.loads(result.files["spectune"][1])
    if decision.policy:
        report = session_policies(store, [sid], temperature=0.0)
        assert result.files["vllm"][1] == export_best(report, "vllm").text
    elif decision.off:
        assert "off" in json.dumps(record).lower()
    else:
        assert decision.draft in json.dumps(record) and f'"gamma": {decision.gamma}' in json.dumps(record), record
