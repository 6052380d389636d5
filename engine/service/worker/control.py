"""Find or start the background worker; torch-free so the dashboard can import it cheaply."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from foundation.paths import PROJECT_ROOT, default_database_url, spectune_home


def worker_pid_path() -> Path:
    return spectune_home() / "worker.pid"


def worker_log_path() -> Path:
    return spectune_home() / "worker.log"


def worker_alive() -> int | None:
    """The pid of a live worker started for this data directory, or None."""
    from store.workers import pid_alive

    path = worker_pid_path()
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    try:  # a recycled pid belonging to another program does not count
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"engine" not in cmdline or b"worker" not in cmdline:
            return None
    except OSError:
        pass
    return pid


def release_pid_file(pid: int) -> None:
    """Forget the worker `pid` as this data directory's worker (it is stopping): a session queued from now on gets a
    new worker rather than waiting for one that will not claim it. Another worker's pid file stays."""
    path = worker_pid_path()
    try:
        if int(path.read_text().strip()) == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def ensure_worker() -> str:
    """Start a background worker for this data directory unless one is alive; returns a status line."""
    pid = worker_alive()
    if pid:
        return f"worker running (pid {pid})"
    env = dict(os.environ)
    env.setdefault("SPECTUNE_DB_URL", default_database_url())
    with open(worker_log_path(), "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "worker"],
            cwd=str(PROJECT_ROOT),
            env=env,
            stdout=logf,
            stderr=logf,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    worker_pid_path().write_text(str(proc.pid))
    return f"worker started (pid {proc.pid})"
