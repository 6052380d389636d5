"""What this machine can decode on, in one dict and one line of text.

The dashboard shows ``describe_hardware()["label"]`` next to every measurement, because a
tokens-per-second figure means nothing without the device it came from. Everything here is
best effort: a missing driver, a CPU-only torch build or an odd /proc never raises, it only
leaves a field as ``None``.

``kind`` is "cuda" only when torch can actually run on the GPU. A GPU that NVML can see but a
CPU-only torch build cannot use still yields ``kind == "cpu"`` (the label says so), because
decoding would run on the CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
from typing import Any

log = logging.getLogger(__name__)

# Errors an NVML call may raise (see engine.measure.telemetry.NVML_ERRORS for why a tuple, not Exception).
_NVML_ERRORS: tuple[type[Exception], ...] = (AttributeError, TypeError, ValueError, OSError, UnicodeDecodeError)

GIB = 1024**3


def _cpu_model() -> str:
    """CPU model name: /proc/cpuinfo on Linux, platform.processor() elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_cores() -> int:
    """Logical cores this process may run on (the affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that compute in bfloat16 (Cooper Lake, Sapphire Rapids…)


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Does this CPU compute bfloat16 natively (an AVX-512 BF16 or AMX-BF16 flag in /proc/cpuinfo)? Without them
    PyTorch emulates bf16 and runs it about half as fast as on CPUs with them (measured: ~2 tok/s on an AVX2 EPYC)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            return any(flag in flags for flag in BF16_FLAGS)
    return False


def default_dtype(kind: str | None, cpu_bf16: bool) -> str:
    """The dtype a session computes in unless told otherwise: bfloat16 on a GPU or a CPU with bf16 instructions,
    float32 elsewhere (where bf16 is emulated; float32 is also what exactness checks need)."""
    return "bfloat16" if kind == "cuda" or cpu_bf16 else "float32"


def machine_dtype() -> str:
    """default_dtype for this machine (the Run page and the CLI share it)."""
    return str(describe_hardware().get("default_dtype") or "float32")


def _host_memory_gb() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / GIB, 1)
    except (ImportError, OSError, AttributeError):  # psutil missing or unreadable /proc
        try:
            return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)
        except (AttributeError, ValueError, OSError):
            return None


def _nvml_info(device_index: int) -> dict[str, Any] | None:
    """GPU name, memory and driver from NVML, or None when there is no driver or GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    errors = (*_NVML_ERRORS, pynvml.NVMLError)
    try:
        pynvml.nvmlInit()
    except errors as exc:  # no driver / library, or an odd binding
        log.debug("NVML unavailable: %s", exc)
        return None
    info: dict[str, Any] = {}
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count < 1 or device_index >= count:
            return None
        info["gpu_count"] = count
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        for key, read in (
            ("name", lambda: pynvml.nvmlDeviceGetName(handle)),
            ("memory_gb", lambda: round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB, 1)),
            ("driver_version", pynvml.nvmlSystemGetDriverVersion),
            ("driver_cuda_version", lambda: _cuda_int_to_str(pynvml.nvmlSystemGetCudaDriverVersion())),
        ):
            try:
                value = read()
                info[key] = value.decode() if isinstance(value, bytes) else value
            except errors as exc:
                log.debug("NVML %s unavailable: %s", key, exc)
        return info
    except errors as exc:
        log.debug("NVML device query failed: %s", exc)
        return None
    finally:
        with contextlib.suppress(*errors):
            pynvml.nvmlShutdown()


