"""A CPU session decodes with the cores other processes leave free, and says how many and why."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from engine.measure import threads
from engine.measure.telemetry_cpu import OtherCpu
from engine.measure.threads import choose_threads, intra_op_threads, usable_cores

HOG = "import time\nend = time.time() + 6\nwhile time.time() < end:\n    pass\n"


def _other_process() -> int:
    """A CPU hog that is no descendant of this process (its parent shell exits): another process's load."""
    started = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', HOG],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return int(started.stdout.strip())


class _Reading:
    """An OtherCpu that reads a given share of other processes' CPU."""

    share = 0.0

    def mark(self) -> None:
        pass

    def read(self) -> dict[str, float]:
        return {"cpu_util_pct": self.share, "own_cpu_pct": 0.0, "other_cpu_pct": self.share}


def test_a_busy_core_is_left_to_its_process(monkeypatch) -> None:
    """The rule, from readings: the cores other processes keep busy are left to them, and one thread stays."""
    cores = usable_cores()
    monkeypatch.setattr(threads, "OtherCpu", _Reading)
    for share, expected in ((0.0, cores), (100.0 * (cores - 1) / cores, 1), (100.0, 1), (100.0 / cores, cores - 1)):
        _Reading.share = share
        choice = choose_threads(sample_s=0.0)
        assert choice.chosen and choice.cores == cores and choice.threads == max(1, expected), (share, choice)
        assert choice.other_cpu_pct == share and "other processes used" in choice.basis


def test_another_process_s_cpu_is_read_as_other_and_a_child_s_as_ours() -> None:
    """What the rule reads, measured: a process that is no descendant of ours counts as other load, at least the
    CPU seconds it spent (as psutil reads them over the same interval), however loaded the machine is; a child
    of ours does not."""
    cores = usable_cores()
    meter = OtherCpu(children_every_s=0.0)
    other = psutil.Process(_other_process())
    child = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(0.2)
        before = {p: sum(p.cpu_times()[:2]) for p in (other, psutil.Process(child.pid))}
        meter.mark()
        started = time.monotonic()
        time.sleep(1.5)
        reading = meter.read()
        elapsed = time.monotonic() - started
        spent = {p: sum(p.cpu_times()[:2]) - t for p, t in before.items()}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(other.pid, signal.SIGKILL)
        child.kill()
        child.wait()
    other_s = reading["other_cpu_pct"] / 100.0 * cores * elapsed
    own_s = reading["own_cpu_pct"] / 100.0 * cores * elapsed
    hog_s, child_s = spent[other], spent[next(p for p in spent if p.pid == child.pid)]
    assert hog_s > 0.1 and child_s > 0.1, spent  # both ran
    assert other_s >= 0.8 * hog_s, (reading, spent)  # the other process is other load
    assert own_s >= 0.8 * child_s, (reading, spent)  # our child is ours


def test_a_set_count_is_kept_and_restored() -> None:
    import torch

    choice = choose_threads(3)
    assert choice.threads == 3 and not choice.chosen and choice.basis.endswith("(as set)")
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
