"""Device utilisation sampled in the background while a decode runs.

Speculative decoding is tuned by asking *why* a setting is slow: is the GPU idle between
draft and verify steps (launch/latency bound), is DRAM bandwidth saturated (memory bound), or
are the tensor cores busy (compute bound)? ``UtilisationSampler`` answers that by polling the
device every ``interval_s`` on a daemon thread, so the decode loop itself is never slowed by
telemetry calls.

Sources, chosen once when the sampler is created:

* ``"nvml"`` — NVIDIA's management library via ``pynvml`` (package nvidia-ml-py): GPU and
  memory-controller utilisation, memory used, SM clock, power, and on Hopper or newer (GPM)
  DRAM bandwidth utilisation, SM occupancy and tensor-core activity.
* ``"cpu"`` — psutil: system and process CPU, other processes' CPU share, process RSS and system
  memory, used when there is no NVIDIA GPU or driver (NVML failing to initialise is normal on such machines).

``LoadMeter`` measures the machine's own noise between two readings: other processes' share of the CPUs
(system CPU minus this process and its children) and, on a GPU where NVML reports per-process
utilisation, the GPU utilisation of other processes. The sweep reads it around every decode.

Nothing here raises during sampling: a metric whose NVML call fails is logged once and then
left out of later samples, so one unsupported counter (power on some boards, GPM on
pre-Hopper parts) never costs the others. Sizes named ``*_gb`` are GiB (2**30 bytes).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import psutil

try:
    import pynvml
except ImportError:  # nvidia-ml-py not installed: behave exactly as on a machine without a driver
    pynvml = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

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
CPU_ERRORS: tuple[type[Exception], ...] = (psutil.Error, OSError, AttributeError, ValueError)

GIB = 1024**3
Source = Literal["nvml", "cpu"]
OnSample = Callable[[float, str, dict[str, float]], None]

# GPM metric name -> pynvml constant name (looked up lazily so an older binding just loses them).
GPM_METRICS: dict[str, str] = {
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
}
CPU_METRICS = ("cpu_util_pct", "process_cpu_pct", "other_cpu_pct", "process_rss_gb", "sys_mem_used_pct")


class TelemetryUnavailable(RuntimeError):
    """Raised only when a caller insists on ``force_source="nvml"`` and NVML cannot be used.

    ``reason`` is a short user-facing phrase, e.g. "no NVIDIA GPU or driver found".
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


# nvmlInit failures that are a normal state of the machine, by pynvml's generated class name.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "no NVIDIA GPU or driver found",
    "NVMLError_DriverNotLoaded": "no NVIDIA GPU or driver found",
    "NVMLError_NoPermission": "no permission to read the NVIDIA driver",
}


@dataclass(frozen=True)
class Sample:
    """One reading: seconds since the sampler started, the source and its metrics."""

    t: float
    source: str
    metrics: dict[str, float] = field(default_factory=dict)


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


class _CpuBackend:
    """psutil readings; CPU busy time is computed from our own deltas of cpu_times().

    psutil.cpu_percent(interval=None) keeps one module-global "last call", so any other caller
    in the process would silently shorten our window; per-backend deltas avoid that.
    """

    source: Source = "cpu"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.device_name = "CPU"
        self._proc = psutil.Process()
        self._ncpu = psutil.cpu_count() or 1
        self._warned: set[str] = set()
        self._last_times = _busy_total()
        self._other = OtherCpu()
        with contextlib.suppress(psutil.Error):
            self._proc.cpu_percent(None)  # primes the per-process counter

    def _metric(self, name: str, read: Callable[[], float], out: dict[str, float]) -> None:
        if name in self._warned:
            return
        try:
            out[name] = float(read())
        except CPU_ERRORS as exc:
            self._warned.add(name)
            log.warning("telemetry: disabling %s after error: %s", name, exc)

    def _cpu_util(self) -> float:
        busy, total = _busy_total()
        last_busy, last_total = self._last_times
        self._last_times = (busy, total)
        d_total = total - last_total
        return 0.0 if d_total <= 0 else max(0.0, min(100.0, 100.0 * (busy - last_busy) / d_total))

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        self._metric("cpu_util_pct", self._cpu_util, out)
        # Normalised to all cores so it sits on the same 0-100 scale as cpu_util_pct.
        self._metric("process_cpu_pct", lambda: min(100.0, self._proc.cpu_percent(None) / self._ncpu), out)
        self._metric("other_cpu_pct", lambda: self._other.read()["other_cpu_pct"], out)
        self._metric("process_rss_gb", lambda: self._proc.memory_info().rss / GIB, out)
        self._metric("sys_mem_used_pct", lambda: psutil.virtual_memory().percent, out)
        return out

    def describe(self) -> str:
        return f"CPU ({self.reason})"

    def close(self) -> None:
        pass


