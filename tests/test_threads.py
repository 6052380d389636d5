"""A CPU session decodes with the cores other processes leave free, and says how many and why."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from engine.measure.threads import choose_threads, intra_op_threads, usable_cores

HOG = "import time\nend = time.time() + 6\nwhile time.time() < end:\n    pass\n"


def _other_process() -> int:
    """A CPU hog that is no descendant of this process (its parent shell exits): another process's load."""
    started = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', HOG],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return int(started.stdout.strip())


def test_a_busy_core_is_left_to_its_process() -> None:
    cores = usable_cores()
    hogs = [_other_process() for _ in range(max(1, cores - 1))]
    try:
        time.sleep(0.3)
        choice = choose_threads(sample_s=1.5)
    finally:
        for pid in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert choice.chosen and choice.cores == cores
    assert choice.other_cpu_pct is not None and choice.other_cpu_pct > 100.0 * (cores - 1) / cores * 0.6
    assert choice.threads == 1, choice
    assert "other processes used" in choice.basis


def test_a_set_count_is_kept_and_restored() -> None:
    import torch

    choice = choose_threads(3)
    assert choice.threads == 3 and not choice.chosen and choice.basis.endswith("(as set)")
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
