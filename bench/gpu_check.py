"""Prove the NVML telemetry path on a real NVIDIA GPU (the CI box has none, so this is the only check).

Usage:  python bench/gpu_check.py [report.json]      (default: gpu_check.json)

The report path is checked before anything runs: a folder, anything that is not a regular file (a device, a FIFO, a
socket), a file in a folder that does not exist, a read-only file and spectune's store database are refused with
one line and exit 2 (engine.service.outputs, which needs SQLAlchemy: carry it to a GPU host as for
bench/gpu_session_check.py). The report replaces an existing file whole (a temporary file renamed over it).

On a GPU machine it prints describe_hardware(), samples NVML every 0.5 s for ~6 s while torch
runs a compute-bound phase (bf16 matmuls) and then a memory-bound phase (large copies), prints
each sample (GPM metrics included when the GPU supports them, i.e. Hopper or newer), and writes
a JSON report. The phases make the GPM wiring checkable: tensor activity should peak during the
matmuls and DRAM bandwidth during the copies.

Exit status: 0 when NVML worked (or when there is no GPU at all, which is not this script's
business), 1 when a GPU is present but NVML telemetry did not work, or a vLLM (SPECTUNE_VLLM_PYTHON) is installed
and did not speculate (its step: a managed vLLM server with n-gram speculation, one request, drafts in /metrics).
Runs in well under 2 min, plus the vLLM start.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.measure.hardware import describe_hardware
from engine.measure.telemetry import GPM_METRICS, UtilisationSampler, nvml_available, nvml_snapshot

INTERVAL_S = 0.5
PHASE_S = 3.0
PCT_METRICS = ("gpu_util_pct", "mem_ctrl_util_pct", *GPM_METRICS)
DEFAULT_REPORT = "gpu_check.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: one optional report path, checked before anything runs (engine.service.outputs)."""
    from engine.service.outputs import output_file  # SQLAlchemy: carried to a GPU host as gpu_session_check's is

    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description=(__doc__ or "").splitlines()[0],
        epilog="Exit status: 0 when NVML worked or there is no NVIDIA GPU, 1 when a check failed, 2 for a bad "
        "argument or a report that could not be written.",
    )
    parser.add_argument(
        "report",
        nargs="?",
        type=output_file,
        default=DEFAULT_REPORT,
        help=f"the JSON report to write (default: {DEFAULT_REPORT} in the current folder); an existing file is "
        "replaced whole",
    )
    return parser.parse_args(argv)


def print_sample(t: float, source: str, metrics: dict[str, float]) -> None:
    """on_sample callback: one line per sample, so progress is visible while the load runs."""
    cells = "  ".join(f"{k}={v:.1f}" for k, v in metrics.items())
    print(f"  t={t:5.2f}s [{source}] {cells}", flush=True)


def run_load(sampler: UtilisationSampler) -> list[dict[str, Any]]:
    """Compute-bound then memory-bound torch work; returns the phase windows on the sampler clock."""
    import torch

    t0 = sampler.t0
    assert t0 is not None

    def now() -> float:  # the sampler's clock, so phases line up with sample times
        return time.perf_counter() - t0

    phases: list[dict[str, Any]] = []
    dev = torch.device("cuda")

    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.cuda.synchronize()
    start, iters = now(), 0
    while now() - start < PHASE_S:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        iters += 8
    end = now()
    phases.append(
        {"name": "matmul_bf16", "start": start, "end": end, "tflops": 2 * n**3 * iters / (end - start) / 1e12}
    )
    del a, b, c

    numel = 512 * 1024**2  # 2 GiB of fp32 per buffer
    x = torch.ones(numel, device=dev)
    y = torch.empty_like(x)
    torch.cuda.synchronize()
    start, iters = now(), 0
    while now() - start < PHASE_S:
        for _ in range(8):
            y.copy_(x)
        torch.cuda.synchronize()
        iters += 8
    end = now()
    moved = 2 * numel * 4 * iters  # read + write
    phases.append({"name": "copy", "start": start, "end": end, "gb_per_s": moved / (end - start) / 1e9})
    del x, y
    torch.cuda.empty_cache()
    return phases


