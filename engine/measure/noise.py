"""Speedups robust to drift: ratios of neighbouring measurements, their spread, and a noise verdict.

A machine's load changes minute to minute, so a speedup is only formed from a baseline and a candidate
measured next to each other (the same prompt, one right after the other). Each prompt gives one ratio;
the run's speedup is their median, reported with min and max. When that spread is wider than the effect
("is it faster at all?"), the verdict says so instead of offering a bare number.

The machine's own noise is summarised here too: other processes' CPU share (and GPU use) read around each
decode (engine.measure.telemetry.LoadMeter) become a run's and a session's ``machine_load``, and a busy
machine gets a note that the dashboard shows next to the results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

# the spread (max/min of per-prompt ratios) beyond which one prompt's ratio says little about another's
WIDE_SPREAD = 1.5


@dataclass(frozen=True)
class Spread:
    """Per-prompt speedups (candidate tokens/s ÷ the neighbouring baseline's) summarised."""

    median: float
    min: float
    max: float
    n: int
    verdict: str  # "faster" | "slower" | "too noisy to tell" | "single measurement"
    dropped: int = 0  # prompts left out of the verdict: their ratio broke its bound (a measurement error)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def ratio(base: float, cand: float) -> float | None:
    """candidate ÷ baseline for one pair of rates measured side by side; None where either measured nothing."""
    return cand / base if base > 0 and cand > 0 else None


def ratios(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """candidate ÷ baseline for each (baseline, candidate) pair of rates measured side by side."""
    return [r for base, cand in pairs if (r := ratio(base, cand)) is not None]


def spread_of(values: Sequence[float]) -> Spread | None:
    """The spread of per-prompt speedups and what it allows us to say; None with no usable pair."""
    if not values:
        return None
    lo, mid, hi = min(values), median(values), max(values)
    if len(values) == 1:
        verdict = "single measurement"
    elif hi / lo > WIDE_SPREAD:  # one prompt's ratio says little about another's: no direction to claim
        verdict = "too noisy to tell"
    elif lo > 1.0:
        verdict = "faster"
    elif hi < 1.0:
        verdict = "slower"
    else:  # the per-prompt ratios straddle 1: the effect is smaller than the noise
        verdict = "too noisy to tell"
    return Spread(median=mid, min=lo, max=hi, n=len(values), verdict=verdict)


def is_noisy(spread: Spread | None) -> bool:
    """A measured speedup that must not be calibrated to: straddling 1, or its ratios widely spread."""
    if spread is None or spread.n < 2:
        return spread is None
    return spread.verdict == "too noisy to tell" or spread.max / spread.min > WIDE_SPREAD


def stored_noisy(spread: Mapping[str, object] | None) -> bool | None:
    """A stored speedup spread (Spread.to_dict) judged: None when none was stored or it cannot be read; True when
    it rests on one prompt (no spread to judge it by) or is_noisy says so. Every page, the recommender and the
    policy table read a run's noise through this one test."""
    if not isinstance(spread, Mapping):
        return None
    try:
        judged = Spread(**{k: spread[k] for k in ("median", "min", "max", "n", "verdict")})  # type: ignore[arg-type]
        return int(judged.n) < 2 or is_noisy(judged)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


FLOOR_TOLERANCE = 0.05  # an A/A median further than this from 1.00 is a biased measurement
FLOOR_SPREAD = WIDE_SPREAD  # an A/A spread (max ÷ min) wider than this is itself too noisy to tell


@dataclass(frozen=True)
class MeasurementFloor:
    """The target alone measured twice in one session (an A/A check): per prompt, the second measurement's tokens/s
    ÷ the first's, side by side as every speedup is. Its median should be 1.00; its spread is how far apart two
    measurements of one configuration land on this machine, the floor under which no speedup can be told.
    `prompts`: how many distinct prompts the ratios come from (a session of two sweeps pairs each prompt twice);
    None where unknown (then every ratio counts as a prompt)."""

    ratios: tuple[float, ...]
    prompts: int | None = None

    @property
    def spread(self) -> Spread | None:
        return spread_of(self.ratios)

    @property
    def n_prompts(self) -> int:
        """The distinct prompts the A/A ratios come from."""
        return self.prompts if self.prompts is not None else len(self.ratios)

    @property
    def holds(self) -> bool:
        """Whether the session measured without a bias and above the noise: the A/A median within FLOOR_TOLERANCE
        of 1.00 and its spread no wider than FLOOR_SPREAD (max ÷ min). True when nothing was measured."""
        spread = self.spread
        if spread is None:
            return True
        return abs(spread.median - 1.0) <= FLOOR_TOLERANCE and spread.max / spread.min <= FLOOR_SPREAD

    def why_not(self) -> str | None:
        """Why the floor does not hold, in a clause, or None when it holds."""
        spread = self.spread
        if spread is None or self.holds:
            return None
        if abs(spread.median - 1.0) > FLOOR_TOLERANCE:
            return (
                f"the same configuration measured {spread.median:.2f}× itself, more than "
                f"{FLOOR_TOLERANCE:.0%} from 1.00"
            )
        return (
            f"two measurements of the same configuration landed up to {spread.max / spread.min:.2f}× apart, "
            f"wider than {FLOOR_SPREAD:g}×"
        )

    def sentence(self) -> str:
        """The floor as every page, the CLI and the report say it."""
        spread = self.spread
        if spread is None:
            return "Measurement floor: not measured (no prompt decoded twice by the target alone)."
        n = self.n_prompts
        pairs = f", {spread.n} A/A pairs" if spread.n != n else ""
        band = f"{spread.min:.2f}–{spread.max:.2f}× over {n} prompts{pairs}" if spread.n > 1 else "one prompt"
        head = f"Measurement floor (target ÷ target, A/A): {spread.median:.2f}× ({band})"
        if self.holds:
            return f"{head}: the measurements hold; a speedup inside {spread.min:.2f}–{spread.max:.2f}× is noise."
        return (
            f"{head}: it does not hold — {self.why_not()} — so every speedup of this session is marked too "
            "noisy to tell. Repeat on a quiet machine."
        )

    def to_dict(self) -> dict[str, object]:
        spread = self.spread
        return {
            "ratios": [round(r, 4) for r in self.ratios],
            "prompts": self.prompts,
            "spread": spread.to_dict() if spread else None,
            "holds": self.holds,
            "sentence": self.sentence(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> MeasurementFloor | None:
        """A stored floor (to_dict), or None when none was stored or it cannot be read."""
        if not isinstance(data, Mapping):
            return None
        try:
            prompts = data.get("prompts")
            return cls(
                tuple(float(r) for r in data.get("ratios") or ()),  # type: ignore[union-attr]
                int(prompts) if isinstance(prompts, int | float) else None,
            )
        except (TypeError, ValueError):
            return None


OVERHEAD_GOAL = 0.25  # the prime and the A/A decode together should cost at most this share of the decoding


@dataclass(frozen=True)
class MeasurementOverhead:
    """What measuring honestly cost a session, in wall seconds: each prompt's untimed prime, the A/A decodes of the
    target alone and the fidelity references (the target's top where an output diverged), beside the timed decodes of
    every configuration. `share` is (prime + A/A + references) ÷ decoding."""

    prime_s: float = 0.0
    aa_s: float = 0.0
    decoding_s: float = 0.0
    reference_s: float = 0.0

    @property
    def measuring_s(self) -> float:
        return self.prime_s + self.aa_s + self.reference_s

    @property
    def share(self) -> float | None:
        return self.measuring_s / self.decoding_s if self.decoding_s > 0 else None

    def plus(self, other: MeasurementOverhead) -> MeasurementOverhead:
        return MeasurementOverhead(
            self.prime_s + other.prime_s,
            self.aa_s + other.aa_s,
            self.decoding_s + other.decoding_s,
            self.reference_s + other.reference_s,
        )

    def sentence(self) -> str | None:
        """'Measuring cost 31% on top of decoding (the prime 12 s, the A/A check 9.0 s, the configurations' decodes
        68 s)', the fidelity references named where they took any time; None when nothing was decoded."""
        share = self.share
        if share is None:
            return None
        over = f"; more than the {OVERHEAD_GOAL:.0%} aimed at" if share > OVERHEAD_GOAL else ""
        references = f", fidelity references {_seconds(self.reference_s)}" if self.reference_s >= 0.05 else ""
        decodes = _seconds(self.decoding_s)
        return (
            f"Measuring cost {share:.0%} on top of decoding (the prime {_seconds(self.prime_s)}, the A/A check "
            f"{_seconds(self.aa_s)}{references}, the configurations' decodes {decodes}){over}."
        )

    def to_dict(self) -> dict[str, object]:
        share = self.share
        return {
            "prime_s": round(self.prime_s, 3),
            "aa_s": round(self.aa_s, 3),
            "decoding_s": round(self.decoding_s, 3),
            "reference_s": round(self.reference_s, 3),
            "share": None if share is None else round(share, 4),
            "sentence": self.sentence(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> MeasurementOverhead | None:
        """A stored overhead (to_dict), or None when none was stored or it cannot be read."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(
                float(data["prime_s"]),
                float(data["aa_s"]),
                float(data["decoding_s"]),  # type: ignore[arg-type]
                float(data.get("reference_s") or 0.0),
            )  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return None


def floor_off(floor: Mapping[str, object] | None) -> bool:
    """Whether a stored measurement floor says the session's speedups are biased (False when none was stored)."""
    judged = MeasurementFloor.from_dict(floor)
    return judged is not None and not judged.holds


# The machine counts as busy when other processes took this share of all its cores (median over the
# decodes), or when another process kept the GPU this busy: both change a decode's speed minute to minute.
BUSY_OTHER_CPU_PCT = 25.0
BUSY_OTHER_GPU_PCT = 10.0


def load_summary(readings: Sequence[Mapping[str, float]]) -> dict[str, float | int] | None:
    """Median and max of each load metric over readings taken around decodes (LoadMeter.read()):
    other_cpu_pct_median/max and, where NVML reported it, other_gpu_util_pct_median/max; n readings."""
    out: dict[str, float | int] = {}
    for key in ("other_cpu_pct", "other_gpu_util_pct"):
        values = [float(r[key]) for r in readings if r.get(key) is not None]
        if values:
            out[f"{key}_median"] = round(median(values), 1)
            out[f"{key}_max"] = round(max(values), 1)
    if not out:
        return None
    out["n"] = len(readings)
    return out


def is_busy(load: Mapping[str, Any] | None) -> bool:
    """Whether a load summary says the machine was busy with other work while it was measured."""
    if not load:
        return False
    cpu = load.get("other_cpu_pct_median")
    gpu = load.get("other_gpu_util_pct_median")
    return (cpu is not None and cpu >= BUSY_OTHER_CPU_PCT) or (gpu is not None and gpu >= BUSY_OTHER_GPU_PCT)


def busy_note(load: Mapping[str, Any] | None) -> str | None:
    """The session-level warning for a busy machine, or None when it was quiet (or load is unknown)."""
    if not is_busy(load):
        return None
    assert load is not None
    parts = []
    if load.get("other_cpu_pct_median") is not None:
        parts.append(
            f"other processes used a median {load['other_cpu_pct_median']:.0f}% of the CPUs "
            f"(up to {load['other_cpu_pct_max']:.0f}%)"
        )
    if load.get("other_gpu_util_pct_median") is not None and load["other_gpu_util_pct_median"] > 0:
        parts.append(f"other processes kept the GPU a median {load['other_gpu_util_pct_median']:.0f}% busy")
    return (
        "Measured on a busy machine: " + " and ".join(parts) + " while this session decoded. Each speedup is a "
        "median of per-prompt ratios measured side by side, which cancels slow drift, but a wide spread or a "
        "'too noisy to tell' verdict is the machine's noise, not the draft's: repeat on a quiet machine."
    )


def _seconds(value: float) -> str:
    """'12 s', or '0.4 s' below 10 s (a short session's parts would all read '0 s')."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"
