"""llama.cpp as a session engine, against real llama-server processes on the bundled GGUF files.

Short prompts and few tokens keep each test to seconds of decoding; every test checks that no llama-server
it caused is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from processes import live_llama_servers
from processes import no_server_left_behind as no_server_left_behind  # noqa: F401 - autouse

from engine.analysis.policy_replay import replay
from engine.core.policy import parse_policy
from engine.core.records import StepRecord
from engine.engines.llamacpp import client
from engine.engines.llamacpp.binaries import find_llama, parse_version
from engine.engines.llamacpp.policy_flags import llamacpp_fields
from engine.engines.llamacpp.runner import LlamaCppRunner
from engine.engines.llamacpp.server import ManagedServer, ServerConfig, ServerError
from engine.engines.registry import sweep
from engine.errors import ModelError
from engine.models.bundled import gguf_for
from engine.models.pool import ModelPool
from engine.service.decide.policies import prove, session_policies
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.session.hooks import Hooks
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec
from engine.session.summary import RunSummary
from foundation.paths import default_database_url
from store import open_store

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT, OTHER_VOCAB = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"
SMALL = "smollm2-135m"  # target and draft where the model does not matter: the smallest bundled GGUF's servers
P_NOISE = 0.05  # how far llama.cpp's quantized draft p may sit from the fp32 trace's near a confidence threshold
PROMPTS = [
    PromptText("code", "Write a Python function is_even(n) that returns True when n is even."),
    PromptText("prose", "Say hello in French."),
]


def llama_servers() -> list[psutil.Process]:
    """Every llama-server this test run started that is still alive (another run's are not ours to count)."""
    return live_llama_servers()


class Recorder(Hooks):
    def __init__(self) -> None:
        self.steps: list[tuple[Any, StepRecord]] = []
        self.failed: dict[Any, str] = {}
        self.finished: dict[Any, RunSummary] = {}
        self.keys: dict[int, dict[str, Any]] = {}
        self.on_step: Any = None

    def run_started(self, key: dict[str, Any]) -> int:
        run = len(self.keys)
        self.keys[run] = key
        return run

    def step(self, run: Any, record: StepRecord) -> None:
        self.steps.append((run, record))
        if self.on_step:
            self.on_step(run, record)

    def run_failed(self, run: Any, message: str) -> None:
        self.failed[run] = message

    def run_finished(self, run: Any, summary: RunSummary) -> None:
        self.finished[run] = summary


def test_version_line_is_parsed_and_recorded() -> None:
    build = find_llama()
    assert build.build == 11434 and build.server.is_file() and len(build.server_sha256) == 64
    assert parse_version("version: 0.6.0-dev (build 11434, commit 1a2b3c4)\n") == (
        "0.6.0-dev (build 11434, commit 1a2b3c4)", 11434, "1a2b3c4",
    )  # fmt: skip


def test_llama_bench_times_every_k_in_alternating_rounds() -> None:
    from engine.engines.llamacpp.bench import batch_times
    from engine.measure.verify_cost import from_rounds

    times = batch_times(find_llama(), gguf_for(DRAFT, "draft"), [1, 2, 4], rounds=2, threads=2, depth=16)
    assert sorted(times) == [1, 2, 4] and all(len(t) == 2 and min(t) > 0 for t in times.values())
    measured = from_rounds(times)
    assert measured.rounds == 2 and measured.curve[1] == 1.0
    assert all(0.0 < low <= high for low, high in measured.spread.values())
    # below a one-token batch only where every round measured it so (a CPU whose one-token kernel is the slower)
    assert all(measured.curve[k] >= 1.0 or measured.spread[k][1] < 1.0 for k in times)


def test_a_server_with_a_draft_speculates_and_reports_draft_statistics() -> None:
    config = ServerConfig(gguf_for(TARGET, "target"), draft=gguf_for(DRAFT, "draft"), spec_type="draft-simple",
                          draft_n_max=3, draft_n_min=0, draft_p_min=0.0)  # fmt: skip
    flags = config.flags()
    at = flags.index("-md")
    assert flags[at : at + 4] == ["-md", str(config.draft), "--spec-type", "draft-simple"]
    assert flags[flags.index("--spec-draft-n-max") + 1] == "3" and flags[flags.index("--spec-draft-p-min") + 1] == "0"
    with ManagedServer(config) as server:
        pid = server.proc.pid
        assert client.speculating(server.url)
        before = client.metrics(server.url)
        done = client.complete(server.url, "def add(a, b):\n    return", 16)
        delta = client.metrics(server.url).minus(before)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert done.predicted_n == 16 and len(done.token_ids) == 16
    assert 0 < done.draft_n and 0 <= done.draft_n_accepted <= done.draft_n
    assert delta.draft_tokens == done.draft_n and delta.accepted_tokens == done.draft_n_accepted
    assert delta.drafts >= 1 and 1 <= delta.target_calls < 16  # speculation: fewer target calls than tokens
    assert 1.0 < delta.mean_acceptance_length() <= 4.0  # at most γ+1 tokens per target call
    assert all(0.0 <= rate <= 1.0 for rate in delta.per_position_acceptance())


def test_a_draft_of_another_vocabulary_fails_its_configuration_with_the_servers_reason() -> None:
    spec = SessionSpec(target=TARGET, drafts=[OTHER_VOCAB, DRAFT], gammas=[2], max_new_tokens=8,
                       engine="llama.cpp", measure_verify_cost=False)  # fmt: skip
    hooks = Recorder()
    report = sweep(spec, PROMPTS[:1], hooks).to_dict()
    assert [f["draft"] for f in report["failed"]] == [OTHER_VOCAB]
    assert "speculation off" in report["failed"][0]["error"] and "vocab" in report["failed"][0]["error"]
    assert [r["draft"] for r in report["runs"]] == [DRAFT]  # the other configuration still ran


def test_sweep_measures_every_configuration_side_by_side_and_judges_fidelity() -> None:
    spec = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=[3], max_new_tokens=16, engine="llama.cpp")
    hooks = Recorder()
    report = sweep(spec, PROMPTS, hooks).to_dict()
    assert not report["failed"] and report["llama_cpp"]["build"] == 11434
    assert report["unavailable"] == ["alpha", "beta_per_position", "from_draft"]
    # prompt-major order: every configuration's request for prompt 0 before any for prompt 1
    order = [record.prompt_index for _, record in hooks.steps]
    assert order == sorted(order) and len(order) == 3 * len(PROMPTS)
    assert sorted(report["verify_cost"]) and report["verify_cost"]["1"] == 1.0
    for run in report["runs"]:
        assert run["engine"] == "llama.cpp" and run["alpha"] is None
        assert 1.0 <= run["tokens_per_call"] <= 4.0
        assert run["speedup_spread"]["n"] + run["speedup_spread"]["dropped"] == len(PROMPTS)
        for divergence in run["divergences"]:
            assert divergence["verdict"] in ("identical", "near-tie"), divergence
    model_run = next(r for r in report["runs"] if r["draft"] == DRAFT)
    assert model_run["c"] > 0 and model_run["draft_acceptance_rate"] > 0
    # the store's per-request rows add up to the server's own counters
    run_id = next(run for run, key in hooks.keys.items() if key["draft"] == DRAFT)
    rows = [record for run, record in hooks.steps if run == run_id]
    calls = sum(r.target_calls for r in rows)
    assert sum(r.emitted for r in rows) / calls == pytest.approx(model_run["tokens_per_call"])
    assert sum(r.accepted for r in rows) / sum(r.gamma for r in rows) == pytest.approx(
        model_run["draft_acceptance_rate"]
    )


