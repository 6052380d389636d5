"""A quick probe of this machine's pace (issue #21, item 8: "the estimated time … from a quick probe or the last
session on this machine"): the target alone, timed in a child process through the session's own engine, kept per
machine, engine, target and dtype, and the estimate's pace until a comparable session has run here."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from processes import RUN_VARIABLE, live_llama_servers, ours

from app import run_view as rv
from engine.engines import registry
from engine.errors import SettingsError, SpectuneError
from engine.measure.hardware import describe_hardware
from engine.service.sizing.estimate import _minutes, estimate_for, estimate_with_probe
from engine.service.sizing.pace_probe import PROBE_TOKENS, ProbeProgress, kept, latest, probe_for, run_probe
from engine.service.sizing.plan import planned_configurations, planned_decodes
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec
from store import Store, open_store

ROOT = Path(__file__).resolve().parents[1]
PROMPT = PromptText("0", "Say hello in French.")
TINY = SessionSpec(target="tiny:1:48:2:64", drafts=["tiny:1:48:2:64~0.15", "ngram"], gammas=[1, 2],
                   max_new_tokens=24, dtype="float32", mode="full", chat_template=False)  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def store(home: Path) -> Store:
    return open_store(f"sqlite:///{home / 'spectune.db'}")


def probe_children() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "engine.service.sizing.pace_probe" in (proc.info["cmdline"] or []) and ours(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_the_probe_gives_a_fresh_machine_a_pace_and_a_session_replaces_it(store: Store, home: Path) -> None:
    assert estimate_for(store, TINY, 5).seconds is None
    probe, took = probe_for(store, TINY, PROMPT)
    assert (probe.engine, probe.target, probe.dtype) == ("spectune", TINY.target, "float32")
    assert 0 < probe.tokens <= PROBE_TOKENS and 0 < probe.setup_s < took and 0 < probe.token_s * probe.tokens < took
    hardware = str(describe_hardware()["label"])
    assert probe.hardware == hardware and latest(TINY, hardware) == probe and (home / "pace_probes.json").exists()
    got = estimate_for(store, TINY, 5)
    tokens = planned_decodes(TINY, 5) * TINY.max_new_tokens  # every prompt decode, the A/A check's included
    assert tokens > planned_configurations(TINY) * 5 * TINY.max_new_tokens
    assert got.seconds == pytest.approx(probe.setup_s + probe.token_s * tokens)
    said = got.sentences()[0]
    assert "the target alone would decode their tokens in about" in said and "here (from a probe of the target" in said
    assert "a session run once gives the whole time" in said, said
    # a pace is this machine's, for this engine, target and dtype only
    assert estimate_for(store, replace(TINY, dtype="bfloat16"), 5).seconds is None
    assert latest(TINY, "another machine") is None
    # probing again replaces the kept probe rather than piling up
    again = probe_for(store, TINY, PROMPT)[0]
    assert [p.key() for p in kept()] == [again.key()] and latest(TINY, hardware) == again
    # a finished comparable session, the whole pipeline timed, is preferred to the probe
    sid = store.create_session(target=TINY.target, drafts=TINY.drafts, gammas=TINY.gammas,
                               temperatures=TINY.temperatures, max_new_tokens=24, dtype="float32", n_prompts=4,
                               options={"engine": "spectune"})  # fmt: skip
    store.claim_next_session("test:1")
    store.set_hardware(sid, hardware)
    store.finish_session(sid, "done", summary={"runs": [{}] * 4, "baselines": [{}]})
    assert f"about {_minutes(estimate_for(store, TINY, 5).seconds or 0)} on this machine (at the pace of session " \
           f"#{sid}" in estimate_for(store, TINY, 5).sentences()[0]  # fmt: skip
    # and then the Probe button and --probe do not probe again: the session's whole wall time is the better pace
    done = estimate_with_probe(store, TINY, 5, PROMPT)
    assert done.probe_s is None and kept() == [again] and f"session #{sid}" in done.estimate.sentences()[0]
    assert probe_children() == []


def test_a_running_probe_says_where_it_is_and_its_decoding_is_bounded(home: Path) -> None:
    seen: list[ProbeProgress] = []
    probe = run_probe(TINY, PROMPT, "test", on_progress=seen.append)
    stages = [p.stage for p in seen]
    assert [s for i, s in enumerate(stages) if not i or stages[i - 1] != s] == ["loading", "priming", "decoding"]
    assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)
    assert all(p.load_s is None for p in seen if p.stage == "loading")
    assert 0 < seen[-1].load_s <= seen[-1].elapsed_s  # the load is counted apart from the decoding
    tokens = [p.tokens for p in seen if p.stage == "decoding"]
    assert tokens == sorted(tokens) and tokens[-1] == probe.tokens and not probe.bounded
    assert rv.probe_progress_text(seen[0]).startswith("Probing the pace: loading the target… ")
    said = rv.probe_progress_text(seen[-1])
    assert f"; decoding: {probe.tokens} of {PROBE_TOKENS} tokens timed in " in said and "after 60 s" in said, said
    # a target slower than the bound times fewer tokens, at least one, and says so
    bounded = run_probe(TINY, PROMPT, "test", bound_s=0.0)
    assert bounded.bounded and bounded.tokens == 1 < probe.tokens and bounded.token_s > 0 and bounded.setup_s > 0
    assert "then 1 token(s) timed in " in bounded.timed() and "decoding stops after 60 s" in bounded.timed()
    assert latest(TINY, "test") == bounded and probe_children() == []


def test_a_probe_waits_for_a_running_session_and_a_bad_target_is_one_line(store: Store, home: Path) -> None:
    sid = store.create_session(target=TINY.target, drafts=TINY.drafts, gammas=TINY.gammas,
                               temperatures=TINY.temperatures, max_new_tokens=24, dtype="float32", n_prompts=4,
                               options={"engine": "spectune"})  # fmt: skip
    store.claim_next_session("test:1")
    with pytest.raises(SettingsError, match=f"session #{sid} is running"):
        probe_for(store, TINY, PROMPT)
    store.finish_session(sid, "done", summary={})
    # refused before any child starts, as Start would refuse it
    with pytest.raises(SpectuneError, match="^target path not found: /no/such/model"):
        probe_for(store, replace(TINY, target="/no/such/model"), PROMPT)
    # what fails inside the child is its one-line reason, not the last line it printed
    with pytest.raises(SpectuneError) as failed:
        run_probe(replace(TINY, target="/no/such/model"), PROMPT, "test")
    assert str(failed.value) == "the probe failed: model path not found: /no/such/model"
    # one probe at a time on a machine
    with open(home / "pace_probe.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(SettingsError, match="another probe is running"):
            probe_for(store, TINY, PROMPT)
    assert kept() == [] and probe_children() == []


def test_a_llamacpp_probe_times_its_server_and_leaves_none_behind(store: Store) -> None:
    spec = SessionSpec(target="smollm2-135m", drafts=["ngram"], gammas=[2], max_new_tokens=32,
                       engine="llama.cpp")  # fmt: skip  # the smallest bundled GGUF: the model does not matter here
    before = {p.pid for p in live_llama_servers()}
    probe = probe_for(store, spec, PROMPT)[0]
    assert (probe.engine, probe.dtype) == ("llama.cpp", registry.get("llama.cpp").fixed_weights)  # the GGUF as it is
    assert probe.setup_s > 0 and probe.token_s > 0
    assert latest(replace(spec, dtype="float32"), probe.hardware) == probe  # a dtype it does not run changes nothing
    assert "from a probe" in estimate_for(store, spec, 3).sentences()[0]
    assert probe_children() == [] and not {p.pid for p in live_llama_servers()} - before
    # ended while its llama-server runs, by SIGTERM (its handler stops the runner) or SIGKILL (no handler runs:
    # the server dies with the thread that started it): no server is left either way
    for sig in (signal.SIGTERM, signal.SIGKILL):
        failed: list[BaseException] = []
        probing = threading.Thread(target=_failing, args=(failed, spec), daemon=True)
        probing.start()
        child, server = _probe_with_its_server()
        os.kill(child.pid, sig)
        probing.join(60)
        assert not probing.is_alive() and failed and "the probe failed" in str(failed[0]), (sig, failed)
        assert _gone(server), f"the probe's llama-server outlived its {sig.name}"
    assert probe_children() == [] and not {p.pid for p in live_llama_servers()} - before


def _failing(failed: list[BaseException], spec: SessionSpec) -> None:
    try:
        run_probe(spec, PROMPT, "test")
    except SpectuneError as exc:
        failed.append(exc)


def _probe_with_its_server(timeout_s: float = 120) -> tuple[psutil.Process, psutil.Process]:
    """The running probe child and the llama-server it started, once both exist."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in probe_children():
            servers = [p for p in live_llama_servers() if p.ppid() == child.pid]
            if servers:
                return child, servers[0]
        time.sleep(0.1)
    raise AssertionError("the probe never started its llama-server")


