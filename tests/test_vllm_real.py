"""vLLM for real (CPU build 0.32.0 from .venv-vllm, the bundled SmolLM2-135M, float32, --enforce-eager):

- closed loop for the vLLM export: vLLM started with exactly the `speculative_config` that `recommend --export vllm`
  writes (n-gram and a draft model, fixed γ) serves, and its /metrics counters show speculation running;
- the endpoint client against a real vLLM, alone and as an endpoint session through the worker (detection from
  /version, counters parsed, per-position acceptance, every request stored);
- a session in `--engine vllm` through the one sweep driver: baseline and n-gram at concurrency 1 and 2, a
  configuration whose server cannot start failed with its log's tail, a server that crashes mid-session failed
  the same way; no vLLM process left behind;
- a γ-by-batch-size export (from a measured surface) launched as the file says by `check-export`'s session, beside
  its fixed γ and the target alone.

Each vLLM start takes about a minute on 2 cores: the n-gram export's server is shared by the export and endpoint
checks."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.analysis.export import export
from engine.analysis.export.vllm_read import read_vllm_export
from engine.analysis.recommend import DraftMeasurement, recommend
from engine.engines.vllm.runner import VllmRunner
from engine.engines.vllm.server import VllmConfig, VllmServer
from engine.measure.hardware import cpu_has_bf16
from engine.models.loading import prepare_bundled
from engine.models.pool import ModelPool
from engine.service.decide.recommendations import recommend_and_export
from engine.service.endpoint_sessions import probe_endpoint, submit_endpoint_session
from engine.service.export_check import export_check_rows, submit_export_check
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.serving.metrics import parse_metrics
from engine.session.runner import DecodeContext, PromptText, RunFailed, RunKey
from engine.session.spec import SessionSpec
from foundation.processes import process_group
from store import open_store
from tests.test_recommend_surface import store_vllm_session

GAMMA = 3
REPEATS = "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef h(x):\n    return x + 1\n\ndef k(x):\n"
PROMPTS = [
    PromptText("p0", "Repeat after me: one two three, one two three, one two three."),
    PromptText(
        "p1", "Complete: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):"
    ),
]


def smollm() -> str:
    return str(prepare_bundled("smollm2-135m"))


def vllm_processes() -> set[int]:
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if ("vllm.entrypoints" in cmd or "VLLM::" in cmd or "engine/engines/vllm/guard.py" in cmd) and (
                proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True, scope="module")
def no_vllm_left_behind():
    before = vllm_processes()
    yield
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and vllm_processes() - before:
        time.sleep(0.5)
    assert not (vllm_processes() - before), "a vLLM process was left running"


def exported(method: str) -> dict:
    """What `recommend --export vllm` writes for an n-gram or a draft-model recommendation at γ = 3 (SmolLM2 as its
    own draft), from the session's target and draft as directories."""
    if method == "ngram":
        m = DraftMeasurement("ngram-3", "ngram", None, 0.5, [0.6, 0.5, 0.4], 0.0, {4: 1.1}, ngram_max=3, ngram_min=1)
    else:
        m = DraftMeasurement("smollm2", "draft_model", smollm(), 0.9, [0.9, 0.9, 0.9], 0.05, {4: 1.05})
    doc = json.loads(export(recommend([m], "latency", "memory-bound", gammas=[GAMMA]), "vllm", target=smollm())[1])
    assert doc["engine"] == "vllm" and doc["speculative_config"]["num_speculative_tokens"] == GAMMA
    return doc


def launched(doc: dict) -> VllmServer:
    """vLLM started as the file's `usage` line says: its model, and its speculative_config as the JSON flag."""
    model = shlex.split(doc["usage"])[2]
    config = VllmConfig(Path(model), speculative=json.dumps(doc["speculative_config"]), max_model_len=1024,
                        kv_cache_mib=256)  # fmt: skip
    return VllmServer(config)


