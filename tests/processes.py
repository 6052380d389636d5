"""Which server processes a test run started: on a shared machine other runs' llama-servers come and go.

conftest.py tags this pytest process's environment with RUN_TAG once; every server and subprocess a test starts
inherits it (an orphan keeps it after its owner dies), so a leak check counts exactly this run's processes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

RUN_VARIABLE = "SPECTUNE_TEST_RUN"


def ours(proc: psutil.Process) -> bool:
    """Whether `proc` was started by this test run (directly or through a process it started)."""
    try:
        return proc.environ().get(RUN_VARIABLE) == os.environ.get(RUN_VARIABLE)
    except psutil.Error:
        return False


def live_llama_servers() -> list[psutil.Process]:
    """This run's llama-server processes that are still alive."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if cmd and Path(cmd[0]).name == "llama-server" and proc.status() != psutil.STATUS_ZOMBIE and ours(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def no_server_left_behind() -> Iterator[None]:
    """Fails a test that leaves a llama-server of its own running (10 s to go after the test); autouse in every
    test module that imports it."""
    before = {p.pid for p in live_llama_servers()}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and {p.pid for p in live_llama_servers()} - before:
        time.sleep(0.2)
    assert not ({p.pid for p in live_llama_servers()} - before), "a llama-server was left running"