def _gone(proc: psutil.Process, timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_submit_probe_estimates_from_it_and_probe_alone_is_refused(home: Path) -> None:
    prompts = home / "p.txt"
    prompts.write_text("Say hello.\nName a colour.\n")
    args = [sys.executable, "-m", "engine", "submit", "--prompts", str(prompts), "--target", TINY.target,
            "--draft", "ngram", "--gamma", "2", "--dtype", "float32", "--max-new-tokens", "8"]  # fmt: skip
    env = {"SPECTUNE_HOME": str(home), "PATH": "/usr/bin:/bin", RUN_VARIABLE: os.environ.get(RUN_VARIABLE, "")}
    done = subprocess.run([*args, "--estimate", "--probe"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("probed the target alone in ")
    assert "(from a probe of the target alone: " in done.stdout
    # a finished comparable session here: the CLI, as the page, estimates from it and probes nothing
    db = open_store(f"sqlite:///{home / 'spectune.db'}")
    sid = db.create_session(target=TINY.target, drafts=["ngram"], gammas=[2], temperatures=[0.0], max_new_tokens=8,
                            dtype="float32", n_prompts=2, options={"engine": "spectune"})  # fmt: skip
    db.claim_next_session("test:1")
    db.set_hardware(sid, str(describe_hardware()["label"]))
    db.finish_session(sid, "done", summary={"runs": [{}], "baselines": [{}]})
    measured = kept()
    again = subprocess.run([*args, "--estimate", "--probe"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("not probed: a finished session") and f"session #{sid}" in again.stdout
    assert kept() == measured
    db.delete_session(sid)
    alone = subprocess.run([*args, "--probe"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 2 and "--probe goes with --estimate" in alone.stderr and "Traceback" not in alone.stderr
    assert open_store(f"sqlite:///{home / 'spectune.db'}").list_sessions() == []