def phase_means(samples: list[dict[str, Any]], phase: dict[str, Any]) -> dict[str, float]:
    """Mean of each metric over samples whose whole interval lies inside the phase."""
    slack = 0.05
    inside = [s for s in samples if phase["start"] - slack <= s["t"] - INTERVAL_S and s["t"] <= phase["end"] + slack]
    keys = {k for s in inside for k in s["metrics"]}
    return {
        k: sum(s["metrics"][k] for s in inside if k in s["metrics"]) / sum(k in s["metrics"] for s in inside)
        for k in sorted(keys)
    }


def check(report: dict[str, Any], hw: dict[str, Any]) -> bool:
    """Sample with NVML under load; fill ``report``; True when NVML telemetry worked."""
    problems: list[str] = report["problems"]
    warnings: list[str] = report["warnings"]
    report["idle_snapshot"] = nvml_snapshot(gpm_window_s=0.5)
    print(f"idle NVML snapshot: {report['idle_snapshot']}")

    sampler = UtilisationSampler(INTERVAL_S, on_sample=print_sample, force_source="nvml")
    report["sampler"] = sampler.describe()
    print(f"sampler: {report['sampler']}")
    with sampler:
        if hw["kind"] == "cuda":
            report["phases"] = run_load(sampler)
        else:
            warnings.append("torch cannot use the GPU; sampled an idle GPU only")
            time.sleep(2 * PHASE_S)
            report["phases"] = []
        time.sleep(INTERVAL_S * 1.2)  # let the last phase's interval be sampled
    samples = [{"t": round(s.t, 3), "source": s.source, "metrics": s.metrics} for s in sampler.samples]
    report["samples"] = samples
    report["sampler"] = sampler.describe()

    if len(samples) < 6:
        problems.append(f"only {len(samples)} samples in ~{2 * PHASE_S:.0f} s")
    for key in ("gpu_util_pct", "mem_ctrl_util_pct", "mem_used_gb", "sm_clock_mhz", "power_w"):
        missing = sum(key not in s["metrics"] for s in samples)
        if missing:
            (problems if key in ("gpu_util_pct", "mem_used_gb") else warnings).append(
                f"{key} missing from {missing}/{len(samples)} samples"
            )
    for s in samples:
        for key in PCT_METRICS:
            value = s["metrics"].get(key)
            if value is not None and not 0.0 <= value <= 100.5:
                problems.append(f"{key}={value} out of 0-100 at t={s['t']}")

    gpm_seen = sorted({k for s in samples for k in s["metrics"] if k in GPM_METRICS})
    report["gpm_metrics_seen"] = gpm_seen
    if not gpm_seen:
        warnings.append("no GPM metrics (pre-Hopper GPU, MIG/vGPU, or GPM not permitted here)")
    elif len(gpm_seen) < len(GPM_METRICS):
        warnings.append(f"only some GPM metrics: {gpm_seen}")

    by_phase = {p["name"]: phase_means(samples, p) for p in report["phases"]}
    report["phase_means"] = by_phase
    if by_phase:
        mm, cp = by_phase.get("matmul_bf16", {}), by_phase.get("copy", {})
        if mm.get("gpu_util_pct", 0.0) < 50.0:
            problems.append(f"gpu_util_pct only {mm.get('gpu_util_pct')} during matmuls")
        if "tensor_util_pct" in mm and "tensor_util_pct" in cp and mm["tensor_util_pct"] <= cp["tensor_util_pct"]:
            warnings.append("tensor_util_pct not higher during matmuls than during copies")
        if "dram_bw_util_pct" in mm and "dram_bw_util_pct" in cp and cp["dram_bw_util_pct"] <= mm["dram_bw_util_pct"]:
            warnings.append("dram_bw_util_pct not higher during copies than during matmuls")
    return not problems


