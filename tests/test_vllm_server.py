"""A managed vLLM server (engine.engines.vllm.server), real processes: it serves, says what it is, and no API server,
EngineCore or Worker survives its stop, a crash, or a SIGTERM or SIGKILL of the process that started it.

vLLM CPU 0.32.0 from .venv-vllm (make setup) on the bundled SmolLM2-135M in float32, --enforce-eager: each start
takes about a minute on 2 cores, so the serving checks share one server (the stop check stops it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from engine.engines.vllm.binaries import find_vllm
from engine.engines.vllm.server import VllmConfig, VllmServer, VllmServerError
from engine.models.loading import prepare_bundled
from engine.serving.metrics import parse_metrics
from foundation.processes import process_group

ROOT = Path(__file__).resolve().parents[1]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
REPEATS = "a b c d e f g a b c d e f g a b c d e f g a b c d e f g a b c"
GONE_WITHIN_S = 60.0


def smollm() -> Path:
    return prepare_bundled("smollm2-135m")


def config(speculative: dict | None = NGRAM) -> VllmConfig:
    return VllmConfig.with_speculation(smollm(), speculative, max_model_len=512, kv_cache_mib=256)


def wait_gone(pgid: int, within_s: float = GONE_WITHIN_S) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := process_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def names(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


@pytest.fixture(scope="module")
def served():
    with VllmServer(config()) as server:
        yield server


def test_it_serves_and_says_what_it_is(served: VllmServer) -> None:
    assert served.version == find_vllm().version == "0.32.0"
    assert served.kernel is not None and "AVX" in served.kernel  # the CPU kernel library the Worker mapped
    assert served.startup_s is not None and served.startup_s > 0
    running = " | ".join(names(served.processes()))
    assert "VLLM::EngineCore" in running and "VLLM::Worker" in running and "api_server" in running
    body = json.dumps({"model": str(served.config.model), "prompt": REPEATS, "max_tokens": 24, "temperature": 0})
    request = urllib.request.Request(
        f"{served.url}/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert json.loads(reply.read())["choices"][0]["text"]
    with urllib.request.urlopen(f"{served.url}/metrics", timeout=10) as reply:
        counters = parse_metrics(reply.read().decode())
    assert counters.drafts and counters.drafts > 0 and counters.accepted_tokens is not None
    assert set(counters.accepted_per_position) == {0, 1, 2}


def test_stop_leaves_no_process(served: VllmServer) -> None:
    """The shared server, stopped after the checks above have used it."""
    pgid = served.proc.pid  # type: ignore[union-attr]
    assert len(process_group(pgid)) >= 4  # guard, API server, EngineCore, Worker
    served.stop()
    assert wait_gone(pgid, 5.0) == [] and not served.alive()


def test_a_crash_of_its_engine_leaves_no_process_and_the_log_says_why() -> None:
    server = VllmServer(config(None)).start()
    pgid = server.proc.pid  # type: ignore[union-attr]
    engine = next(pid for pid, name in zip(server.processes(), names(server.processes()), strict=False)
                  if "EngineCore" in name)  # fmt: skip
    os.kill(engine, signal.SIGKILL)
    assert wait_gone(pgid) == [], "the guard sweeps the API server and the Worker after the EngineCore died"
    with pytest.raises(VllmServerError, match="exited with code"):
        server.check_alive()
    server.stop()


OWNER = textwrap.dedent("""
    import json, sys, time
    from engine.engines.vllm.server import VllmConfig, VllmServer
    server = VllmServer(VllmConfig.from_json(sys.argv[1])).start()
    print(json.dumps({"pgid": server.proc.pid, "pids": server.processes(), "log": str(server.log_path)}), flush=True)
    time.sleep(3600)
""")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["owner-sigkill", "owner-sigterm"])
def test_no_process_outlives_its_owner(how: signal.Signals) -> None:
    """The process that started the server is killed (SIGKILL runs no handler; a plain SIGTERM none either)."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, config(None).to_json()], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    started: dict = {}
    try:
        started = json.loads(owner.stdout.readline())  # type: ignore[union-attr]
        assert len(started["pids"]) >= 4
        owner.send_signal(how)
        owner.wait(30)
        assert wait_gone(started["pgid"]) == [], names(process_group(started["pgid"]))
    finally:
        if owner.poll() is None:
            owner.kill()
        if started.get("log"):  # the killed owner could not remove its server's log
            Path(started["log"]).unlink(missing_ok=True)


def test_a_bad_model_dir_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VllmServerError, match="not a model"):
        VllmServer(VllmConfig(tmp_path)).start()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VllmServerError, match="exited with code .* its log ends") as failed:
        VllmServer(VllmConfig(tmp_path)).start()
    assert "model_type" in str(failed.value) or "Unrecognized model" in str(failed.value)


def test_a_bad_speculative_config_is_refused_with_the_log_tail() -> None:
    with pytest.raises(VllmServerError, match="its log ends") as failed:
        VllmServer(config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
                           "prompt_lookup_max": 2})).start()  # fmt: skip
    assert "prompt_lookup" in str(failed.value)
