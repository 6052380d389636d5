"""The guard a managed vLLM server runs under: it leaves no API server, EngineCore or Worker process behind.

Run as a script by the vLLM interpreter (standard library only): `python guard.py OWNER_PID GRACE_S -- COMMAND…`.
It leads its own process group and starts COMMAND in it. vLLM's API server starts the EngineCore, which starts
the Worker, all in that group. The guard asks the kernel for SIGTERM when its owner dies (PR_SET_PDEATHSIG), so a
SIGKILL or a crash of the owner, which runs no handler, still reaches it. On SIGTERM/SIGINT/SIGHUP it sends SIGTERM
to the API server (vLLM then stops its engine), waits GRACE_S, and SIGKILLs whatever is left of the group. When
the API server exits on its own (a crash) the group is swept the same way and the guard exits with its code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def _die_with(sig: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> list[int]:
    """Every live process of process group `pgid` but this one (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def sweep(pgid: int, grace_s: float) -> None:
    """SIGTERM the rest of the group, then SIGKILL whatever is still there after `grace_s`."""
    deadline = time.monotonic() + grace_s
    for pid in group_members(pgid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in group_members(pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    owner, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    _die_with(signal.SIGTERM)
    stop = {"asked": os.getppid() != owner}  # the owner died before the request reached the kernel

    def asked(signum: int, frame: object) -> None:
        stop["asked"] = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, asked)
    pgid = os.getpgrp()
    child = subprocess.Popen(command, preexec_fn=lambda: _die_with(signal.SIGTERM))
    while child.poll() is None and not stop["asked"]:
        time.sleep(0.1)
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    sweep(pgid, grace_s if stop["asked"] else 2.0)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
