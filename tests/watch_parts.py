"""Real parts for the watch tests: a stored llama.cpp n-gram session, a llama-server speculating by n-gram lookup
with --metrics (the smallest bundled GGUF), requests that drive it, and a throwaway Prometheus server."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from processes import no_server_left_behind as no_server_left_behind  # noqa: F401 - autouse where imported

from engine.llamacpp.server import ServerConfig, die_with_parent, free_port
from engine.models.bundled import gguf_for
from store import Store, open_store

DRAFT = "ngram:3-4"
REPETITIVE = " ".join(["the cat sat on the mat."] * 5)  # continued as it goes: n-gram lookup drafts it all
SHIFTED = "the cat sat on the mat. the dog sat on the rug. the cow sat on the hay. the hen sat on the"  # drafts miss
VERIFY = {"1": 1.0, "2": 1.2, "4": 2.1, "5": 2.4}  # llama.cpp Q4 kernels on a CPU: a 5-token verify ≈ 2.4 steps
# a regime record whose batch sweep bends at 16 token rows: a verify of batch·(γ+1) rows at or past it is compute-bound
KNEE_AT_16 = {"serving_batch": 1, "batch_sweep": {"batch_sizes": [1, 2, 4, 8, 16, 32],
                                                  "step_times_s": [10.0, 10.2, 10.5, 11.0, 20.5, 40.0]}}  # fmt: skip


def ngram_config() -> ServerConfig:
    """llama-server on the smallest bundled GGUF (SmolLM2-135M), drafting by n-gram lookup (γ 4), two threads."""
    return ServerConfig(gguf_for("smollm2-135m", "target"), spec_type="ngram-simple", ngram_size_n=3,
                        ngram_size_m=4, parallel=1, ctx_size=1024, threads=2)  # fmt: skip


def scrambled_draft(folder: Path) -> Path:
    """A copy of the smallest bundled GGUF whose final norm's gains are all zero: the same architecture and
    vocabulary, so llama-server drafts with it, but every logit is 0 and it proposes the same first token at every
    position, which the target next to never accepts (a draft served under the wrong weights)."""
    import numpy as np
    from gguf import GGUFReader

    source = gguf_for("smollm2-135m", "target")
    norm = next(t for t in GGUFReader(source).tensors if t.name == "output_norm.weight")
    copy = folder / "scrambled-draft.gguf"
    shutil.copyfile(source, copy)
    gains = np.zeros(int(norm.n_elements), dtype=np.float32)
    with copy.open("r+b") as f:
        f.seek(norm.data_offset)
        f.write(gains.tobytes())
    return copy


def draft_config(draft: Path) -> ServerConfig:
    """llama-server on SmolLM2-135M drafting with `draft` at γ 4, whatever the draft's own confidence."""
    return ServerConfig(gguf_for("smollm2-135m", "target"), draft=draft, spec_type="draft-simple", draft_n_max=4,
                        draft_n_min=0, draft_p_min=0.0, parallel=1, ctx_size=1024, threads=2)  # fmt: skip


def complete(url: str, prompt: str = REPETITIVE, tokens: int = 32) -> str:
    """One greedy completion from the server (its counters move when it ends)."""
    body = json.dumps({"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": False}).encode()
    request = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return str(json.loads(reply.read())["content"])


@contextmanager
def load_steps(url: str, steps: list[tuple[int, float, str]]) -> Iterator[list[int]]:
    """Requests kept in flight against `url`, step after step: (concurrency, seconds, prompt) each, from now. Each of a
    step's threads sends one request after another until its step ends, and stops by itself after its request in
    flight; leaving the context stops every step (the longest wait: one request). Yields the finished requests'
    count per step, filled as they finish."""
    stop = threading.Event()
    done = [0] * len(steps)
    threads: list[threading.Thread] = []
    begin = time.monotonic()

    def send(step: int, start: float, end: float, prompt: str) -> None:
        while time.monotonic() < start and not stop.is_set():
            time.sleep(0.05)
        while time.monotonic() < end and not stop.is_set():
            complete(url, prompt, tokens=32)
            done[step] += 1

    for step, (concurrency, seconds, prompt) in enumerate(steps):
        for _ in range(concurrency):
            threads.append(threading.Thread(target=send, args=(step, begin, begin + seconds, prompt), daemon=True))
        begin += seconds
    for t in threads:
        t.start()
    try:
        yield done
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)


def ngram_session(store: Store, alphas: tuple[float, float] = (0.3, 0.99), verify: dict[str, float] = VERIFY,
                  draft: str = DRAFT) -> int:  # fmt: skip
    """A finished llama.cpp session of `draft` (the n-gram draft) at γ 2 and 4, its α measured at `alphas`, v(k)
    `verify`."""
    set_id, _, _ = store.add_prompt_set("watch", None, [{"text": REPETITIVE}])
    sid = store.create_session(target="smollm2-135m", drafts=[draft], gammas=[2, 4], temperatures=[0.0],
                               max_new_tokens=32, prompt_set_id=set_id, n_prompts=1,
                               options={"engine": "llama.cpp"})  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {"engine": "llama.cpp"}, tokens_per_s=6.0, tokens_per_call=1.0, speedup_measured=1.0)
    for gamma, alpha, speedup in ((2, alphas[0], 0.9), (4, alphas[1], 1.6)):
        run = store.create_run(sid, draft, gamma, 0.0, "speculative")
        store.finish_run(run, {"engine": "llama.cpp", "alpha_from_acceptance_length": alpha}, c=0.0,
                         tokens_per_s=6.0 * speedup, speedup_measured=speedup, tokens_per_call=1 + gamma * alpha,
                         per_position_acceptance=[alpha] * gamma, verify_cost=verify)  # fmt: skip
    store.finish_session(sid, "done", summary={"verify_cost": verify})
    return sid


@contextmanager
def running_prometheus(target: str, folder: Path, scrape_s: float = 1.0, job: str = "llama") -> Iterator[str]:
    """A throwaway Prometheus server on 127.0.0.1 scraping `target` (host:port, as `job`) every `scrape_s`;
    yields its root URL. It is stopped on exit, and dies with the test process if that dies first."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (make prometheus)")
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_s:g}s\n  evaluation_interval: {scrape_s:g}s\n"
        f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
    )
    log = (folder / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=die_with_parent,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()[-500:]}")
            time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)
        log.close()


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; returns once it is gone."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh SQLite store in the test's folder."""
    s = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    try:
        yield s
    finally:
        s.close()


def watch_page(home: Path, monkeypatch: pytest.MonkeyPatch, deployment: str) -> Any:
    """The Watch page (streamlit's AppTest) on the store in `home`, showing `deployment`, run once without error."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app" / "Home.py"), default_timeout=60)
    at.query_params["deployment"] = deployment
    at.switch_page("pages/8_Watch.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
