"""Endpoint tuning against real llama-server processes on 127.0.0.1 (bundled GGUF models, 2 slots each).

A speculative server (the bundled 0.5B draft) and a baseline (the target alone) are driven by an endpoint
session through the worker at concurrency 1 and 2; `python -m engine serve` + `python -m engine probe` are
run as a user would, at 4 (two requests queue for the two slots). Few tokens and short prompts keep each test
to tens of seconds on CPU. Every test checks that no llama-server it caused is left running.
"""

from __future__ import annotations

import json
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

from engine.engines.llamacpp.server import ManagedServer, ServerConfig
from engine.models.bundled import gguf_for
from engine.models.pool import ModelPool
from engine.service.endpoint_sessions import probe_endpoint, submit_endpoint_session
from engine.service.worker.loop import run_session
from store import open_store

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
SMALL = "smollm2-135m"  # serve's life cycle, where the model does not matter: its own draft, on one thread
PROMPTS = ["Write a Python function is_even(n).", "Complete: def add(a, b):", "Say hello in French."]
KEY = "spectune-test-key"


def llama_servers() -> set[int]:
    """The llama-servers this test run started that are still alive."""
    return {p.pid for p in live_llama_servers()}


@pytest.fixture(autouse=True)
def no_server_left_behind():
    before = llama_servers()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and llama_servers() - before:
        time.sleep(0.2)
    assert not (llama_servers() - before), "a llama-server was left running"


def test_an_endpoint_session_with_and_without_a_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = gguf_for(TARGET, "target"), gguf_for(DRAFT, "draft")
    spec_cfg = ServerConfig(target, draft=draft, spec_type="draft-simple", draft_n_max=4, draft_n_min=0,
                            draft_p_min=0.0, parallel=2, ctx_size=2048, threads=2,
                            extra=("--api-key", KEY))  # fmt: skip
    base_cfg = ServerConfig(target, parallel=2, ctx_size=2048, threads=2)
    monkeypatch.setenv("SPECTUNE_TEST_LLAMA_KEY", KEY)
    store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    try:
        with ManagedServer(spec_cfg) as spec, ManagedServer(base_cfg) as base:
            set_id, _, _ = store.add_prompt_set("ep", "ep.txt", [{"text": p, "category": None} for p in PROMPTS])
            endpoint = {"url": spec.url, "baseline_url": base.url, "api_key_env": "SPECTUNE_TEST_LLAMA_KEY",
                        "concurrency": [1, 2], "max_requests": 2, "request_timeout_s": 120.0}  # fmt: skip
            sid = submit_endpoint_session(store, endpoint, set_id, max_new_tokens=10)
            assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"

            monkeypatch.setenv("SPECTUNE_TEST_LLAMA_KEY", "not-the-key")  # a real 401 from llama-server --api-key
            denied = probe_endpoint({"url": spec.url, "api_key_env": "SPECTUNE_TEST_LLAMA_KEY", "concurrency": [1],
                                     "max_requests": 1}, PROMPTS, max_new_tokens=4)  # fmt: skip
        session = store.get_session(sid)
        rows = store.list_endpoint_requests(sid)
    finally:
        store.close()
    assert "401" in denied["stopped"] and "API key" in denied["stopped"]
    report = session["summary"]["endpoint"]
    by_label = {e["label"]: e for e in report["endpoints"]}
    assert {e["engine"] for e in by_label.values()} == {"llama.cpp"}
    assert by_label["speculative"]["server_version"].startswith("b11434")
    levels = {(lv["endpoint"], lv["concurrency"]): lv for e in by_label.values() for lv in e["levels"]}
    assert sorted(levels) == [("baseline", 1), ("baseline", 2), ("speculative", 1), ("speculative", 2)]

    # the store holds every request, each one measured
    assert len(rows) == sum(lv["requests"] for lv in levels.values()) == 8
    assert all(r["ok"] and r["output_tokens"] > 0 and r["ttft_s"] > 0 and r["itl_s"] for r in rows)

    for concurrency in (1, 2):
        lv = levels[("speculative", concurrency)]
        mine = [r for r in rows if r["endpoint"] == "speculative" and r["concurrency"] == concurrency]
        # acceptance from the server's /metrics counters equals acceptance summed from each response's timings
        assert lv["acceptance_source"] == "counters" and lv["drafts"] > 0
        assert lv["draft_tokens"] == sum(r["draft_n"] for r in mine)
        assert lv["accepted_tokens"] == sum(r["draft_n_accepted"] for r in mine)
        assert lv["draft_acceptance_rate"] == pytest.approx(lv["response_acceptance_rate"])
        assert lv["mean_acceptance_length"] == pytest.approx(1 + lv["accepted_tokens"] / lv["drafts"])
        assert lv["per_position_acceptance"] and all(0 <= a <= 1 for a in lv["per_position_acceptance"])
        assert lv["tokens_per_s"] > 0 and lv["ttft_p95_s"] >= lv["ttft_p50_s"] > 0
        base = levels[("baseline", concurrency)]
        assert base["draft_acceptance_rate"] is None and base["mean_acceptance_length"] is None
        assert all(r["draft_n"] in (None, 0) for r in rows if r["endpoint"] == "baseline")
    points = report["comparison"]["points"]
    assert [p["concurrency"] for p in points] == [1, 2] and all(p["speedup"] > 0 for p in points)
    assert report["comparison"]["verdict"]


def _read_ready(proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "ready:" in line:
            return line.split("ready:", 1)[1].split()[0]
        if proc.poll() is not None:
            break
    raise AssertionError(f"serve did not become ready: {proc.stderr.read() if proc.stderr else ''}")


def test_serve_in_the_foreground_then_probe_it_then_sigterm(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "probe.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    serve = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--engine", "llamacpp", "--target", SMALL, "--draft", SMALL,
         "--gamma", "3", "--parallel", "2", "--threads", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = _read_ready(serve, 180)
        assert url.startswith("http://127.0.0.1:")
        children = [c.pid for c in psutil.Process(serve.pid).children(recursive=True)]
        assert children, "serve started no llama-server"
        done = subprocess.run(
            [sys.executable, "-m", "engine", "probe", "--url", url, "--prompts", str(prompts), "--concurrency", "4",
             "--max-requests", "4", "--max-new-tokens", "8", "--timeout-s", "120", "--json", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=20) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert not [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    doc: dict[str, Any] = json.loads(out.read_text())
    assert (doc["engine"], doc["stopped"]) == ("llama.cpp", None) and doc["server_version"].startswith("b11434")
    assert [lv["concurrency"] for lv in doc["levels"]] == [4]  # 4 in flight on 2 slots: 2 wait
    for lv in doc["levels"]:
        assert lv["requests"] == 4 and lv["errors"] == 0 and lv["tokens_per_s"] > 0
        assert lv["drafts"] > 0 and 0 <= lv["draft_acceptance_rate"] <= 1 and lv["mean_acceptance_length"] >= 1
        assert lv["draft_tokens"] == lv["response_draft_tokens"]
        assert lv["accepted_tokens"] == lv["response_accepted_tokens"]