class _NvmlBackend:
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


def _open_backend(force_source: str | None, device_index: int) -> _NvmlBackend | _CpuBackend:
    if force_source not in (None, "nvml", "cpu"):
        raise ValueError(f"force_source must be 'nvml', 'cpu' or None, not {force_source!r}")
    if force_source == "cpu":
        return _CpuBackend("forced")
    try:
        return _NvmlBackend(device_index)
    except TelemetryUnavailable as exc:
        if force_source == "nvml":
            raise
        log.info("telemetry: %s; sampling CPU instead", exc)
        return _CpuBackend(exc.reason)


class UtilisationSampler:
    """Polls GPU (NVML) or CPU utilisation on a daemon thread while a decode runs.

    Use as a context manager around the decode::

        with UtilisationSampler(on_sample=cb) as sampler:
            run_decode()
        samples = sampler.samples

    ``on_sample(t, source, metrics)`` is called on the sampler thread (not the caller's), with
    ``t`` in seconds since ``start()``; ``perf_counter() - sampler.t0`` gives the same clock for
    aligning decode events. Samples are also kept in a bounded deque (``max_samples``).

    The source is chosen at construction: NVML if it initialises, else CPU.
    ``force_source="cpu"`` skips NVML; ``force_source="nvml"`` raises ``TelemetryUnavailable``
    instead of falling back (for checks that must prove NVML works).
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        on_sample: OnSample | None = None,
        *,
        device_index: int = 0,
        force_source: Literal["nvml", "cpu"] | None = None,
        max_samples: int = 10_000,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self.interval_s = float(interval_s)
        self.on_sample = on_sample
        self.device_index = device_index
        self.force_source = force_source
        self.t0: float | None = None
        self._samples: deque[Sample] = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callback_failed = False
        self._backend: _NvmlBackend | _CpuBackend | None = _open_backend(force_source, device_index)
        self._source: Source = self._backend.source
        self._description = self._backend.describe()

    # -- public state ---------------------------------------------------------------------------

    @property
    def source(self) -> Source:
        """Where the metrics come from: "nvml" or "cpu"."""
        return self._source

    def describe(self) -> str:
        """A plain one-line description, e.g. "CPU (no NVIDIA GPU or driver found)"."""
        if self._backend is not None:
            self._description = self._backend.describe()
        return self._description

    @property
    def samples(self) -> list[Sample]:
        """A copy of the samples kept so far (oldest first)."""
        with self._lock:
            return list(self._samples)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the sampling thread (re-opens the source if a previous stop() closed it)."""
        if self.running:
            return self
        if self._backend is None:
            self._backend = _open_backend(self.force_source, self.device_index)
            self._source = self._backend.source
        self._stop.clear()
        with self._lock:
            self._samples.clear()  # a new run: t restarts at 0
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name=f"spectune-telemetry-{self._source}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop sampling, join the thread and release NVML. Safe to call twice."""
        thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join(timeout_s if timeout_s is not None else max(5.0, 4 * self.interval_s))
            if thread.is_alive():
                # A hung driver call: leave NVML open rather than shut it down under the thread.
                log.warning("telemetry: sampler thread did not stop within the timeout")
                return
            self._thread = None
        self.close()

    def close(self) -> None:
        """Release the source without starting (e.g. a sampler created only to describe())."""
        if self.running:
            self.stop()
            return
        if self._backend is not None:
            self._description = self._backend.describe()
            self._backend.close()
            self._backend = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        backend = self._backend
        assert backend is not None and self.t0 is not None
        while not self._stop.wait(self.interval_s):
            try:
                metrics = backend.read()
            except Exception as exc:  # noqa: BLE001 -- metrics are guarded; a bug must not kill the thread
                log.warning("telemetry: sample failed: %s", exc)
                continue
            sample = Sample(time.perf_counter() - self.t0, backend.source, metrics)
            with self._lock:
                self._samples.append(sample)
            if self.on_sample is not None:
                try:
                    self.on_sample(sample.t, sample.source, dict(metrics))
                except Exception:  # the caller's code: keep sampling, log once
                    if not self._callback_failed:
                        self._callback_failed = True
                        log.exception("telemetry: on_sample callback raised; further errors are not logged")


def nvml_available(device_index: int = 0) -> bool:
    """True when NVML initialises and sees GPU ``device_index``. Never raises."""
    try:
        backend = _NvmlBackend(device_index)
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
        backend = _NvmlBackend(device_index)
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
        self._nvml: _NvmlBackend | None = None
        self._handle: Any = None
        self._since_us = 0
        self._own_pids: set[int] = set()
        if gpu and pynvml is not None:
            try:
                self._nvml = _NvmlBackend(device_index)
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