def completion(server: VllmServer, prompt: str, tokens: int = 32) -> dict:
    body = json.dumps({"model": str(server.config.model), "prompt": prompt, "max_tokens": tokens, "temperature": 0})
    request = urllib.request.Request(
        f"{server.url}/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())


def counters(server: VllmServer):
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        return parse_metrics(reply.read().decode())


@pytest.fixture(scope="class")
def ngram_server():
    with launched(exported("ngram")) as server:
        yield server


class TestTheNgramExportsServer:
    """Checks that share the n-gram export's server (stopped after them, before the others start theirs)."""

    def test_the_ngram_export_serves_and_speculates(self, ngram_server: VllmServer) -> None:
        assert ngram_server.config.speculative_config == {"method": "ngram", "num_speculative_tokens": GAMMA,
                                                          "prompt_lookup_max": 3, "prompt_lookup_min": 1}  # fmt: skip
        assert completion(ngram_server, REPEATS)["choices"][0]["text"]
        seen = counters(ngram_server)
        assert seen.drafts > 0 and seen.draft_tokens > 0 and seen.accepted_tokens > 0
        assert sorted(seen.accepted_per_position) == list(range(GAMMA))

    def test_the_target_top_after_a_prefix_is_the_token_it_decoded_there(self, ngram_server: VllmServer) -> None:
        """VllmRunner.reference_at: the prompt's token ids (vLLM's /tokenize) and a prefix of the target's own greedy
        output, one token generated with its top log-probs; the token the target decoded there is its best, or
        within the fidelity tolerance of it."""
        from engine.engines.vllm import client
        from engine.measure.fidelity import TOLERANCE

        runner, baseline = VllmRunner(), RunKey("none", 0, 0.0)
        runner.spec = SessionSpec(target="smollm2-135m", drafts=["ngram"], gammas=[GAMMA], max_new_tokens=12,
                                  engine="vllm")  # fmt: skip
        runner.configs, runner.servers = {baseline: ngram_server.config}, {ngram_server.config: ngram_server}
        runner.prompts = [REPEATS]
        model = str(ngram_server.config.model)
        output = client.batch(ngram_server.url, model, [REPEATS], runner._sampling(0.0), 0, 300.0).completions[0]
        assert len(output.token_ids) == 12
        for k in (0, 4, 11):
            top = runner.reference_at(0, output.token_ids[:k])
            token = output.token_ids[k]
            assert top is not None and top.values == sorted(top.values, reverse=True) and token in top.ids
            assert top.values[0] - top.values[top.ids.index(token)] <= TOLERANCE["bfloat16"]

    def test_the_endpoint_client_against_a_real_vllm(self, ngram_server: VllmServer) -> None:
        endpoint = {"url": ngram_server.url, "concurrency": [1, 2], "max_requests": 2, "request_timeout_s": 300.0}
        report = probe_endpoint(endpoint, [REPEATS, PROMPTS[1].text], max_new_tokens=16)
        assert report["stopped"] is None
        (ep,) = report["endpoints"]
        assert (ep["engine"], ep["server_version"]) == ("vllm", "0.32.0")
        assert ep["model"] == str(ngram_server.config.model)
        for level in ep["levels"]:
            assert level["ok"] == level["requests"] == 2 and level["output_tokens"] > 0 and level["ttft_p50_s"]
            assert level["acceptance_source"] == "counters" and level["drafts"] > 0
            assert level["mean_acceptance_length"] == pytest.approx(1 + level["accepted_tokens"] / level["drafts"])
            rates = level["per_position_acceptance"]
            assert rates and len(rates) <= GAMMA and all(0 <= r <= 1 for r in rates)

    def test_an_endpoint_session_against_a_real_vllm_through_the_worker(
        self, ngram_server: VllmServer, tmp_path: Path
    ) -> None:
        store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
        try:
            set_id, _, _ = store.add_prompt_set("ep", "ep.txt", [{"text": t, "category": None}
                                                                 for t in (REPEATS, PROMPTS[1].text)])  # fmt: skip
            endpoint = {"url": ngram_server.url, "concurrency": [1, 2], "max_requests": 2, "request_timeout_s": 300.0}
            sid = submit_endpoint_session(store, endpoint, set_id, max_new_tokens=12)
            assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
            report = store.get_session(sid)["summary"]["endpoint"]
            rows = store.list_endpoint_requests(sid)
        finally:
            store.close()
        (ep,) = report["endpoints"]
        assert (ep["engine"], ep["server_version"]) == ("vllm", "0.32.0")
        assert [lv["concurrency"] for lv in ep["levels"]] == [1, 2]
        assert len(rows) == 4 and all(r["ok"] and r["output_tokens"] > 0 and r["ttft_s"] > 0 for r in rows)
        for lv in ep["levels"]:
            assert lv["acceptance_source"] == "counters" and lv["drafts"] > 0
            assert lv["mean_acceptance_length"] == pytest.approx(1 + lv["accepted_tokens"] / lv["drafts"])
            assert lv["per_position_acceptance"] and all(0 <= a <= 1 for a in lv["per_position_acceptance"])

    def test_watch_reads_a_real_vllm_and_offers_its_files(self, ngram_server: VllmServer, tmp_path: Path) -> None:
        """`watch` on the running vLLM's /metrics: its γ from the per-position counters vLLM creates at start, a
        window of vLLM's figures (the engine named, time per output token from its histogram), judged against a
        stored vLLM session; the file a collapsed window would offer is vLLM's, naming the γ it turns off."""
        from engine.service.watch import deployed_gamma, deployment_for, record, watch
        from engine.service.watch_actions import action_file
        from engine.watch.scrape import MetricsSource
        from engine.watch.verdict import COLLAPSED, VERDICTS

        store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
        try:
            sid = store_vllm_session(store)
            source = MetricsSource(ngram_server.url)
            gamma, basis = deployed_gamma(source)
            assert gamma == GAMMA and "per-position" in basis
            dep = deployment_for(store, sid, "ngram", gamma)
            steps = [lambda: completion(ngram_server, REPEATS)]
            (judged,) = watch(store, source, dep, "vllm", 5.0, 1, polls=1, sleep=lambda _s: steps.pop(0)())
            window = judged.window
            assert window.state == "ok" and window.engine == "vllm", window
            assert window.num_drafts and 1.0 <= window.mean_acceptance_length <= GAMMA + 1
            assert window.emitted_tokens == 32 and window.requests_running is not None
            assert window.time_per_output_token_s is not None and 0 < window.time_per_output_token_s < 10
            assert judged.verdict.verdict in VERDICTS and judged.verdict.batch == 1
            offered = action_file(store, COLLAPSED, record(window, judged.verdict, dep))
            assert offered is not None and offered.fmt == "vllm" and offered.checkable
            off = read_vllm_export(offered.text)
            assert off.off and (off.draft, off.gamma) == ("ngram", GAMMA)
            self._through_prometheus(ngram_server, dep, tmp_path)
        finally:
            store.close()

    @staticmethod
    def _through_prometheus(server: VllmServer, dep: Any, folder: Path) -> None:
        """The same server scraped by a real Prometheus: its γ and a window of its figures through PromQL."""
        from engine.watch.prometheus import PrometheusSource
        from tests.watch_parts import running_prometheus

        with running_prometheus(server.url.split("//")[1], folder, job="vllm") as prom:
            source = PrometheusSource(prom, 'job="vllm"')
            deadline = time.monotonic() + 30
            while source.targets_up(time.time()) != 1.0 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert source.positions() == GAMMA  # vLLM counts every position from its start
            began = time.time()
            completion(server, REPEATS)
            time.sleep(3.0)  # scraped after the request ended
            window = source.window(time.time() - began + 1.0)
        assert window.state == "ok" and window.engine == "vllm", window
        assert window.num_drafts and 1.0 <= window.mean_acceptance_length <= GAMMA + 1
        assert window.time_per_output_token_s is not None and window.time_per_output_token_s > 0


def test_the_draft_model_export_serves_and_speculates() -> None:
    doc = exported("draft_model")
    assert doc["speculative_config"] == {"method": "draft_model", "model": smollm(), "num_speculative_tokens": GAMMA}
    with launched(doc) as server:
        assert completion(server, REPEATS, 24)["choices"][0]["text"]
        seen = counters(server)
    assert seen.drafts > 0 and seen.draft_tokens == GAMMA * seen.drafts
    assert seen.accepted_tokens > 0.8 * seen.draft_tokens  # its own draft, greedy: almost every token accepted


def test_a_vllm_session_through_the_worker_and_the_one_driver(tmp_path: Path) -> None:
    """Submitted and run by the worker as `submit --engine vllm` queues it; the store keeps every run."""
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    spec = SessionSpec(target="smollm2-135m", drafts=["ngram", str(broken)], gammas=[GAMMA], max_new_tokens=16,
                       dtype="bfloat16", engine="vllm", concurrency=[1, 2], measure_verify_cost=False,
                       detect_regime=False)  # fmt: skip
    store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    try:
        set_id, _, _ = store.add_prompt_set("v", "v.txt", [{"text": p.text, "category": None} for p in PROMPTS])
        sid = submit_session(store, spec, set_id, len(PROMPTS))
        assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
        report = store.get_session(sid)["summary"]
        stored = store.list_runs(sid)
    finally:
        store.close()
    levels = sorted(((r["draft"], r["status"], (r["summary"] or {}).get("concurrency")) for r in stored), key=str)
    assert levels == sorted([("none", "done", 1), ("none", "done", 2), ("ngram", "done", 1), ("ngram", "done", 2),
                             (str(broken), "failed", None), (str(broken), "failed", None)], key=str)  # fmt: skip
    assert report["engine"] == "vllm" and report["dtype"] == ("bfloat16" if cpu_has_bf16() else "float32")
    info = report["vllm"]
    assert info["version"] == info["server_version"] == "0.32.0" and "AVX" in info["kernel"]
    assert [s["startup_s"] > 0 for s in info["startups"]] == [True, True]
    assert {"alpha", "beta_per_position"} <= set(report["unavailable"])
    assert [(b["concurrency"], b["speedup_measured"]) for b in report["baselines"]] == [(1, 1.0), (2, 1.0)]
    runs = {(r["draft"], r["concurrency"]): r for r in report["runs"]}
    assert sorted(runs) == [("ngram", 1), ("ngram", 2)]
    for run in runs.values():
        assert run["alpha"] is None and run["speedup_measured"] > 0 and isinstance(run["speedup_noisy"], bool)
        assert run["tokens_per_call"] >= 1 and run["draft_acceptance_rate"] is not None
        assert run["ttft_p50_s"] > 0 and run["itl_p50_s"] > 0 and run["tokens"] >= 2 * 16 * run["concurrency"] // 2
        assert all(d["verdict"] in ("identical", "near-tie") for d in run["divergences"])
    assert runs[("ngram", 2)]["tokens"] > runs[("ngram", 1)]["tokens"]  # two prompts in flight per measurement
    # one request in flight: its drafting step in target-alone steps, what the step overhead is fitted to
    assert runs[("ngram", 1)]["verify_in_loop"]["steps"] > 0 and runs[("ngram", 2)]["verify_in_loop"] is None
    failed = {(f["draft"], f.get("concurrency", 1)): f["error"] for f in report["failed"]}
    assert sorted(failed) == [(str(broken), 1), (str(broken), 2)]
    assert all("its log ends" in error for error in failed.values())


@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_a_server_that_crashes_or_hangs_mid_session_fails_its_configuration_with_its_log(fault: str) -> None:
    """crash: its EngineCore is SIGKILLed; hang: its Worker is SIGSTOPped (a request then times out)."""
    spec = SessionSpec(target="smollm2-135m", drafts=["none"], gammas=[1], max_new_tokens=8, engine="vllm")
    runner = VllmRunner()
    runner.request_timeout_s = 30.0
    ctx = DecodeContext(on_step=lambda r: None, should_stop=lambda: False, phase=lambda *a: None)
    key = RunKey("none", 0, 0.0)
    try:
        assert runner.start(spec, PROMPTS, [key], ctx) == {}
        assert runner.decode(key, 0, ctx, reference=True).output.token_ids
        server = next(iter(runner.servers.values()))
        pgid = server.proc.pid
        part = "EngineCore" if fault == "crash" else "Worker"
        victim = next(p for p in psutil.Process(pgid).children(recursive=True) if part in " ".join(p.cmdline()))
        os.kill(victim.pid, signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
        with pytest.raises(RunFailed, match="its log ends"):
            for _ in range(30):  # the API server notices its engine is gone within a few seconds
                runner.decode(key, 1, ctx, reference=False)
                time.sleep(1)
        assert runner.servers == {}
        assert process_group(pgid) == []
    finally:
        runner.stop()


def test_a_measured_schedule_is_launched_as_exported_beside_its_fixed_gamma(tmp_path: Path) -> None:
    """γ by batch size from a vLLM surface (stored as the worker stores one: γ=3 pays alone, only γ=1 at two in
    flight), exported by `recommend --export vllm` and checked by `check-export`'s session: vLLM launched with
    exactly the file's speculative_config beside the fixed γ and the target alone, at both levels; vLLM follows the
    schedule (fewer tokens drafted per step with two requests in flight)."""
    store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    try:
        surface = {1: {1: [1.15, 1.20, 1.25], 2: [1.05, 1.10, 1.15]}, 3: {1: [1.4, 1.5, 1.6], 2: [0.8, 0.9, 0.95]}}
        source = store_vllm_session(store, surface, [REPEATS, PROMPTS[1].text], max_new_tokens=24,
                                    measure_verify_cost=False, detect_regime=False)  # fmt: skip
        result = recommend_and_export(store, [source], formats=("vllm",), engine="vllm")
        text = result.files["vllm"][1]
        exported = read_vllm_export(text)
        assert exported.gamma == result.recommendation.gamma
        assert exported.schedule is not None and exported.schedule[2] == 1 < exported.gamma
        check = submit_export_check(store, source, text)
        assert run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1") == "done"
        report = store.get_session(check)["summary"]
        rows = export_check_rows(store, check)
        runs = store.list_runs(check)
    finally:
        store.close()
    configs = [s["speculative_config"] for s in report["vllm"]["startups"]]
    assert json.loads(text)["speculative_config"] in configs  # the file's speculative_config, exactly
    assert {"method": "ngram", "num_speculative_tokens": exported.gamma, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1} in configs and None in configs  # the fixed γ and the target alone  # fmt: skip
    assert [r.level for r in rows] == [1, 2]
    for row in rows:
        assert row.baseline_tokens_per_s > 0 and row.fixed > 0 and row.schedule > 0
        assert row.winner() in ("schedule", "fixed γ", "tie") or row.winner().endswith("(inside the noise)")
    live = {int(r["summary"]["concurrency"]): r["summary"]["policy_live"] for r in runs
            if (r["summary"] or {}).get("policy") and r["status"] == "done"}  # fmt: skip
    assert sorted(live) == [1, 2] and all(lv["tokens_per_call"] >= 1 for lv in live.values())
    assert 0 < live[2]["mean_drafted_per_step"] < live[1]["mean_drafted_per_step"] <= exported.gamma
