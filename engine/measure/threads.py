"""The intra-op thread count a CPU session decodes with: the cores free when it starts, as llama-server's -t.

With another process busy on one of 2 cores, torch's default of 2 threads made a SmolLM2-135M step 2.4× slower
(207 ms against 86 ms in float32): every parallel region waits for the thread that shares a core. The session
therefore counts the cores other processes leave free, decodes the target alone and every configuration with that
one count, and stores it with the session."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.measure.telemetry_cpu import CPU_ERRORS, OtherCpu

SAMPLE_S = 0.5


def usable_cores() -> int:
    """Logical cores this process may run on (its affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads a session uses, and why: `basis` is a sentence for the Run page."""

    threads: int
    cores: int
    other_cpu_pct: float | None
    chosen: bool  # False: the user named the count

    @property
    def basis(self) -> str:
        if not self.chosen:
            return f"{self.threads} of {self.cores} cores (as set)"
        if self.other_cpu_pct is None:
            return f"{self.threads} of {self.cores} cores (other processes' load unknown)"
        return (
            f"{self.threads} of {self.cores} cores: other processes used {self.other_cpu_pct:.0f}% of the CPUs "
            f"when the session started"
        )


def choose_threads(requested: int | None = None, sample_s: float = SAMPLE_S) -> ThreadChoice:
    """`requested` when given; else the cores other processes leave free over `sample_s` seconds (at least 1)."""
    cores = usable_cores()
    if requested is not None:
        return ThreadChoice(max(1, int(requested)), cores, None, chosen=False)
    other: float | None = None
    with contextlib.suppress(*CPU_ERRORS):
        meter = OtherCpu()
        meter.mark()
        time.sleep(sample_s)
        other = float(meter.read()["other_cpu_pct"])
    if other is None:
        return ThreadChoice(cores, cores, None, chosen=True)
    busy = round(cores * other / 100.0)
    return ThreadChoice(max(1, cores - busy), cores, other, chosen=True)


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to `count` inside the block, restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(before)