def test_the_target_top_after_a_prefix_is_the_token_the_target_decoded_there() -> None:
    """reference_at sends the prompt's text and then token ids, which llama-server tokenizes as the text alone and
    appends: after k tokens of the target's own greedy output, the target's token k is its best, or within the
    fidelity tolerance of it (one batched forward sums in another order than k single steps)."""
    from engine.engines.llamacpp.runner import LlamaCppRunner
    from engine.measure.fidelity import TOLERANCE
    from engine.session.runner import DecodeContext, RunKey

    spec = SessionSpec(target=OTHER_VOCAB, drafts=["ngram"], gammas=[2], max_new_tokens=12, engine="llama.cpp",
                       measure_verify_cost=False)  # fmt: skip
    baseline = RunKey("none", 0, 0.0)
    ctx = DecodeContext(on_step=lambda r: None, should_stop=lambda: False, phase=lambda *a: None)
    runner = LlamaCppRunner()
    try:
        assert runner.start(spec, PROMPTS[:1], [baseline], ctx) == {}
        output = runner.decode(baseline, 0, ctx, reference=True).output.token_ids
        assert len(output) == 12
        for k in (0, 1, 5, 11):
            top = runner.reference_at(0, output[:k])
            assert top is not None and len(top.ids) == 16 and top.values == sorted(top.values, reverse=True)
            assert output[k] in top.ids and top.values[0] - top.values[top.ids.index(output[k])] <= TOLERANCE["gguf"]
    finally:
        runner.stop()


