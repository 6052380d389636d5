"""Utilisation samples as a chart's long table, with the sampler's metric names as a legend says them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency

UTILISATION_LABELS = {  # the sampler's metric names (engine.measure.telemetry_*) as a chart legend says them
    "cpu_util_pct": "CPU (all)",
    "other_cpu_pct": "other processes",
    "process_cpu_pct": "this session",
    "sys_mem_used_pct": "memory used",
    "gpu_util_pct": "GPU busy",
    "mem_ctrl_util_pct": "GPU memory controller busy",
    "dram_bw_util_pct": "GPU memory bandwidth",
    "sm_occupancy_pct": "GPU SM occupancy",
    "tensor_util_pct": "GPU tensor cores busy",
}


def utilisation_label(name: str) -> str:
    """A sampler metric's legend label; an unknown one is spelled out from its name (`xyz_util_pct` → `xyz util`)."""
    return UTILISATION_LABELS.get(name) or name.removesuffix("_pct").replace("_", " ")


def utilisation_long(samples: Sequence[Mapping[str, Any]], percent_only: bool = True) -> pd.DataFrame:
    """Samples → (seconds since the first sample, metric label, value); by default only the *_pct metrics."""
    if not samples:
        return pd.DataFrame(columns=["seconds", "metric", "value", "source"])
    t0 = min(float(s["t"]) for s in samples)
    rows = []
    for s in samples:
        for name, value in (s.get("metrics") or {}).items():
            if percent_only and not str(name).endswith("_pct"):
                continue
            rows.append(
                {
                    "seconds": float(s["t"]) - t0,
                    "metric": utilisation_label(str(name)),
                    "value": float(value),
                    "source": s.get("source"),
                }
            )
    return pd.DataFrame(rows, columns=["seconds", "metric", "value", "source"])
