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

This module holds the sampler and re-exports the parts, which live beside it: the NVML source in
``telemetry_nvml``, the CPU source and ``OtherCpu`` in ``telemetry_cpu``, ``LoadMeter`` in ``load_meter`` and
``Sample`` / ``TelemetryUnavailable`` in ``telemetry_types``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from types import TracebackType
from typing import Literal, Self

from engine.measure.load_meter import LoadMeter
from engine.measure.telemetry_cpu import CPU_ERRORS, CPU_METRICS, CpuBackend, OtherCpu
from engine.measure.telemetry_nvml import GPM_METRICS, NVML_ERRORS, NvmlBackend, nvml_available, nvml_snapshot
from engine.measure.telemetry_types import GIB, OnSample, Sample, Source, TelemetryUnavailable

__all__ = [
    "CPU_ERRORS",
    "CPU_METRICS",
    "GIB",
    "GPM_METRICS",
    "LoadMeter",
    "NVML_ERRORS",
    "OnSample",
    "OtherCpu",
    "Sample",
    "Source",
    "TelemetryUnavailable",
    "UtilisationSampler",
    "nvml_available",
    "nvml_snapshot",
]

log = logging.getLogger(__name__)


def _open_backend(force_source: str | None, device_index: int) -> NvmlBackend | CpuBackend:
    if force_source not in (None, "nvml", "cpu"):
        raise ValueError(f"force_source must be 'nvml', 'cpu' or None, not {force_source!r}")
    if force_source == "cpu":
        return CpuBackend("forced")
    try:
        return NvmlBackend(device_index)
    except TelemetryUnavailable as exc:
        if force_source == "nvml":
            raise
        log.info("telemetry: %s; sampling CPU instead", exc)
        return CpuBackend(exc.reason)


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
        self._backend: NvmlBackend | CpuBackend | None = _open_backend(force_source, device_index)
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