def _cuda_int_to_str(version: int) -> str:
    """NVML reports CUDA 12.8 as 12080."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _torch_info(device_index: int) -> dict[str, Any]:
    info: dict[str, Any] = {"torch_version": None, "cuda_version": None, "torch_cuda": False}
    try:
        import torch
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:  # not installed, or a broken install
        log.debug("torch unavailable: %s", exc)
        return info
    info["torch_version"] = str(torch.__version__)
    info["cuda_version"] = torch.version.cuda
    try:
        if torch.cuda.is_available() and device_index < torch.cuda.device_count():
            props = torch.cuda.get_device_properties(device_index)
            info["torch_cuda"] = True
            info["name"] = torch.cuda.get_device_name(device_index)
            info["memory_gb"] = round(props.total_memory / GIB, 1)
            info["gpu_sm_count"] = props.multi_processor_count
            info["gpu_count"] = torch.cuda.device_count()
    except (RuntimeError, AssertionError, AttributeError, OSError, ValueError) as exc:  # old driver, CUDA init
        log.debug("torch.cuda query failed: %s", exc)
    return info


def _fmt_gib(value: float | None) -> str:
    return "? GiB" if value is None else f"{value:.0f} GiB"


def describe_hardware(device_index: int = 0) -> dict[str, Any]:
    """Describe the decoding device; never raises.

    Keys: kind ("cuda" | "cpu"), name, cores (CPU cores available to this process),
    memory_gb (GPU memory for "cuda", system RAM for "cpu"), host_memory_gb, torch_version,
    cuda_version (torch's CUDA build, None for CPU builds), driver_version (None without a
    driver), gpu_count, gpu_name (a GPU NVML saw even if torch cannot use it), label.
    """
    try:
        return _describe(device_index)
    except Exception as exc:  # noqa: BLE001 -- documented as never raising; the dashboard must render
        log.warning("describe_hardware failed: %s", exc)
        return {
            "kind": "cpu",
            "name": platform.processor() or "unknown CPU",
            "cores": os.cpu_count() or 1,
            "memory_gb": None,
            "host_memory_gb": None,
            "torch_version": None,
            "cuda_version": None,
            "driver_version": None,
            "gpu_count": 0,
            "gpu_name": None,
            "label": "CPU (hardware could not be described)",
        }


def _describe(device_index: int) -> dict[str, Any]:
    cores = _cpu_cores()
    host_mem = _host_memory_gb()
    nv = _nvml_info(device_index) or {}
    tq = _torch_info(device_index)
    gpu_name = tq.get("name") or nv.get("name")
    info: dict[str, Any] = {
        "cores": cores,
        "host_memory_gb": host_mem,
        "torch_version": tq["torch_version"],
        "cuda_version": tq["cuda_version"],
        "driver_version": nv.get("driver_version"),
        "gpu_count": tq.get("gpu_count") or nv.get("gpu_count") or 0,
        "gpu_name": gpu_name,
    }
    if tq["torch_cuda"]:
        memory = tq.get("memory_gb") or nv.get("memory_gb")
        info.update(kind="cuda", name=gpu_name, memory_gb=memory, gpu_sm_count=tq.get("gpu_sm_count"))
        label = f"GPU: {gpu_name} ({_fmt_gib(memory)})"
        if info["gpu_count"] > 1:
            label += f", {info['gpu_count']} GPUs"
        if info["driver_version"]:
            label += f", driver {info['driver_version']}"
        if info["cuda_version"]:
            label += f", CUDA {info['cuda_version']}"
    else:
        cpu = _cpu_model()
        info.update(kind="cpu", name=cpu, memory_gb=host_mem, cpu_bf16=cpu_has_bf16())
        label = f"CPU: {cpu} ({cores} core{'s' if cores != 1 else ''}, {_fmt_gib(host_mem)})"
        if gpu_name:
            torch_desc = f"torch {tq['torch_version']}" if tq["torch_version"] else "torch (not installed)"
            label += f" — GPU {gpu_name} present but {torch_desc} cannot use it"
        else:
            label += " — no GPU found"
    info["label"] = label
    info["default_dtype"] = default_dtype(info["kind"], bool(info.get("cpu_bf16")))
    first = ("kind", "name", "cores", "memory_gb")
    return {**{k: info[k] for k in first}, **{k: v for k, v in info.items() if k not in first}}
