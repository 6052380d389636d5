"""v(k) in llama.cpp: the time of one k-token batch over a warm context ÷ a 1-token one, from llama-bench.

llama-bench's prompt-processing test `-p k -d depth` evaluates k tokens in one batch on top of `depth`
tokens of context: exactly what verifying γ+1 = k positions costs the target (spectune's own loop measures
the same ratio over its KV cache, engine/measure/verify_cost.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from engine.llamacpp.binaries import LlamaBuild
from engine.llamacpp.server import ServerError


def verify_cost_curve(
    build: LlamaBuild, model: Path, max_k: int, threads: int | None = None, depth: int = 64, reps: int = 3
) -> dict[int, float]:
    """v(k) for k = 1, 2, 4, … and max_k, never below 1 (a k-token batch does at least a 1-token's work)."""
    ks = sorted({k for k in (1, 2, 4, 8, 16) if k <= max_k} | {1, max_k})
    command = [str(build.tool("llama-bench")), "-m", str(model), "-p", ",".join(map(str, ks)), "-n", "0",
               "-d", str(depth), "-r", str(reps), "-o", "json"]  # fmt: skip
    if threads:
        command += ["-t", str(threads)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"llama-bench failed to run: {exc}") from exc
    if done.returncode != 0:
        raise ServerError(f"llama-bench exited with code {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        rows = json.loads(done.stdout)
        times = {int(row["n_prompt"]): float(row["avg_ns"]) for row in rows if int(row["n_gen"]) == 0}
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(f"llama-bench printed no usable JSON: {done.stdout[:200]!r}") from exc
    if 1 not in times or times[1] <= 0:
        raise ServerError("llama-bench did not time a 1-token batch")
    return {k: max(1.0, times[k] / times[1]) for k in ks if k in times}
