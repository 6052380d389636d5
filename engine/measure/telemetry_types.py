"""What device telemetry hands back: a Sample, the source names, and the error for a source that cannot be used."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

GIB = 1024**3
Source = Literal["nvml", "cpu"]
OnSample = Callable[[float, str, dict[str, float]], None]


class TelemetryUnavailable(RuntimeError):
    """Raised only when a caller insists on ``force_source="nvml"`` and NVML cannot be used.

    ``reason`` is a short user-facing phrase, e.g. "no NVIDIA GPU or driver found".
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class Sample:
    """One reading: seconds since the sampler started, the source and its metrics."""

    t: float
    source: str
    metrics: dict[str, float] = field(default_factory=dict)
