"""Policies through a session and the CLI on tiny models: policy runs stored beside the fixed γs (and kept out of the
fixed-γ recommender), the replay table with live figures beside it, `run --policy`, `policies`, `recommend
--policy-export`, proving the best policies live, and the Policies page.

The session decodes live, so what it decoded (tokens, per-position acceptance, the draft traces, tokens per call and
draft calls) is exact; its costs are then fixed to recorded values (record_costs), so what the tests see it decide
does not depend on how busy the machine was (under load fixed:4 once measured 0.62×, and no policy paid)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.analysis.export import VLLM_VERSION
from engine.engines.registry import validate
from engine.errors import SettingsError
from engine.models.pool import ModelPool
from engine.service.cli import main as cli
from engine.service.decide.evidence import recommend_from_store
from engine.service.decide.policies import export_best, policy_verdict, prove, session_policies
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.session.spec import SessionSpec
from foundation.paths import default_database_url
from store import open_store

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
PROMPTS = ["hello world, this is", "the quick brown fox jumps", "abc abc abc abc ab"]
POLICIES = ["heuristic:4", "confidence:0.3:8", "adaptive:1,2,3,4:2:0.5:1:0"]


def spec(**kw) -> SessionSpec:
    base = dict(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[2, 4], max_new_tokens=30, dtype="float32",
                device="cpu", chat_template=False, detect_regime=False, policies=list(POLICIES))  # fmt: skip
    return SessionSpec(**(base | kw))


# the costs the decisions rest on, recorded instead of timed: a draft forward ÷ a target forward (c), a verify of k
# tokens ÷ a verify of one (v(k), flat: memory-bound), no step overhead, the target alone's tokens/s, and every live
# speedup as 90% of the most its own tokens per call allow at those costs (so none breaks its bound)
RECORDED_C = {DRAFT: 0.05, "ngram": 0.0}
RECORDED_VERIFY = {str(k): 1.0 for k in range(1, 18)}
RECORDED_BASELINE_TOKENS_PER_S = 500.0
RECORDED_SHARE_OF_BOUND = 0.9


def recorded_speedup(figures: dict, c: float) -> dict:
    """A live run's timed figures at the recorded costs: its speedup (median, per-prompt spread, whole run), tokens/s
    and no bound flag; `figures` give its exact tokens per call and draft calls per step."""
    calls = (figures.get("draft_calls") or 0) / (figures.get("steps") or 1)
    speedup = RECORDED_SHARE_OF_BOUND * float(figures["tokens_per_call"]) / (1.0 + c * calls)
    spread = {"median": speedup, "min": 0.97 * speedup, "max": 1.03 * speedup, "n": len(PROMPTS),
              "verdict": "faster" if speedup > 1 else "slower"}  # fmt: skip
    return {"speedup_measured": speedup, "speedup_whole_run": speedup, "speedup_spread": spread,
            "speedup_flag": None, "tokens_per_s": RECORDED_BASELINE_TOKENS_PER_S * speedup}  # fmt: skip


def record_costs(store, sid: int) -> None:
    """Replace what the live session timed (c, v(k), step overhead, tokens/s, speedups and their spreads) with the
    recorded costs, through the store; what it decoded is kept as it is."""
    session = store.get_session(sid)
    for run in store.list_runs(sid):
        summary = dict(run.get("summary") or {})
        c = RECORDED_C.get(run["draft"], 0.0)
        summary.update(c=c, verify_cost=RECORDED_VERIFY, step_overhead={"per_step": 0.0, "per_token": 0.0},
                       verify_in_loop=None)  # fmt: skip
        costs = {"c": c, "verify_cost": RECORDED_VERIFY}
        if run["kind"] == "baseline":
            summary["tokens_per_s"] = RECORDED_BASELINE_TOKENS_PER_S
            store.update_run(run["id"], **costs, tokens_per_s=RECORDED_BASELINE_TOKENS_PER_S, summary=summary)
            continue
        live = summary.get("policy_live")
        timed = recorded_speedup(live or {**summary, "tokens_per_call": run["tokens_per_call"]}, c)
        if live:  # a policy run: its live figures carry the speedup, the run's columns none
            summary["policy_live"] = {**live, **timed}
            summary.update(speedup_spread=timed["speedup_spread"], speedup_flag=None)
            store.update_run(run["id"], **costs, tokens_per_s=timed["tokens_per_s"], summary=summary)
        else:
            summary.update(timed)
            store.update_run(run["id"], **costs, tokens_per_s=timed["tokens_per_s"],
                             speedup_measured=timed["speedup_measured"], summary=summary)  # fmt: skip
    summary = dict(session.get("summary") or {}, verify_cost=RECORDED_VERIFY,
                   baseline_tokens_per_s=RECORDED_BASELINE_TOKENS_PER_S)  # fmt: skip
    store.finish_session(sid, "done", summary=summary)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One finished session with fixed γs and policies, in a SPECTUNE_HOME of its own: decoded live, its costs then
    fixed to the recorded ones (record_costs)."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECTUNE_HOME", str(home))
    mp.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    set_id, _, _ = store.add_prompt_set("p", None, [{"text": t} for t in PROMPTS])
    sid = submit_session(store, spec(), set_id, len(PROMPTS))
    assert run_session(store, store.claim_next_session("w1"), ModelPool(), "w1") == "done"
    record_costs(store, sid)
    yield store, sid, home
    store.close()
    mp.undo()


def test_spec_validates_policies():
    validate(spec())
    assert spec().from_row(spec().to_row()).policies == POLICIES
    validate(spec(gammas=[]))  # policies alone are enough for spectune's loop
    with pytest.raises(SettingsError, match="confidence"):
        validate(spec(policies=["confidence:2"]))
    with pytest.raises(SettingsError, match="spectune's loop"):
        validate(spec(engine="llama.cpp"))
    with pytest.raises(SettingsError, match="no γ"):
        validate(spec(gammas=[], policies=[]))


def test_policy_runs_are_stored_apart_from_fixed_gammas(session):
    store, sid, _ = session
    runs = [r for r in store.list_runs(sid) if r["kind"] == "speculative"]
    policy_runs = [r for r in runs if (r.get("summary") or {}).get("policy")]
    assert len(policy_runs) == 2 * len(POLICIES)
    for run in policy_runs:
        summary = run["summary"]
        assert run["gamma"] == 0 and run["alpha"] is None and run["speedup_measured"] is None
        live = summary["policy_live"]
        assert live["policy"] == summary["policy"] and live["tokens_per_call"] == run["tokens_per_call"]
        assert live["replayed"]["basis"] == "exact"
        assert live["replayed"]["tokens_per_call"] == pytest.approx(live["tokens_per_call"], abs=1e-12)
        assert live["replayed"]["draft_calls_per_step"] == pytest.approx(live["draft_calls_per_step"], abs=1e-12)
    for run in runs:
        assert run["summary"]["draft_calls"] is not None and run["summary"]["mean_drafted_per_step"] is not None
    traced = [r for r in runs if r["summary"].get("policy_trace")]
    assert sorted(r["draft"] for r in traced) == sorted([DRAFT, "ngram"])  # once per draft
    assert "policy_trace" not in json.dumps(store.get_session(sid)["summary"])  # not copied into the session
    _, ev, _ = recommend_from_store(store, [sid])
    for m in ev.measurements:  # the fixed-γ recommender never sees a policy run as a γ
        assert 0 not in m.measured_speedup and set(m.measured_speedup) <= {2, 4}


def test_replay_table_puts_live_beside_replayed(session):
    store, sid, _ = session
    report = session_policies(store, sid)
    assert {d.draft for d in report.drafts} == {DRAFT, "ngram"}
    for d in report.drafts:
        live_rows = [r for r in d.rows() if r["live"]]
        assert {r["policy"] for r in live_rows} >= {"fixed:2", "fixed:4", "heuristic:4"}
        for row in live_rows:  # tiny models in fp32, temperature 0: the replay is the loop
            assert row["tokens_per_call"] == pytest.approx(row["live_tokens_per_call"], abs=1e-12), row["policy"]
        assert sum(r["best_fixed"] for r in d.rows()) == 1
    doc = report.to_dict()
    json.dumps(doc)
    assert doc["best"]["policy"] and doc["gain_over_best_fixed"] is not None and "exact" in doc["exact"]
    for fmt in ("llamacpp", "transformers", "vllm", "sglang", "spectune"):
        exported = export_best(report, fmt)
        assert exported.text.endswith("\n")


def test_policies_cli_and_recommend_export(session, capsys, tmp_path):
    store, sid, home = session
    out = tmp_path / "policies.json"
    assert cli.main(["policies", "--session", str(sid), "--json", str(out), "--top", "5"]) == 0
    text = capsys.readouterr().out
    assert "tok/call" in text and "←best fixed γ" in text and "heuristic:4" in text and "best for latency" in text
    doc = json.loads(out.read_text())
    assert {"policy", "setting", "tokens_per_call", "draft_calls_per_step", "predicted_speedup", "cost_multiplier",
            "basis", "live_tokens_per_call"} <= set(doc["rows"][0])  # fmt: skip
    assert cli.main(["recommend", "--session", str(sid), "--policy-export", "all", "--policy-out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    verdict = policy_verdict(session_policies(store, [sid]))[0].replace("**", "")
    assert f"policy: {verdict}\n" in text, text  # the Policies page's answer, word for word
    llama = (tmp_path / "policy-llama-server-flags.txt").read_text()
    shlex.split(llama, comments=True)
    json.loads((tmp_path / "policy-transformers-generate-kwargs.json").read_text())
    assert json.loads((tmp_path / "policy-vllm-speculative-config.json").read_text())["engine_version"] == VLLM_VERSION
    older = tmp_path / "older"
    older.mkdir()  # the vLLM the user deploys, as for --export (issue #19)
    assert cli.main(["recommend", "--session", str(sid), "--policy-export", "vllm", "--policy-out", str(older),
                     "--vllm-version", "0.30.0"]) == 0  # fmt: skip
    capsys.readouterr()
    assert json.loads((older / "policy-vllm-speculative-config.json").read_text())["engine_version"] == "0.30.0"
    assert cli.main(["policies", "--session", "999"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_prove_queues_the_best_policies(session):
    store, sid, _ = session
    report = session_policies(store, sid)
    new_id, specs = prove(store, report, 2)
    queued = SessionSpec.from_row(store.get_session(new_id))
    assert queued.policies == specs[:-1] and len(queued.policies) <= 2 and queued.gammas == [int(specs[-1][6:])]
    assert queued.drafts == [report.chosen.draft] and store.get_session(new_id)["status"] == "queued"
    store.request_cancel(new_id)


def test_run_policy_json(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world, this is\nabc abc abc abc ab\n")
    out = tmp_path / "out.json"
    args = ["run", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--max-new-tokens", "20",
            "--dtype", "float32", "--no-chat-template", "--json", str(out)]  # fmt: skip
    assert cli.main([*args, "--policy", "heuristic:3"]) == 0
    flat = json.loads(out.read_text())
    assert flat["policy"] == "heuristic:3" and flat["gamma"] is None and flat["draft_calls"] > 0
    assert flat["mean_drafted_per_step"] > 0 and flat["replayed"]["basis"] == "exact"
    assert flat["replayed"]["tokens_per_call"] == pytest.approx(flat["tokens_per_call"], abs=1e-12)
    assert "heuristic:3" in capsys.readouterr().out
    assert cli.main([*args, "--gamma", "3"]) == 0
    flat = json.loads(out.read_text())
    assert flat["policy"] == "fixed:3" and flat["gamma"] == 3 and flat["draft_calls"] > 0
    assert cli.main([*args, "--policy", "confidence:7"]) == 2
    assert "--policy confidence:7" in capsys.readouterr().err


def open_page(path: str, session_id: int) -> AppTest:
    """A dashboard page opened on ?session=ID, run once, without an exception."""
    st.cache_data.clear()
    at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60)
    at.query_params.update({"session": str(session_id)})
    at.switch_page(path)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_policies_page(session, monkeypatch):
    store, sid, home = session
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "ensure_worker", lambda: "worker running (pid 4242)")
    at = open_page("pages/7_Policies.py", sid)
    assert at.title[0].value.endswith("Speculation policies")
    assert [m.label for m in at.metric] == ["Best policy", "Tokens per call", "Predicted speedup", "Gain over fixed γ"]
    assert len(at.get("vega_lite_chart")) == 1
    from app.policies_view import KIND_LABELS

    labels = {label: kind for kind, label in KIND_LABELS.items()}
    for label in at.radio(key="pol_kind").options:
        kind = labels[label]
        at.radio(key="pol_kind").set_value(kind).run()
        assert not at.exception, kind
    chart = at.get("vega_lite_chart")[0].proto.spec
    assert '"diamond"' in chart and "strokeDash" in chart  # live points apart; the best fixed γ as a rule
    at.button(key="pol_prove").click().run()
    assert not at.exception and "queued" in " ".join(s.value for s in at.success)
    lines = (ROOT / "app" / "pages" / "7_Policies.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 200


def test_recommend_page_names_the_best_policy_and_links_to_the_comparison(session):
    store, sid, home = session
    at = open_page("pages/5_Recommend.py", sid)
    assert "Drafting policy: beyond a fixed γ" in [h.value for h in at.subheader]
    labels = [m.label for m in at.metric]
    assert labels[-4:] == ["Best policy", "Tokens per call", "Predicted speedup", "Gain over fixed γ"]
    report = session_policies(store, [sid])
    assert {m.label: m.value for m in at.metric}["Best policy"] == report.best.policy  # the CLI's answer
    links = [e.proto for e in at.get("page_link")]
    assert any(link.page == "Policies" and link.query_string == f"session={sid}" for link in links), links


def test_the_headline_says_no_policy_pays_when_none_beats_the_target_alone(session):
    from dataclasses import replace

    from engine.service.decide.policies import policy_verdict

    store, sid, home = session
    report = session_policies(store, [sid])
    text, wins = policy_verdict(report, str)
    assert "No policy pays" not in text
    comparison = report.chosen.comparison
    comparison.best = replace(
        comparison.best,
        predicted_speedup=0.9,
        cost_multiplier=1.3,
        feasible=False,
        infeasible_why="not faster than the target alone",
    )  # as the one set of rules marks it
    text, wins = policy_verdict(report, str)
    assert not wins and "No policy pays" in text and "0.90×" in text and "serve the target alone" in text
    assert "not faster than the target alone" in text
    assert "Speculation off" in export_best(report, "llamacpp").text  # the export says the same


def test_the_recommend_page_s_recommendation_is_reused_not_computed_again(session):
    store, sid, home = session
    computed = recommend_from_store(store, [sid], "latency", engine="spectune")
    report = session_policies(store, [sid], engine="spectune", recommended=computed)
    assert report.recommendation is computed[0]
    assert report.best.policy == session_policies(store, [sid]).best.policy  # the same answer as computed afresh


def test_the_policy_table_flags_an_impossible_live_speedup_in_its_own_row(session):
    """The browser walk saw a fixed γ's live 2.26× beside its live 1.89 tokens per call in the Policies table with no
    flag (only the replayed-beside-live table had a check column): the table says it in the row."""
    from app.policies_view import table_frame

    store, sid, _ = session
    fixed = [r for r in store.list_runs(sid) if r["kind"] == "speculative" and r["gamma"]]
    run = next(r for r in fixed if not (r.get("summary") or {}).get("policy_live"))
    kept = {"speedup_measured": run["speedup_measured"], "summary": run["summary"]}
    try:
        impossible = (run["tokens_per_call"] or 1.0) * 3  # the run's one speedup: its whole run's, as shown
        store.update_run(
            run["id"],
            speedup_measured=impossible,
            summary={**run["summary"], "speedup_flag": None, "speedup_whole_run": impossible},
        )
        report = session_policies(store, [sid])
        frame = table_frame(next(d for d in report.drafts if d.draft == run["draft"]))
        row = frame[frame["policy"] == f"fixed:{run['gamma']}"].iloc[0]
        assert "measurement error" in row["live check"], row.to_dict()
        assert (frame["live check"] == "").sum() >= 1  # a live figure that stands carries none
    finally:
        store.update_run(run["id"], **kept)


def test_a_row_marked_exact_never_shows_a_live_figure_other_than_its_replay(session):
    """A walk saw a row marked "exact" with 1.494 tokens per call replayed against 1.532 live (bf16: the live decode
    left the recorded pass at a near-tie). Where live and replayed differ the row says so in the Policies page's
    tables; where they agree it stays exact."""
    from app.policies_view import live_frame, table_frame

    store, sid, _ = session
    run = next(r for r in store.list_runs(sid) if r["kind"] == "speculative" and r["gamma"] == 2
               and r["draft"] == "ngram")  # fmt: skip
    kept = {"tokens_per_call": run["tokens_per_call"]}
    try:
        store.update_run(run["id"], tokens_per_call=run["tokens_per_call"] * 1.025)
        report = session_policies(store, [sid])
        frame = table_frame(next(d for d in report.drafts if d.draft == "ngram"))
        row = frame[frame["policy"] == "fixed:2"].iloc[0]
        assert row["basis"] == "not exact here: replayed -2.4% vs live", row.to_dict()
        exact = frame[frame["live tokens/call"].notna() & (frame["policy"] != "fixed:2")]
        assert (exact["basis"] == "exact").all()  # live and replayed agree: exact stays the word
        live = live_frame(next(d for d in report.drafts if d.draft == "ngram"))
        assert live[live["policy"] == "fixed:2"].iloc[0]["basis"].startswith("not exact here")  # the page's tables
    finally:
        store.update_run(run["id"], **kept)


def test_no_policy_paying_for_one_draft_names_the_headline_when_another_draft_pays():
    """llama.cpp's n-gram lookup has no policy to replay, so the Policies page judged only the draft model and said
    "serve the target alone" beside a headline of n-gram γ=3 at 1.09×: one question, one answer."""
    from types import SimpleNamespace

    from engine.service.decide.policies import policy_verdict

    best = SimpleNamespace(feasible=False, policy="confidence:0.6:4:2", predicted_speedup=0.76, cost_multiplier=1.32,
                           infeasible_why="not faster than the target alone")  # fmt: skip
    chosen = SimpleNamespace(draft="qwen2.5-coder-0.5b", comparison=SimpleNamespace(gain=0.0))
    headline = SimpleNamespace(off=False, draft_name="ngram", gamma=3, predicted_speedup=1.09)
    report = SimpleNamespace(best=best, best_fixed=best, chosen=chosen, recommendation=headline)
    text, _ = policy_verdict(report, str)
    assert "The recommendation is ngram at a fixed γ=3 (1.09× predicted)" in text
    assert "serve the target alone" not in text
    text, _ = policy_verdict(SimpleNamespace(**{**report.__dict__, "recommendation": SimpleNamespace(off=True)}), str)
    assert "serve the target alone" in text


def test_the_policy_exports_are_the_headline_when_only_another_draft_pays(session):
    """The replayable draft has no policy that pays while the headline recommends another draft's fixed γ: every
    policy file is that headline (what `recommend --export` writes), not "speculation off"."""
    from dataclasses import replace

    from engine.analysis.export import export
    from engine.analysis.recommend import recommend
    from engine.service.decide.evidence import gather

    store, sid, home = session
    report = session_policies(store, [sid])
    comparison = report.chosen.comparison
    comparison.best = replace(comparison.best, predicted_speedup=0.9, cost_multiplier=1.3, feasible=False,
                              infeasible_why="not faster than the target alone")  # fmt: skip
    other = next(m for m in gather(store, [sid]).measurements if m.name != report.chosen.draft)
    # the other draft as a measurement without a trace that pays at γ=3 (llama.cpp's n-gram lookup, say)
    paying = replace(other, per_position_acceptance=[0.9, 0.9, 0.9], alpha=0.9, traces=[], agreement_runs=[],
                     measured_speedup={}, noisy_speedup={}, c=min(other.c, 0.05))  # fmt: skip
    report.recommendation = headline = recommend([paying], "latency", "memory-bound", gammas=[3])
    assert not headline.off and headline.draft_name == other.name != report.chosen.draft
    for fmt in ("vllm", "llamacpp", "spectune"):
        text = export_best(report, fmt).text
        assert "Speculation off" not in text and "speculation off" not in text, fmt
        if fmt == "vllm":
            config = json.loads(text)["speculative_config"]
            assert (
                config["num_speculative_tokens"]
                == 3
                == json.loads(export(headline, fmt, target=report.target)[1])["speculative_config"][
                    "num_speculative_tokens"
                ]
            )


def test_the_cli_prints_the_policy_pages_answer(monkeypatch, capsys):
    """Seen in a walk on a llama.cpp session: `recommend` printed "policy: qwen2.5-coder-0.5b confidence:0.8:4:0 —
    1.68 tokens per call, 0.75× predicted" below a headline of n-gram γ=4 at 1.04×, where the Policies page said
    no policy pays and named the headline. The CLI prints the page's sentence."""
    from types import SimpleNamespace

    from engine.service.cli import recommend as recommend_cli
    from engine.service.decide.policies import policy_verdict

    best = SimpleNamespace(feasible=False, policy="confidence:0.8:4:0", predicted_speedup=0.75, cost_multiplier=1.33,
                           infeasible_why="not faster than the target alone")  # fmt: skip
    chosen = SimpleNamespace(draft="qwen2.5-coder-0.5b", comparison=SimpleNamespace(gain=0.124, notes=[]))
    headline = SimpleNamespace(off=False, draft_name="ngram", gamma=4, predicted_speedup=1.04)
    report = SimpleNamespace(best=best, best_fixed=best, chosen=chosen, recommendation=headline)
    args = SimpleNamespace(session=[1], objective="latency", budget=None, batch_size=1, regime=None,
                           temperature=None, policy_export=None)  # fmt: skip
    recommend_cli.print_policy(None, args, SimpleNamespace(engine="llama.cpp", triple=None, policies=report))
    printed = capsys.readouterr().out
    assert printed == f"policy: {policy_verdict(report)[0].replace('**', '')}\n"
    assert printed.startswith("policy: No policy pays for qwen2.5-coder-0.5b")
    assert "The recommendation is ngram at a fixed γ=4 (1.04× predicted)" in printed and "gain" not in printed
