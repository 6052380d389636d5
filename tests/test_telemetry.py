"""Telemetry and hardware description: real CPU sampling, and NVML paths driven by a fake pynvml.

Only ``test_real_nvml_sampling`` needs a GPU; everything else runs (never skips) on a CPU box,
because the fallbacks are exactly what a CPU-only machine depends on.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

# Plain `pytest` (unlike `python -m pytest`) does not put the project root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml

from engine.measure import hardware, telemetry
from engine.measure.hardware import describe_hardware
from engine.measure.telemetry import (
    CPU_METRICS,
    TelemetryUnavailable,
    UtilisationSampler,
    nvml_available,
    nvml_snapshot,
)

HAS_NVML = nvml_available()


def wait_for_samples(sampler: UtilisationSampler, n: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(sampler.samples) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(sampler.samples) >= n, f"only {len(sampler.samples)} samples in {timeout_s}s"


def telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("spectune-telemetry")]


# --------------------------------------------------------------------------------------------
# A fake NVML: the real pynvml module with its C entry points replaced, so the code under test
# goes through the same attribute look-ups, error classes and ctypes structs as on a GPU.
# --------------------------------------------------------------------------------------------


class FakeNvml:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpm: bool = False) -> None:
        self.inits = 0
        self.shutdowns = 0
        self.gpm_pairs: list[tuple[int, int]] = []
        self.freed = 0
        mp = monkeypatch
        mp.setattr(pynvml, "nvmlInit", self._init)
        mp.setattr(pynvml, "nvmlShutdown", self._shutdown)
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle{i}")
        mp.setattr(pynvml, "nvmlDeviceGetName", lambda h: "Fake GPU X1")
        mp.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "999.1")
        mp.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 12080)
        mp.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=73, memory=41))
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=3 * 1024**3, total=80 * 1024**3))
        mp.setattr(pynvml, "nvmlDeviceGetClockInfo", self._clock)
        mp.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: 312_500)
        if gpm:
            self._structs: list[Any] = []
            mp.setattr(pynvml, "nvmlGpmQueryDeviceSupport", lambda h: SimpleNamespace(isSupportedDevice=1))
            mp.setattr(pynvml, "nvmlGpmSampleAlloc", self._alloc)
            mp.setattr(pynvml, "nvmlGpmSampleFree", self._free)
            mp.setattr(pynvml, "nvmlGpmSampleGet", lambda h, s: s)
            mp.setattr(pynvml, "nvmlGpmMetricsGet", self._metrics_get)
        else:
            mp.setattr(pynvml, "nvmlGpmQueryDeviceSupport", self._not_supported)

    def _init(self) -> None:
        self.inits += 1

    def _shutdown(self) -> None:
        self.shutdowns += 1

    @staticmethod
    def _not_supported(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _clock(handle: str, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_SM
        return 1755

    def _alloc(self) -> Any:
        struct = pynvml.struct_c_nvmlGpmSample_t()
        self._structs.append(struct)  # keep the pointee alive
        return ctypes.pointer(struct)

    def _free(self, sample: Any) -> None:
        self.freed += 1

    def _metrics_get(self, mg: Any) -> Any:
        assert mg.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert mg.numMetrics == 3 or mg.numMetrics == 2  # 2 once sm_occupancy has been disabled
        addr = (ctypes.cast(mg.sample1, ctypes.c_void_p).value, ctypes.cast(mg.sample2, ctypes.c_void_p).value)
        self.gpm_pairs.append(addr)
        for i in range(mg.numMetrics):
            metric = mg.metrics[i]
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = {
                    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 62.5,
                    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 12.25,
                }[metric.metricId]
        return mg


# --------------------------------------------------------------------------------------------
# CPU sampling (real psutil)
# --------------------------------------------------------------------------------------------


def test_cpu_sampler_produces_plausible_samples() -> None:
    calls: list[tuple[float, str, dict[str, float]]] = []
    sampler = UtilisationSampler(interval_s=0.25, on_sample=lambda t, s, m: calls.append((t, s, m)), force_source="cpu")
    assert sampler.source == "cpu"
    assert sampler.describe().startswith("CPU")
    with sampler:
        assert sampler.running
        deadline = time.monotonic() + 1.5
        block = bytes(1 << 20)
        while time.monotonic() < deadline:  # load that releases the GIL, so the sampler thread is not starved
            hashlib.sha256(block).digest()
    assert not sampler.running
    assert not telemetry_threads(), "sampler thread still alive after stop()"

    samples = sampler.samples
    assert 3 <= len(samples) <= 7  # 1.5 s at 0.25 s; a loaded 2-core machine may wake the thread late
    assert len(calls) == len(samples)
    assert all(src == "cpu" for _, src, _ in calls)
    times = [s.t for s in samples]
    assert times == sorted(times) and 0 < times[0] < 1.0 and times[-1] <= 3.0
    total_gb = psutil.virtual_memory().total / 1024**3
    for s in samples:
        assert set(s.metrics) == set(CPU_METRICS)
        assert 0.0 <= s.metrics["cpu_util_pct"] <= 100.0
        assert 0.0 <= s.metrics["process_cpu_pct"] <= 100.0
        assert 0.0 < s.metrics["process_rss_gb"] < total_gb
        assert 0.0 < s.metrics["sys_mem_used_pct"] <= 100.0
    # The busy loop above should register on at least one sample.
    assert max(s.metrics["process_cpu_pct"] for s in samples) > 1.0
    sampler.stop()  # idempotent


def test_default_source_without_driver_is_cpu_and_restartable() -> None:
    if HAS_NVML:
        pytest.skip("this machine has a working NVML; the fallback is covered by the fake-NVML tests")
    sampler = UtilisationSampler(interval_s=0.05)
    assert sampler.source == "cpu"
    assert sampler.describe() == "CPU (no NVIDIA GPU or driver found)"
    for _ in range(2):  # start/stop twice: the second run starts from an empty buffer
        with sampler:
            wait_for_samples(sampler, 2)
        assert sampler.samples[0].t < 0.5
    assert not telemetry_threads()


def test_samples_are_bounded_and_callback_errors_do_not_stop_sampling(caplog: pytest.LogCaptureFixture) -> None:
    def bad_callback(t: float, source: str, metrics: dict[str, float]) -> None:
        raise RuntimeError("boom")

    sampler = UtilisationSampler(interval_s=0.03, on_sample=bad_callback, force_source="cpu", max_samples=3)
    with caplog.at_level(logging.ERROR, logger="engine.measure.telemetry"), sampler as s:
        deadline = time.monotonic() + 3.0
        while (latest := s.latest()) is None or latest.t < 0.3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert len(s.samples) == 3
    assert s.latest() == s.samples[-1]
    assert sum("on_sample callback raised" in r.getMessage() for r in caplog.records) == 1


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        UtilisationSampler(interval_s=0)
    with pytest.raises(ValueError):
        UtilisationSampler(force_source="tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        UtilisationSampler(max_samples=0, force_source="cpu")


def test_cpu_metric_failure_disables_only_that_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    with UtilisationSampler(interval_s=0.05, force_source="cpu") as s:
        wait_for_samples(s, 2)
    for sample in s.samples:
        assert set(sample.metrics) == set(CPU_METRICS) - {"sys_mem_used_pct"}


# --------------------------------------------------------------------------------------------
# Hardware description
# --------------------------------------------------------------------------------------------

HW_KEYS = {"kind", "name", "cores", "memory_gb", "torch_version", "cuda_version", "driver_version", "label"}


def test_describe_hardware_on_this_machine() -> None:
    info = describe_hardware()
    assert set(info) >= HW_KEYS
    assert info["kind"] in ("cuda", "cpu")
    assert isinstance(info["label"], str) and "\n" not in info["label"] and info["name"]
    assert info["cores"] >= 1
    if info["kind"] == "cpu":
        assert info["label"].startswith("CPU: ")
        assert f"{info['cores']} core" in info["label"]
        if not HAS_NVML:
            assert info["label"].endswith("no GPU found")
            assert info["driver_version"] is None
    else:
        assert info["label"].startswith("GPU: ") and info["cuda_version"]


def test_describe_hardware_sees_nvml_gpu_that_torch_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch)
    monkeypatch.setattr(
        hardware, "_torch_info", lambda i: {"torch_version": "2.13.0+cpu", "cuda_version": None, "torch_cuda": False}
    )
    info = describe_hardware()
    assert info["kind"] == "cpu"
    assert info["driver_version"] == "999.1"
    assert info["gpu_name"] == "Fake GPU X1"
    assert "GPU Fake GPU X1 present but torch 2.13.0+cpu cannot use it" in info["label"]


def test_describe_hardware_cuda_label(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch)
    monkeypatch.setattr(
        hardware,
        "_torch_info",
        lambda i: {
            "torch_version": "2.13.0",
            "cuda_version": "12.8",
            "torch_cuda": True,
            "name": "NVIDIA H200",
            "memory_gb": 139.8,
            "gpu_sm_count": 132,
            "gpu_count": 1,
        },
    )
    info = describe_hardware()
    assert info["kind"] == "cuda"
    assert info["label"] == "GPU: NVIDIA H200 (140 GiB), driver 999.1, CUDA 12.8"


def test_describe_hardware_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: object) -> None:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(hardware, "_torch_info", explode)
    info = describe_hardware()
    assert info["kind"] == "cpu" and set(info) >= HW_KEYS

    monkeypatch.setattr(
        hardware, "_torch_info", lambda i: {"torch_version": None, "cuda_version": None, "torch_cuda": False}
    )

    def failing_init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlInit", failing_init)
    monkeypatch.setattr(hardware, "_cpu_model", lambda: "Test CPU")
    info = describe_hardware()
    assert info["label"].startswith("CPU: Test CPU (") and info["label"].endswith("no GPU found")


# --------------------------------------------------------------------------------------------
# NVML failure and per-metric paths (fake NVML)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "CPU (no NVIDIA GPU or driver found)"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "CPU (no NVIDIA GPU or driver found)"),
        (pynvml.NVML_ERROR_UNKNOWN, "CPU (NVML failed: Unknown Error)"),
    ],
)
def test_nvml_init_failure_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch, code: int, reason: str) -> None:
    def failing_init() -> None:
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", failing_init)
    assert nvml_available() is False
    assert nvml_snapshot() is None
    seen: list[str] = []
    with UtilisationSampler(interval_s=0.05, on_sample=lambda t, src, m: seen.append(src)) as s:
        assert s.source == "cpu"
        wait_for_samples(s, 2)
    assert s.describe() == reason
    assert set(seen) == {"cpu"}
    with pytest.raises(TelemetryUnavailable):
        UtilisationSampler(force_source="nvml")


def test_nvml_no_devices_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 0)
    sampler = UtilisationSampler(interval_s=0.05)
    assert sampler.source == "cpu"
    assert fake.inits == fake.shutdowns == 1  # NVML released again


def test_nvml_per_metric_failure_disables_only_that_metric(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml(monkeypatch)

    def no_power(handle: str) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", no_power)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetClockInfo")  # a binding without the call
    seen: list[tuple[str, dict[str, float]]] = []
    sampler = UtilisationSampler(interval_s=0.03, on_sample=lambda t, src, m: seen.append((src, m)))
    with caplog.at_level(logging.WARNING, logger="engine.measure.telemetry"), sampler as s:
        assert s.source == "nvml"
        assert s.describe() == "NVML: Fake GPU X1 (GPU 0)"
        wait_for_samples(s, 4)
    assert fake.inits == fake.shutdowns == 1
    assert not telemetry_threads()
    for src, metrics in seen:
        assert src == "nvml"
        assert metrics == {
            "gpu_util_pct": 73.0,
            "mem_ctrl_util_pct": 41.0,
            "mem_used_gb": 3.0,
            "mem_total_gb": 80.0,
        }
    messages = [r.getMessage() for r in caplog.records]
    assert sum("power_w" in m for m in messages) == 1  # logged once, not per sample
    assert sum("sm_clock_mhz" in m for m in messages) == 1


def test_nvml_all_metrics_and_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch)
    assert nvml_available()
    snap = nvml_snapshot()
    assert snap == {
        "gpu_util_pct": 73.0,
        "mem_ctrl_util_pct": 41.0,
        "mem_used_gb": 3.0,
        "mem_total_gb": 80.0,
        "sm_clock_mhz": 1755.0,
        "power_w": 312.5,
    }


def test_nvml_gpm_metrics(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(monkeypatch, gpm=True)
    with caplog.at_level(logging.WARNING, logger="engine.measure.telemetry"), UtilisationSampler(interval_s=0.03) as s:
        assert s.describe() == "NVML: Fake GPU X1 (GPU 0, GPM on)"
        wait_for_samples(s, 4)
    for sample in s.samples:
        assert sample.metrics["dram_bw_util_pct"] == 62.5
        assert sample.metrics["tensor_util_pct"] == 12.25
        assert "sm_occupancy_pct" not in sample.metrics  # NOT_SUPPORTED for that metric only
        assert sample.metrics["power_w"] == 312.5
    assert sum("sm_occupancy_pct" in r.getMessage() for r in caplog.records) == 1
    # Each interval compares the previous device sample with the new one, alternating buffers.
    pairs = fake.gpm_pairs
    assert len(pairs) >= 4
    for a, b in itertools.pairwise(pairs):
        assert a[0] != a[1] and b == (a[1], a[0])
    assert fake.freed == 2

    snap = nvml_snapshot(gpm_window_s=0.01)
    assert snap is not None and snap["dram_bw_util_pct"] == 62.5


# --------------------------------------------------------------------------------------------
# Real GPU (only where NVML works)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_NVML, reason="needs an NVIDIA GPU with a working driver (NVML)")
def test_real_nvml_sampling() -> None:
    snap = nvml_snapshot(gpm_window_s=0.2)
    assert snap is not None and 0.0 <= snap["gpu_util_pct"] <= 100.0 and snap["mem_total_gb"] > 1.0
    seen: list[str] = []
    with UtilisationSampler(interval_s=0.2, force_source="nvml", on_sample=lambda t, src, m: seen.append(src)) as s:
        assert s.describe().startswith("NVML: ")
        wait_for_samples(s, 3)
    assert set(seen) == {"nvml"}
    for sample in s.samples:
        m = sample.metrics
        assert 0.0 <= m["gpu_util_pct"] <= 100.0 and 0.0 <= m["mem_ctrl_util_pct"] <= 100.0
        assert 0.0 < m["mem_used_gb"] <= m["mem_total_gb"]
        assert m["sm_clock_mhz"] >= 0.0
        for key in telemetry.GPM_METRICS:
            if key in m:
                assert 0.0 <= m[key] <= 100.0
    info = describe_hardware()
    assert info["driver_version"] and info["gpu_name"]


def test_the_sessions_own_share_counts_the_processes_it_started() -> None:
    """A llama-server the worker starts decodes in a child process: "this session" counts it (it once showed
    0–2% while its server used 60–69% of a core), and its memory too."""
    from engine.measure.telemetry_cpu import CpuBackend

    backend = CpuBackend("test")
    burn = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        server = psutil.Process(child.pid)
        time.sleep(1.2)  # the child list is refreshed each second
        backend.read()
        before = server.cpu_times()
        wall, ncpu = time.monotonic(), psutil.cpu_count() or 1
        time.sleep(2.0)
        sample = backend.read()
        after = server.cpu_times()
        wall = time.monotonic() - wall
        child_pct = 100.0 * (after.user + after.system - before.user - before.system) / wall / ncpu
        assert child_pct > 5.0, f"the child barely ran ({child_pct:.1f}% of all cores): the machine is too busy"
        assert sample["process_cpu_pct"] >= 0.8 * child_pct, (sample, child_pct)  # ours includes what the child used
        assert sample["process_rss_gb"] * 1024**3 > psutil.Process().memory_info().rss  # and the child's memory
    finally:
        child.kill()
        child.wait()