@pytest.mark.real_model  # the draft's trace is recorded in PyTorch (float32)
def test_a_session_runs_a_confidence_stop_in_llama_server_beside_its_replay(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """γ 4 and `confidence:0.6:8:0` (--spec-draft-p-min 0.6, n-max 8, n-min 0) in one llama.cpp session, through the
    worker and the store: the policy run's live figures, its replayed ones (llama.cpp's own target-alone output,
    replayed in its loop) within 10% where its outputs are the baseline's, and the replay table marking it live."""
    policy = "confidence:0.6:8:0"
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    set_id, _, _ = store.add_prompt_set("p", None, [{"id": p.prompt_id, "text": p.text} for p in PROMPTS])
    spec = SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[4], policies=[policy], max_new_tokens=16,
                       engine="llama.cpp", measure_verify_cost=False, detect_regime=False)  # fmt: skip
    sid = submit_session(store, spec, set_id, len(PROMPTS))
    assert run_session(store, store.claim_next_session("w1"), ModelPool(), "w1") == "done"
    runs = {(r["kind"], (r["summary"] or {}).get("policy") or r["gamma"]): r for r in store.list_runs(sid)}
    run = runs[("speculative", policy)]
    live = run["summary"]["policy_live"]
    assert run["gamma"] == 0 and run["speedup_measured"] is None and 1 <= live["tokens_per_call"] <= 9
    spread = live["speedup_spread"]  # every prompt: in the verdict, or left out above its bound
    assert live["draft_calls_per_step"] <= 8 and spread["n"] + spread["dropped"] == len(PROMPTS)
    assert live["replayed"] is not None and live["replayed"]["basis"] == "exact"
    assert runs[("speculative", 4)]["summary"]["draft_calls"] > 0  # fixed γ runs carry the same figures
    trace = next(r["summary"]["policy_trace"] for r in runs.values() if (r["summary"] or {}).get("policy_trace"))
    baseline = store.get_outputs(runs[("baseline", 0)]["id"])
    same = [(i, o) for i, o in enumerate(store.get_outputs(run["id"])) if o["token_ids"] == baseline[i]["token_ids"]]
    assert same, "llama.cpp never reproduced its own target-alone output"
    measured = sum(len(o["token_ids"]) for _, o in same) / sum(o["steps"] for _, o in same)
    along = [trace[i] for i, _ in same]
    predicted = replay(along, parse_policy(policy), loop=LlamaCppRunner.drafting_loop).tokens_per_call
    # llama.cpp's draft computes p with its Q4 kernels (repacked or not, by CPU), the trace with the dequantized
    # weights in fp32: a p within P_NOISE of the threshold may fall either side, so the live figure is held to the
    # replays at p_min ± P_NOISE (within 10%), a band that must still tell the stop from drafting n-max every step
    loop = LlamaCppRunner.drafting_loop
    band = [replay(along, parse_policy(f"confidence:{0.6 + d:g}:8:0"), loop=loop).tokens_per_call
            for d in (P_NOISE, -P_NOISE)]  # fmt: skip
    lo, hi = min(predicted, *band), max(predicted, *band)
    with capsys.disabled():
        print(f"confidence:0.6:8:0 in llama.cpp: {measured:.3f} tokens per call; replayed {predicted:.3f} "
              f"(p_min ± {P_NOISE}: {lo:.3f}–{hi:.3f})")  # fmt: skip
    assert lo * 0.9 <= measured <= hi * 1.1, (lo, predicted, hi, measured)
    no_stop = replay(along, parse_policy("fixed:8"), loop=LlamaCppRunner.drafting_loop).tokens_per_call
    assert not lo * 0.9 <= no_stop <= hi * 1.1, (lo, hi, no_stop)  # the band has power: ignoring p-min fails it
    if len(same) == len(PROMPTS):
        assert live["replayed"]["tokens_per_call"] == pytest.approx(predicted)
    report = session_policies(store, sid)
    rows = [row for d in report.drafts for row in d.rows() if row["policy"] == policy]
    assert rows and rows[0]["live"] and rows[0]["live_tokens_per_call"] == pytest.approx(live["tokens_per_call"])
    from engine.service.cli import main as cli
    from engine.service.decide.policies import policy_verdict

    # `recommend --engine llamacpp` names the best policy replayed from this llama.cpp session, as the page does
    assert cli.main(["recommend", "--session", str(sid), "--engine", "llamacpp"]) == 0
    printed = capsys.readouterr().out
    verdict = policy_verdict(report)[0].replace("**", "")
    assert f"policy: {verdict}" in printed and report.best.policy in verdict, printed  # the page's sentence
    new_id, specs = prove(store, report, 2)  # proving a llama.cpp session queues only what llama-server runs
    assert specs and all(llamacpp_fields(s) is not None for s in specs)
    assert SessionSpec.from_row(store.get_session(new_id)).engine == "llama.cpp"
    store.request_cancel(new_id)
    store.close()


