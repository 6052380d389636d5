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

from engine.engines.llamacpp.server import ServerConfig
from engine.models.bundled import gguf_for
from foundation.processes import die_with_parent, free_port
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


class PacedLoad:
    """Requests kept in flight in phases, and a `sleep` for the watch that waits for the load, not the clock.

    `phases` are (concurrency, prompt, requests per poll). A window of the watch makes `polls` reads, each after a
    call to `sleep`: window k runs phase k (the last phase from then on), and each of its reads waits until that
    phase has finished `requests per poll` more requests. A window therefore holds the same traffic on a slow or a
    busy machine as on a quiet one. A phase's threads stop after their request in flight once it ends; leaving the
    context stops them all. `finished` counts each phase's finished requests."""

    def __init__(self, url: str, phases: list[tuple[int, str, int]], polls: int, timeout_s: float = 300.0) -> None:
        self.url, self.phases, self.polls, self.timeout_s = url, phases, polls, timeout_s
        self.finished = [0] * len(phases)
        self._changed = threading.Condition()
        self._stops = [threading.Event() for _ in phases]
        self._threads: list[threading.Thread] = []
        self._calls = 0
        self._phase = -1
        self._target = 0

    def __enter__(self) -> PacedLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        for stop in self._stops:
            stop.set()
        for thread in self._threads:
            thread.join(timeout=180)

    def sleep(self, _seconds: float) -> None:
        """Wait for the next read's share of the load (the seconds the watch asks for are ignored)."""
        phase = min(self._calls // self.polls, len(self.phases) - 1)
        self._calls += 1
        if phase != self._phase:
            self._start(phase)
        self._target += self.phases[phase][2]
        deadline = time.monotonic() + self.timeout_s
        with self._changed:
            while self.finished[phase] < self._target:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"phase {phase}: {self.finished[phase]} of {self._target} requests finished")
                self._changed.wait(min(left, 1.0))

    def _start(self, phase: int) -> None:
        if self._phase >= 0:
            self._stops[self._phase].set()
        self._phase, self._target = phase, self.finished[phase]
        concurrency, prompt, _ = self.phases[phase]
        for _ in range(concurrency):
            thread = threading.Thread(target=self._send, args=(phase, prompt), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _send(self, phase: int, prompt: str) -> None:
        while not self._stops[phase].is_set():
            complete(self.url, prompt, tokens=32)
            with self._changed:
                self.finished[phase] += 1
                self._changed.notify_all()


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
