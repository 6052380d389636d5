"""GPU telemetry through NVML (nvidia-ml-py): one device's utilisation, memory, clock, power and GPM counters."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any

from engine.measure.telemetry_types import GIB, Source, TelemetryUnavailable

try:
    import pynvml
except ImportError:  # nvidia-ml-py not installed: behave exactly as on a machine without a driver
    pynvml = None  # type: ignore[assignment]

log = logging.getLogger("engine.measure.telemetry")  # the one telemetry logger, as before the module was split

# What an NVML call can throw: NVMLError (unsupported, no permission, GPU lost, ...), or from an
# older/newer binding a missing function/attribute or a ctypes argument mismatch. Catching this
# tuple (rather than Exception) keeps real bugs in this module visible.
NVML_ERRORS: tuple[type[Exception], ...] = (
    AttributeError,
    TypeError,
    ValueError,
    OSError,
    ctypes.ArgumentError,
) + ((pynvml.NVMLError,) if pynvml is not None else ())

# GPM metric name -> pynvml constant name (looked up lazily so an older binding just loses them).
GPM_METRICS: dict[str, str] = {
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
}

# nvmlInit failures that are a normal state of the machine, by pynvml's generated class name.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "no NVIDIA GPU or driver found",
    "NVMLError_DriverNotLoaded": "no NVIDIA GPU or driver found",
    "NVMLError_NoPermission": "no permission to read the NVIDIA driver",
}


class NvmlBackend:
    """One GPU through NVML. Opening raises if NVML or the device is unusable; reading never does."""

    source: Source = "nvml"

    def __init__(self, device_index: int = 0) -> None:
        if pynvml is None:
            raise TelemetryUnavailable("nvidia-ml-py (pynvml) is not installed", "NVML binding not installed")
        self.device_index = device_index
        self._disabled: set[str] = set()
        self._gpm_ids: dict[str, int] = {}
        self._gpm_samples: list[Any] = []
        self._gpm_get: Any = None
        self._shut = False
        try:
            pynvml.nvmlInit()
        except NVML_ERRORS as exc:  # no library/driver, or a broken binding
            reason = _INIT_REASONS.get(type(exc).__name__, f"NVML failed: {exc}")
            raise TelemetryUnavailable(f"NVML init failed: {exc}", reason) from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count < 1:
                raise TelemetryUnavailable("NVML sees no GPU", "no NVIDIA GPU or driver found")
            if device_index >= count:
                raise TelemetryUnavailable(
                    f"NVML sees {count} GPU(s), no device index {device_index}", f"no GPU {device_index}"
                )
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except TelemetryUnavailable:
            self.close()
            raise
        except NVML_ERRORS as exc:
            self.close()
            raise TelemetryUnavailable(
                f"NVML device {device_index} unavailable: {exc}", f"NVML failed on GPU {device_index}: {exc}"
            ) from exc
        try:
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        except NVML_ERRORS:
            self.device_name = f"GPU {device_index}"
        self._setup_gpm()

    # -- GPM (Hopper+): metrics are computed between two device samples -------------------------

    def _setup_gpm(self) -> None:
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(self._handle)
            if not support.isSupportedDevice:
                log.info("telemetry: GPM not supported on %s; no DRAM-bandwidth/tensor metrics", self.device_name)
                return
            ids = {name: int(getattr(pynvml, const)) for name, const in GPM_METRICS.items()}
            self._gpm_samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(self._handle, self._gpm_samples[0])
            self._gpm_get = pynvml.c_nvmlGpmMetricsGet_t()
            self._gpm_ids = ids
        except NVML_ERRORS as exc:  # NotSupported, FunctionNotFound on old drivers, an old binding
            log.info("telemetry: GPM unavailable on %s: %s", self.device_name, exc)
            self._free_gpm()

    def _read_gpm(self, out: dict[str, float]) -> None:
        ids = {n: i for n, i in self._gpm_ids.items() if n not in self._disabled}
        if not ids:
            return
        names = list(ids)
        prev, cur = self._gpm_samples
        mg = self._gpm_get
        try:
            pynvml.nvmlGpmSampleGet(self._handle, cur)
            ctypes.memset(ctypes.addressof(mg), 0, ctypes.sizeof(mg))
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(names)
            mg.sample1 = prev
            mg.sample2 = cur
            for i, name in enumerate(names):
                mg.metrics[i].metricId = ids[name]
            pynvml.nvmlGpmMetricsGet(mg)
        except NVML_ERRORS as exc:
            for name in ids:
                self._disable(name, exc)
            return
        finally:
            # The newest sample becomes the baseline for the next interval.
            self._gpm_samples.reverse()
        for i, name in enumerate(names):
            metric = mg.metrics[i]
            if metric.nvmlReturn != pynvml.NVML_SUCCESS:
                self._disable(name, f"NVML return code {metric.nvmlReturn}")
            else:
                out[name] = float(metric.value)

    def _free_gpm(self) -> None:
        for sample in self._gpm_samples:
            with contextlib.suppress(*NVML_ERRORS):
                pynvml.nvmlGpmSampleFree(sample)
        self._gpm_samples = []
        self._gpm_ids = {}
        self._gpm_get = None

    @property
    def gpm_enabled(self) -> bool:
        return any(n not in self._disabled for n in self._gpm_ids)

    # -- per-sample reads -----------------------------------------------------------------------

    def _disable(self, name: str, exc: object) -> None:
        if name not in self._disabled:
            self._disabled.add(name)
            log.warning("telemetry: disabling NVML metric %s on %s: %s", name, self.device_name, exc)

    def _group(self, names: tuple[str, ...], read: Callable[[], dict[str, float]], out: dict[str, float]) -> None:
        """Run one NVML call that yields ``names``; on failure disable exactly those metrics."""
        if all(n in self._disabled for n in names):
            return
        try:
            values = read()
        except NVML_ERRORS as exc:
            for n in names:
                self._disable(n, exc)
            return
        out.update({k: float(v) for k, v in values.items() if k not in self._disabled})

    def read(self) -> dict[str, float]:
        h = self._handle
        out: dict[str, float] = {}

        def util() -> dict[str, float]:
            rates = pynvml.nvmlDeviceGetUtilizationRates(h)
            return {"gpu_util_pct": rates.gpu, "mem_ctrl_util_pct": rates.memory}

        def memory() -> dict[str, float]:
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            return {"mem_used_gb": mem.used / GIB, "mem_total_gb": mem.total / GIB}

        self._group(("gpu_util_pct", "mem_ctrl_util_pct"), util, out)
        self._group(("mem_used_gb", "mem_total_gb"), memory, out)
        self._group(
            ("sm_clock_mhz",),
            lambda: {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)},
            out,
        )
        self._group(("power_w",), lambda: {"power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}, out)
        if self._gpm_ids:
            self._read_gpm(out)
        return out

    def describe(self) -> str:
        gpm = ", GPM on" if self.gpm_enabled else ""
        return f"NVML: {self.device_name} (GPU {self.device_index}{gpm})"

    def close(self) -> None:
        if self._shut:
            return
        self._shut = True
        self._free_gpm()
        with contextlib.suppress(*NVML_ERRORS):
            pynvml.nvmlShutdown()


def nvml_available(device_index: int = 0) -> bool:
    """True when NVML initialises and sees GPU ``device_index``. Never raises."""
    try:
        backend = NvmlBackend(device_index)
    except TelemetryUnavailable:
        return False
    backend.close()
    return True


def nvml_snapshot(device_index: int = 0, gpm_window_s: float = 0.0) -> dict[str, float] | None:
    """One NVML reading of the same metrics the sampler reports, or None without NVML.

    GPM metrics need two device samples, so they are only included when ``gpm_window_s > 0``
    (the call then blocks that long). Never raises.
    """
    try:
        backend = NvmlBackend(device_index)
    except TelemetryUnavailable:
        return None
    try:
        if gpm_window_s > 0 and backend.gpm_enabled:
            time.sleep(gpm_window_s)
        elif backend.gpm_enabled:
            backend._free_gpm()  # no window: a zero-length GPM interval would be meaningless
        return backend.read()
    except Exception as exc:  # noqa: BLE001 -- documented as never raising
        log.warning("telemetry: NVML snapshot failed: %s", exc)
        return None
    finally:
        backend.close()