def test_bad_flag_and_missing_gguf_fail_with_a_clear_message(tmp_path: Path) -> None:
    target = gguf_for(TARGET, "target")
    with pytest.raises(ServerError, match="invalid argument: --no-such-flag"):
        ManagedServer(ServerConfig(target, extra=("--no-such-flag",))).start()
    with pytest.raises(ServerError, match="file not found"):
        ManagedServer(ServerConfig(Path("/nonexistent/model.gguf"))).start()
    with pytest.raises(ModelError, match="GGUF"):
        gguf_for("some/hub-model", "target")
    cli = subprocess.run(
        [sys.executable, "-m", "engine", "run", "--engine", "llamacpp", "--target", "/nonexistent.gguf",
         "--prompts", str(ROOT / "samples" / "code.jsonl"), "--json", str(tmp_path / "out.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 2 and cli.stderr.strip() == "error: target file not found: /nonexistent.gguf"


def test_a_server_killed_mid_session_fails_its_configuration_and_the_rest_survive() -> None:
    spec = SessionSpec(target=SMALL, drafts=[SMALL], gammas=[2, 3], max_new_tokens=8, engine="llama.cpp",
                       measure_verify_cost=False)  # fmt: skip
    hooks = Recorder()

    def kill_gamma_3(run: Any, record: StepRecord) -> None:
        if hooks.keys[run]["gamma"] == 3 and record.prompt_index == 0:
            victim = next(p for p in llama_servers() if "--spec-draft-n-max" in p.cmdline()
                          and p.cmdline()[p.cmdline().index("--spec-draft-n-max") + 1] == "3")  # fmt: skip
            victim.kill()

    hooks.on_step = kill_gamma_3
    report = sweep(spec, PROMPTS, hooks).to_dict()
    assert [(f["draft"], f["gamma"]) for f in report["failed"]] == [(SMALL, 3)]
    assert "did not answer" in report["failed"][0]["error"] or "exited" in report["failed"][0]["error"]
    assert [(r["draft"], r["gamma"]) for r in report["runs"]] == [(SMALL, 2)]
    assert len(hooks.failed) == 1 and len(report["runs"][0]["outputs"]) == len(PROMPTS)


def test_the_worker_stops_on_sigterm_marks_the_session_interrupted_and_stops_its_servers(tmp_path: Path) -> None:
    env = {**os.environ, "SPECTUNE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("SPECTUNE_DB_URL", None)
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"Write a haiku about the number {i}.\n" for i in range(30)))
    submit = subprocess.run(
        [sys.executable, "-m", "engine", "submit", "--engine", "llamacpp", "--target", SMALL, "--draft", SMALL,
         "--gamma", "2", "--prompts", str(prompts), "--max-new-tokens", "24", "--no-regime"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    log = (tmp_path / "worker.out").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "engine", "worker"], env=env, cwd=ROOT, stdout=log, stderr=log)
    try:
        from store import open_store

        store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # running, with servers up and some requests logged
            mine = [p for p in llama_servers() if worker.pid in {a.pid for a in p.parents()}]
            if mine and sum(store.run_progress(r["id"])["steps"] for r in store.list_runs(1)) >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the session never got going")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        session = store.get_session(1)
        assert session["status"] == "interrupted" and "requeue" in session["error"]
        assert sum(store.run_progress(r["id"])["steps"] for r in store.list_runs(1)) >= 2  # what it measured stays
        assert not [p for p in mine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        requeue = subprocess.run([sys.executable, "-m", "engine", "requeue", "--session", "1"],
                                 capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)  # fmt: skip
        assert requeue.returncode == 0 and store.get_session(1)["status"] == "queued"
        store.close()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()


def test_an_owner_killed_with_sigkill_takes_its_llama_servers_with_it() -> None:
    """No finally, atexit or signal handler runs on SIGKILL: the server is started to die with its owner."""
    code = (
        "from engine.engines.llamacpp.server import ManagedServer, ServerConfig\n"
        "from engine.models.bundled import gguf_for\n"
        f"server = ManagedServer(ServerConfig(gguf_for({OTHER_VOCAB!r}, 'target'))).start()\n"
        "print(server.proc.pid, flush=True)\n"
        "import time; time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pid = int(owner.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
