"""A bounded CPU hog for running the suite on a loaded machine: `pytest --cpu-hog N` keeps N processes spinning
for the whole run, so that a test depending on timing fails here rather than in CI.

Each hog spins until the run stops it, its parent (the pytest process) dies, or its time limit passes, so it never
outlives the run that started it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HOG_LIMIT_S = 3 * 3600
SPIN = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    sum(i * i for i in range(200_000))
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-hog", type=int, default=0, metavar="N",
                     help="keep N busy processes (one core each) spinning beside the whole run")  # fmt: skip


def start(count: int, limit_s: float = HOG_LIMIT_S) -> list[subprocess.Popen[bytes]]:
    """`count` spinning processes, each at the same priority as the tests."""
    argv = [sys.executable, "-c", SPIN, str(os.getpid()), str(limit_s)]
    return [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for _ in range(count)]


def stop(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


@pytest.fixture(scope="session", autouse=True)
def cpu_hog(request: pytest.FixtureRequest):
    """The hogs `--cpu-hog` asks for, from the first test to the last."""
    hogs = start(request.config.getoption("--cpu-hog"))
    yield hogs
    stop(hogs)
