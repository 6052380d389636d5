"""Process helpers every managed server shares: the loopback host, a free port, death with the parent, a group."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from pathlib import Path

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # loaded here, in the parent: the child between fork and exec only calls into it


def die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the thread that started it dies, however that dies (a
    SIGKILL or a crash runs no atexit handler and no finally), so no server outlives its owner."""
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is not None:  # elsewhere the atexit and signal paths still stop our servers
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port on HOST that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def process_group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found
