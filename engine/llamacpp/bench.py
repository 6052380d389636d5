"""k-token batch times in llama.cpp, from llama-bench: the raw material of v(k) (engine/measure/verify_cost.py).

llama-bench's prompt-processing test `-p k -d depth` evaluates k tokens in one batch on top of `depth`
tokens of context: exactly what verifying γ+1 = k positions costs the target. Rounds alternate the order of
the k's (1, 2, 4, … then … 4, 2, 1), one sample each, so every k is timed close to a 1-token batch and a change
in the machine's load lands on both sides of a ratio.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from engine.llamacpp.binaries import LlamaBuild
from engine.llamacpp.server import ServerError


def _round(build: LlamaBuild, model: Path, order: list[int], threads: int | None, depth: int, warm: bool) -> dict[
    int, float
]:
    """One llama-bench run: seconds of one k-token batch for each k, in the given order."""
    command = [str(build.tool("llama-bench")), "-m", str(model), "-p", ",".join(map(str, order)), "-n", "0",
               "-d", str(depth), "-r", "1", "-o", "json"]  # fmt: skip
    if threads:
        command += ["-t", str(threads)]
    if not warm:
        command.append("--no-warmup")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"llama-bench failed to run: {exc}") from exc
    if done.returncode != 0:
        raise ServerError(f"llama-bench exited with code {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        rows = json.loads(done.stdout)
        return {int(row["n_prompt"]): float(row["avg_ns"]) / 1e9 for row in rows if int(row["n_gen"]) == 0}
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(f"llama-bench printed no usable JSON: {done.stdout[:200]!r}") from exc


def batch_times(
    build: LlamaBuild, model: Path, ks: list[int], rounds: int = 5, threads: int | None = None, depth: int = 64
) -> dict[int, list[float]]:
    """Seconds of a k-token batch per round, for each k (rounds in alternating order; the first one warmed up)."""
    if 1 not in ks:
        raise ValueError("the k's must include 1: every v(k) is a ratio to a 1-token batch")
    times: dict[int, list[float]] = {k: [] for k in ks}
    for index in range(rounds):
        order = sorted(ks, reverse=index % 2 == 1)
        for k, seconds in _round(build, model, order, threads, depth, warm=index == 0).items():
            if k in times:
                times[k].append(seconds)
    if not times[1] or min(times[1]) <= 0:
        raise ServerError("llama-bench did not time a 1-token batch")
    return times
