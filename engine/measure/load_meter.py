"""The machine's own noise around a measurement: other processes' CPU share and, where NVML tells, GPU load."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import psutil

from engine.measure.telemetry_cpu import CPU_ERRORS, OtherCpu
from engine.measure.telemetry_nvml import NVML_ERRORS, NvmlBackend, pynvml
from engine.measure.telemetry_types import TelemetryUnavailable

log = logging.getLogger("engine.measure.telemetry")  # the one telemetry logger, as before the module was split


class LoadMeter:
    """The machine's own noise around a measurement: other processes' CPU share, and on a GPU the
    utilisation other processes put on it where NVML reports per-process utilisation.

    ``mark()`` starts an interval, ``read()`` ends it and returns {"other_cpu_pct": …} plus
    "other_gpu_util_pct" (the sum of other processes' SM utilisation, NVML's per-process samples since
    the mark) when NVML is on and the driver shares those samples (it often does not inside a container:
    the key is then left out). Never raises: a failing reading is left out from then on.
    """

    def __init__(self, gpu: bool = False, device_index: int = 0) -> None:
        self._cpu: OtherCpu | None = None
        with contextlib.suppress(*CPU_ERRORS):
            self._cpu = OtherCpu()
        self._nvml: NvmlBackend | None = None
        self._handle: Any = None
        self._since_us = 0
        self._own_pids: set[int] = set()
        if gpu and pynvml is not None:
            try:
                self._nvml = NvmlBackend(device_index)
                self._handle = self._nvml._handle
            except TelemetryUnavailable as exc:
                log.info("telemetry: no per-process GPU load: %s", exc.reason)
        self.mark()

    def mark(self) -> None:
        if self._cpu is not None:
            try:
                self._cpu.mark()
            except CPU_ERRORS as exc:
                log.warning("telemetry: other processes' CPU share unavailable: %s", exc)
                self._cpu = None
        self._since_us = int(time.time() * 1e6)
        if self._nvml is not None:
            with contextlib.suppress(*CPU_ERRORS):
                me = psutil.Process()
                self._own_pids = {me.pid, *(c.pid for c in me.children(recursive=True))}

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._cpu is not None:
            try:
                out["other_cpu_pct"] = self._cpu.read()["other_cpu_pct"]
            except CPU_ERRORS as exc:
                log.warning("telemetry: other processes' CPU share unavailable: %s", exc)
                self._cpu = None
        if self._nvml is not None:
            other = self._other_gpu()
            if other is not None:
                out["other_gpu_util_pct"] = other
        return out

    def _other_gpu(self) -> float | None:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(self._handle, self._since_us)
        except NVML_ERRORS as exc:  # NotFound when no process ran a kernel since then; NotSupported elsewhere
            if type(exc).__name__ == "NVMLError_NotFound":
                return 0.0
            log.info("telemetry: NVML per-process utilisation unavailable: %s", exc)
            self.close()
            return None
        by_pid: dict[int, list[float]] = {}
        for sample in samples or []:
            if int(sample.pid) not in self._own_pids:
                by_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        return float(min(100.0, sum(sum(v) / len(v) for v in by_pid.values())))

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
