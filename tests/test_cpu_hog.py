"""The suite's CPU hog (tests/cpu_hog.py) loads a core while it runs and never outlives its run."""

from __future__ import annotations

import time

import psutil
from cpu_hog import start, stop


def test_a_hog_spins_until_it_is_stopped():
    hogs = start(1, limit_s=120)
    try:
        proc = psutil.Process(hogs[0].pid)
        deadline = time.monotonic() + 30
        while sum(proc.cpu_times()[:2]) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(proc.cpu_times()[:2]) >= 0.2 and hogs[0].poll() is None
    finally:
        stop(hogs)
    assert hogs[0].returncode is not None


def test_a_hog_ends_by_itself_at_its_limit():
    hogs = start(1, limit_s=0.5)
    try:
        hogs[0].wait(timeout=30)
    finally:
        stop(hogs)
    assert hogs[0].returncode == 0