def vllm_step(report: dict[str, Any]) -> None:
    """On a GPU: the vLLM that SPECTUNE_VLLM_PYTHON names (the official CUDA `vllm`) started by spectune's runner code
    with n-gram speculation (γ 3) on SPECTUNE_GPU_CHECK_MODEL (default: the bundled SmolLM2-135M's directory) in
    bfloat16; one greedy request; its /metrics must show drafts. Recorded under "vllm"; a missing vLLM is a warning."""
    import os
    import urllib.request

    from engine.engines.vllm.binaries import VllmMissing, find_vllm
    from engine.engines.vllm.server import VllmConfig, VllmServer, VllmServerError
    from engine.serving.metrics import parse_metrics

    try:
        install = find_vllm()
    except VllmMissing as exc:
        report["warnings"].append(f"vLLM step skipped: {exc}")
        return
    model = os.environ.get("SPECTUNE_GPU_CHECK_MODEL")
    if not model:
        from engine.models.loading import prepare_bundled

        model = str(prepare_bundled("smollm2-135m"))
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    config = VllmConfig.with_speculation(Path(model), spec, dtype="bfloat16", enforce_eager=False, max_model_len=2048)
    step: dict[str, Any] = {"install": install.describe()}
    try:
        with VllmServer(config, install=install) as server:
            body = json.dumps({"model": model, "prompt": "a b c a b c a b c a b c a b", "max_tokens": 32,
                               "temperature": 0}).encode()  # fmt: skip
            request = urllib.request.Request(f"{server.url}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as reply:
                step["text"] = json.loads(reply.read())["choices"][0]["text"]
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
                counters = parse_metrics(reply.read().decode())
            step |= {"version": server.version, "startup_s": server.startup_s, "drafts": counters.drafts,
                     "accepted": counters.accepted_tokens}  # fmt: skip
    except VllmServerError as exc:
        report["problems"].append(f"vLLM did not serve: {exc}")
    else:
        if not step.get("drafts"):
            report["problems"].append(f"vLLM served but drafted nothing: {step}")
    report["vllm"] = step


def main(argv: list[str]) -> int:
    """Check NVML (and vLLM where installed), write the report, print a summary; the exit status."""
    out = parse_args(argv).report
    # INFO shows why GPM is off (e.g. "GPM unavailable on ...") and each metric NVML disables.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    hw = describe_hardware()
    print(f"hardware: {hw['label']}")
    print(json.dumps(hw, indent=2, ensure_ascii=False))
    report: dict[str, Any] = {
        "hardware": hw,
        "python": platform.python_version(),
        "nvml_available": nvml_available(),
        "problems": [],
        "warnings": [],
    }
    try:
        import pynvml

        report["pynvml_file"] = pynvml.__file__
    except ImportError:
        report["pynvml_file"] = None

    if report["nvml_available"]:
        try:
            ok = check(report, hw)
            vllm_step(report)
            ok = ok and not any(p.startswith("vLLM") for p in report["problems"])
        except Exception:  # noqa: BLE001 -- report whatever broke, then fail
            report["problems"].append("exception:\n" + traceback.format_exc())
            ok = False
    elif hw["kind"] == "cuda" or hw.get("gpu_name"):
        report["problems"].append("a GPU is present but NVML could not be initialised")
        ok = False
    else:
        print("No NVIDIA GPU found: nothing to check (exit 0).")
        ok = True
    report["ok"] = ok
    for w in report["warnings"]:
        print(f"warning: {w}")
    for p in report["problems"]:
        print(f"PROBLEM: {p}")
    for name, means in report.get("phase_means", {}).items():
        print(f"{name}: " + ", ".join(f"{k}={v:.1f}" for k, v in means.items()))
    from engine.service.outputs import write_output

    write_output(out, json.dumps(report, indent=2, ensure_ascii=False) + "\n")  # OutputError: run_command says it
    print(f"{'OK' if ok else 'FAILED'}: report written to {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    from engine.service.outputs import run_command

    run_command(main, sys.argv[1:])
