"""A llama.cpp whose repacked kernels this CPU cannot run (engine.engines.llamacpp.kernels), against real llama-server
processes: the fault is injected by a wrapper that dies by SIGILL, as the AMX build did on a Xeon whose virtual
machine reports AMX, unless it is started with --no-repack, and then runs the real llama-server."""

from __future__ import annotations

import dataclasses
import json
import signal
import stat
from pathlib import Path

import pytest

from engine.engines.llamacpp import client, kernels
from engine.engines.llamacpp.bench import batch_times
from engine.engines.llamacpp.binaries import LlamaBuild, find_llama
from engine.engines.llamacpp.server import ManagedServer, ServerConfig, ServerError
from engine.models.bundled import gguf_for
from tests.test_llamacpp import no_server_left_behind as no_server_left_behind  # autouse: every server stops

MODEL = "smollm2-135m"


def faulty_build(tmp: Path, sha: str, *, fallback_serves: bool = True) -> LlamaBuild:
    """The installed llama.cpp behind a llama-server that dies by SIGILL when repacking is on (and, with
    `fallback_serves` False, always)."""
    real = find_llama()
    tmp.mkdir(parents=True, exist_ok=True)
    wrapper = tmp / "llama-server"
    serve = f'exec "{real.server}" "$@"' if fallback_serves else "kill -ILL $$"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" --no-repack "*) {serve};; esac\nkill -ILL $$\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    bench = tmp / "llama-bench"  # llama-bench spells it --repack 0
    bench.write_text(f'#!/bin/sh\ncase " $* " in *" --repack 0"*) exec "{real.tool("llama-bench")}" "$@";; esac\n'
                     "kill -ILL $$\n")  # fmt: skip
    bench.chmod(bench.stat().st_mode | stat.S_IXUSR)
    return dataclasses.replace(real, bin_dir=tmp, server_sha256=sha)


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bundled model's GGUF, then the marker's home moved to a model cache of the test's own (the machine's
    real marker is not touched): tmp_path / cache / llama-kernels."""
    path = gguf_for(MODEL, "target")
    monkeypatch.setenv("SPECTUNE_MODEL_CACHE", str(tmp_path / "cache" / "models"))
    return path


def test_a_crash_is_a_signal_and_an_exit_is_not() -> None:
    assert kernels.crashed(-signal.SIGILL) and kernels.crashed(-signal.SIGSEGV) and kernels.crashed(-signal.SIGBUS)
    assert not kernels.crashed(1) and not kernels.crashed(0) and not kernels.crashed(None)
    assert not kernels.crashed(-signal.SIGTERM) and not kernels.crashed(-signal.SIGKILL)  # stopped, not a fault


def test_a_server_that_dies_by_sigill_is_started_without_repacking_and_that_is_remembered(
    tmp_path: Path, gguf: Path
) -> None:
    cache = tmp_path / "cache" / "llama-kernels"
    build = faulty_build(tmp_path / "bin", "faulty-amx")
    config = ServerConfig(model=gguf, ctx_size=512)
    assert kernels.repack_broken(build.server_sha256) is None
    with ManagedServer(config, build=build) as server:
        assert server.no_repack and "--no-repack" in server.command
        assert client.complete(server.url, "The capital of France is", 4).predicted_n >= 1  # it serves
    why = kernels.repack_broken(build.server_sha256)
    assert why == "llama-server died by SIGILL with repacked weights on this CPU: llama.cpp runs here with --no-repack"
    assert [p.name.startswith("no-repack-") for p in cache.iterdir()] == [True]
    assert build.describe()["no_repack"] == why  # what a session stores with its llama.cpp build
    with ManagedServer(config, build=build) as again:  # remembered: started without repacking at once
        assert again.no_repack and again.alive()
    healthy = dataclasses.replace(find_llama(), server_sha256="another-build")
    assert kernels.repack_broken(healthy.server_sha256) is None  # per build (and per CPU), not for every llama.cpp


def test_a_server_that_crashes_without_repacking_too_fails_with_its_code_and_teaches_nothing(
    tmp_path: Path, gguf: Path
) -> None:
    build = faulty_build(tmp_path / "bin", "broken-anyway", fallback_serves=False)
    with pytest.raises(ServerError, match=f"exited with code -{int(signal.SIGILL)} while starting"):
        ManagedServer(ServerConfig(model=gguf, ctx_size=512), build=build).start()
    assert kernels.repack_broken(build.server_sha256) is None
    assert not (tmp_path / "cache" / "llama-kernels").exists()


def test_the_marker_names_the_cpu_it_was_learnt_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_MODEL_CACHE", str(tmp_path / "cache" / "models"))
    kernels.mark_repack_broken("sha", "llama-bench died by SIGILL")
    stored = json.loads(next((tmp_path / "cache" / "llama-kernels").iterdir()).read_text())
    assert stored["why"] == "llama-bench died by SIGILL" and "flags" in stored["cpu"]


def test_llama_bench_that_dies_by_sigill_times_without_repacking(tmp_path: Path, gguf: Path) -> None:
    build = faulty_build(tmp_path / "bin", "faulty-bench")
    times = batch_times(build, gguf, [1, 2], rounds=2, threads=2, depth=8)
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())
    assert kernels.repack_broken(build.server_sha256) == (
        "llama-bench died by SIGILL with repacked weights on this CPU: llama.cpp runs here with --no-repack"
    )
