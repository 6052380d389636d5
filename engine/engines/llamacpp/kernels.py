"""Whether llama.cpp's repacked CPU kernels run on this machine, learnt from a crash and remembered.

A llama.cpp built with GGML_NATIVE compiles the kernels its build machine reports (AMX among them on a recent
Xeon) and repacks the weights into their layout. A CPU may report an instruction set its virtual machine does
not let a process use: seen on an Intel Xeon with AMX, where every llama-server died by SIGILL in
`ggml_backend_amx_mul_mat` (ldtilecfg) while it started, and `--no-repack` (the plain CPU kernels) served. So a
llama.cpp tool that dies by such a signal is retried once without repacking, and that is remembered for this
build on this CPU (a file under the model cache), so every later server and llama-bench run starts that way and
each session says so.
"""

from __future__ import annotations

import hashlib
import json
import platform
import signal
from pathlib import Path

from foundation.paths import model_cache_dir

CRASH_SIGNALS = (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS)
SERVER_FLAGS = ("--no-repack",)
BENCH_FLAGS = ("--repack", "0")


def crashed(returncode: int | None) -> bool:
    """A process that died by an instruction or memory fault (a kernel its CPU cannot run), not one that exited."""
    return returncode is not None and -returncode in CRASH_SIGNALS


def _cpu_identity() -> str:
    """The CPU as the kernels see it: its model name and the instruction sets /proc/cpuinfo reports."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "flags") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return json.dumps(fields, sort_keys=True)


def _marker(build_sha256: str) -> Path:
    key = hashlib.sha256(f"{build_sha256}\n{_cpu_identity()}".encode()).hexdigest()[:20]
    return model_cache_dir().parent / "llama-kernels" / f"no-repack-{key}.json"


def repack_broken(build_sha256: str) -> str | None:
    """Why repacking is off for this build on this CPU (the crash that taught it), or None while it works."""
    path = _marker(build_sha256)
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("why") or "it crashed here")
    except (OSError, ValueError, AttributeError):
        return None


def mark_repack_broken(build_sha256: str, why: str) -> None:
    path = _marker(build_sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"why": why, "cpu": _cpu_identity()}), encoding="utf-8")


def crash_line(tool: str, returncode: int) -> str:
    """What the marker says: the tool, the signal, and what was done about it."""
    name = signal.Signals(-returncode).name
    return f"{tool} died by {name} with repacked weights on this CPU: llama.cpp runs here with --no-repack"
