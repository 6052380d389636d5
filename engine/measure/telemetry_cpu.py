"""CPU telemetry through psutil: the sampler's CPU source, and other processes' share of the CPUs."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import psutil

from engine.measure.telemetry_types import GIB, Source

log = logging.getLogger("engine.measure.telemetry")  # the one telemetry logger, as before the module was split

CPU_ERRORS: tuple[type[Exception], ...] = (psutil.Error, OSError, AttributeError, ValueError)

CPU_METRICS = ("cpu_util_pct", "process_cpu_pct", "other_cpu_pct", "process_rss_gb", "sys_mem_used_pct")


def _busy_total() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, summed over its CPUs."""
    t = psutil.cpu_times()
    total = sum(t)
    # Linux counts guest time inside user time already.
    total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


class OtherCpu:
    """Other processes' share of the CPUs between two readings, in % of all cores (0-100).

    System busy time minus ours: this process, its finished children and its live ones (a llama-server
    the worker started is ours, not noise). The list of live children is refreshed at most every
    ``children_every_s`` (scanning /proc costs milliseconds)."""

    def __init__(self, children_every_s: float = 5.0) -> None:
        self._proc = psutil.Process()
        self._children_every_s = children_every_s
        self._children: list[psutil.Process] = []
        self._children_at = -float("inf")
        self._last = self._totals()

    def _own_seconds(self) -> float:
        t = self._proc.cpu_times()
        own = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        now = time.monotonic()
        if now - self._children_at >= self._children_every_s:
            self._children_at = now
            with contextlib.suppress(*CPU_ERRORS):
                self._children = self._proc.children(recursive=True)
        for child in self._children:
            with contextlib.suppress(*CPU_ERRORS):
                c = child.cpu_times()
                own += c.user + c.system
        return own

    def rss_bytes(self) -> int:
        """The resident memory of this process and its live children (as last listed)."""
        total = self._proc.memory_info().rss
        for child in self._children:
            with contextlib.suppress(*CPU_ERRORS):
                total += child.memory_info().rss
        return total

    def _totals(self) -> tuple[float, float, float]:
        busy, total = _busy_total()
        return busy, total, self._own_seconds()

    def mark(self) -> None:
        """Start a new interval now."""
        self._last = self._totals()

    def read(self) -> dict[str, float]:
        """System, own and other CPU % over the interval since the last mark()/read(); starts the next one."""
        busy, total, own = self._totals()
        last_busy, last_total, last_own = self._last
        self._last = (busy, total, own)
        d_total = total - last_total
        if d_total <= 0:
            return {"cpu_util_pct": 0.0, "own_cpu_pct": 0.0, "other_cpu_pct": 0.0}
        system = max(0.0, min(100.0, 100.0 * (busy - last_busy) / d_total))
        mine = max(0.0, min(100.0, 100.0 * (own - last_own) / d_total))
        return {"cpu_util_pct": system, "own_cpu_pct": mine, "other_cpu_pct": max(0.0, system - mine)}


class CpuBackend:
    """psutil readings; CPU busy time is computed from our own deltas of cpu_times().

    psutil.cpu_percent(interval=None) keeps one module-global "last call", so any other caller
    in the process would silently shorten our window; per-backend deltas avoid that.
    """

    source: Source = "cpu"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.device_name = "CPU"
        self._proc = psutil.Process()
        self._warned: set[str] = set()
        self._last_times = _busy_total()
        self._shares = OtherCpu(children_every_s=1.0)  # a server started for a configuration counts within a second

    def _metric(self, name: str, read: Callable[[], float], out: dict[str, float]) -> None:
        if name in self._warned:
            return
        try:
            out[name] = float(read())
        except CPU_ERRORS as exc:
            self._warned.add(name)
            log.warning("telemetry: disabling %s after error: %s", name, exc)

    def _read_shares(self) -> dict[str, float]:
        """The session's and other processes' CPU shares since the last sample; {} once they failed to read."""
        if "shares" in self._warned:
            return {}
        try:
            return self._shares.read()
        except CPU_ERRORS as exc:
            self._warned.add("shares")
            log.warning("telemetry: disabling the CPU shares after error: %s", exc)
            return {}

    def _cpu_util(self) -> float:
        busy, total = _busy_total()
        last_busy, last_total = self._last_times
        self._last_times = (busy, total)
        d_total = total - last_total
        return 0.0 if d_total <= 0 else max(0.0, min(100.0, 100.0 * (busy - last_busy) / d_total))

    def read(self) -> dict[str, float]:
        """One sample. The session's own figures count the processes it started (llama-servers, vLLM's workers)
        with it; all CPU shares are of all cores, on the 0-100 scale of cpu_util_pct."""
        out: dict[str, float] = {}
        self._metric("cpu_util_pct", self._cpu_util, out)
        if shares := self._read_shares():
            out["process_cpu_pct"], out["other_cpu_pct"] = shares["own_cpu_pct"], shares["other_cpu_pct"]
        self._metric("process_rss_gb", lambda: self._shares.rss_bytes() / GIB, out)
        self._metric("sys_mem_used_pct", lambda: psutil.virtual_memory().percent, out)
        return out

    def describe(self) -> str:
        return f"CPU ({self.reason})"

    def close(self) -> None:
        pass
