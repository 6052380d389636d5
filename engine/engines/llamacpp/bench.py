"""k-token batch times in llama.cpp, from llama-bench: the raw material of v(k) (engine/measure/verify_cost.py).

llama-bench's prompt-processing test `-p k -d depth` evaluates k tokens in one batch on top of `depth`
tokens of context: exactly what verifying γ+1 = k positions costs the target. Rounds alternate the order of
the k's (1, 2, 4, … then … 4, 2, 1), one sample each, so every k is timed close to a 1-token batch and a change
in the machine's load lands on both sides of a ratio.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from engine.engines.llamacpp import kernels
from engine.engines.llamacpp.binaries import LlamaBuild
from engine.engines.llamacpp.server import ServerError


def _round(
    build: LlamaBuild,
    model: Path,
    order: list[int],
    threads: int | None,
    depth: int,
    warm: bool,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[int, float]:
    """One llama-bench run: seconds of one k-token batch for each k, in the given order; killed at once when
    `should_stop` says so (ServerError)."""
    command = [str(build.tool("llama-bench")), "-m", str(model), "-p", ",".join(map(str, order)), "-n", "0",
               "-d", str(depth), "-r", "1", "-o", "json"]  # fmt: skip
    if threads:
        command += ["-t", str(threads)]
    if not warm:
        command.append("--no-warmup")
    known_broken = kernels.repack_broken(build.server_sha256) is not None
    if known_broken:
        command += kernels.BENCH_FLAGS
    done = _run(command, 600.0, should_stop)
    if kernels.crashed(done.returncode) and not known_broken:
        # engine.engines.llamacpp.kernels: a kernel this CPU cannot run; once more without repacking
        code = done.returncode
        done = _run(command + list(kernels.BENCH_FLAGS), 600.0, should_stop)
        if done.returncode == 0:
            kernels.mark_repack_broken(build.server_sha256, kernels.crash_line("llama-bench", code))
    if done.returncode != 0:
        raise ServerError(f"llama-bench exited with code {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        rows = json.loads(done.stdout)
        return {int(row["n_prompt"]): float(row["avg_ns"]) / 1e9 for row in rows if int(row["n_gen"]) == 0}
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(f"llama-bench printed no usable JSON: {done.stdout[:200]!r}") from exc


def _run(command: list[str], timeout_s: float, should_stop: Callable[[], bool]) -> subprocess.CompletedProcess:
    """Run llama-bench to its end, or kill it when `should_stop` says so or it runs past `timeout_s`."""
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ServerError(f"llama-bench failed to run: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out, err = proc.communicate(timeout=0.2)
            return subprocess.CompletedProcess(command, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            stopped = should_stop()
            if stopped or time.monotonic() > deadline:
                proc.kill()
                proc.communicate()
                why = "llama-bench was stopped" if stopped else f"llama-bench ran past {timeout_s:.0f} s"
                raise ServerError(why) from None


def batch_times(
    build: LlamaBuild,
    model: Path,
    ks: list[int],
    rounds: int = 5,
    threads: int | None = None,
    depth: int = 64,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict[int, list[float]]:
    """Seconds of a k-token batch per round, for each k (rounds in alternating order; the first one warmed up);
    ServerError as soon as `should_stop` says so."""
    if 1 not in ks:
        raise ValueError("the k's must include 1: every v(k) is a ratio to a 1-token batch")
    times: dict[int, list[float]] = {k: [] for k in ks}
    for index in range(rounds):
        order = sorted(ks, reverse=index % 2 == 1)
        for k, seconds in _round(build, model, order, threads, depth, index == 0, should_stop).items():
            if k in times:
                times[k].append(seconds)
    if not times[1] or min(times[1]) <= 0:
        raise ServerError("llama-bench did not time a 1-token batch")
    return times
