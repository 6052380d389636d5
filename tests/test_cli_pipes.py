"""A reader that stops reading ends a command quietly: `python -m engine sessions | head -1` exits 0, says nothing.

The commands run as real processes writing into real pipes: one whose read end is closed before the command starts
(so every write meets a reader that has gone, whatever the timing), and a real `| head -1` in a shell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.paths import default_database_url
from store import open_store
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a CLI process whose store (in tmp_path) holds forty finished sessions."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    try:
        for i in range(40):
            store_session(store, T5, name=f"t5-{i}")
    finally:
        store.close()
    return {**os.environ, "SPECTUNE_HOME": str(tmp_path)}


def into_a_closed_pipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `python -m engine ARGS` with stdout a pipe nobody reads any more: its read end is closed first."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["sessions"], ["sessions", "--json"], ["theory", "--alpha", "0.8", "--gamma", "4"],
                                  ["--help"]])  # fmt: skip
def test_a_closed_stdout_ends_quietly_with_exit_0(args: list[str], env: dict[str, str]) -> None:
    done = into_a_closed_pipe(args, env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_sessions_into_head(env: dict[str, str]) -> None:
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m engine sessions | head -1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split()[:2] == ["id", "status"]


def test_an_error_still_reaches_stderr_when_stdout_is_closed(env: dict[str, str]) -> None:
    done = into_a_closed_pipe(["cancel", "--session", "999"], env)
    assert done.returncode == 2 and done.stderr.strip() == "error: session 999 does not exist"
