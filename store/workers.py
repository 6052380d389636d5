"""Worker identity: ``host:pid`` ids let the dashboard tell a dead worker from a slow one on the same host."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def make_worker_id(suffix: str | None = None) -> str:
    """An id naming this process: ``host:pid`` (plus ``:suffix`` for several workers in one process)."""
    base = f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}:{suffix}" if suffix else base


def parse_worker_id(worker_id: str | None) -> tuple[str, int] | None:
    """(host, pid) from a make_worker_id() id, or None for ids in any other format."""
    if not worker_id:
        return None
    parts = worker_id.split(":")
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (signal 0 checks without touching it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    # A killed worker not yet reaped by its parent is a zombie: signal 0 still succeeds, yet it runs nothing,
    # so it counts as dead (Linux /proc; elsewhere this check is skipped).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def worker_is_dead(worker_id: str | None) -> bool:
    """True only when the id names a process on *this* host that no longer exists."""
    parsed = parse_worker_id(worker_id)
    if parsed is None:
        return False
    host, pid = parsed
    return host == socket.gethostname() and not pid_alive(pid)
