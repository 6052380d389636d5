"""Memory-bound or compute-bound at the serving batch: decided from measured evidence, never assumed.

Why this matters: speculation's extra arithmetic is free when decoding is memory-bound (weights
stream from memory once per step, compute idles) and billed when it is compute-bound (Theorem
3.11's multiplier lands on the bill). The chapter's diagnostic says nothing else matters until
this is answered, so this module answers it from three kinds of evidence:

1. a batch sweep — decode step time vs batch size: flat while memory-bound, then about linear
   once compute saturates (the knee);
2. the verify curve v(k) — cost of a k-token target forward relative to 1 token: near 1 means
   verification rides on the weight stream (memory-bound), near k means it is billed;
3. a roofline — achieved bytes/s and FLOP/s of a step against measured peaks.

The classifiers are pure functions on numbers, so recorded sweeps can be re-judged; judge_regime
is the one place that turns evidence (fresh from the worker, or stored with a session) into a
verdict at a serving batch, for the worker, the CLI and the dashboard alike. A verify step at batch
b with γ draft tokens processes b·(γ+1) token rows, so the knee is compared with that width."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from engine.analysis.bounds import check_fraction_of_peak, check_verify_cost
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, REGIMES, measured_verify_points, verify_cost_at
from engine.measure.microbench import LINEAR_FRACTION, growth_fractions

# v(k) judged at k = 8 by default: (v(k) - 1)/(k - 1) <= 0.25 → free, >= 0.75 → billed, else partial.
VERIFY_FREE_FRACTION = 0.25


VERIFY_BILLED_FRACTION = 0.75


def regime_at_width(width: int, knee_batch: int | None) -> str:
    """The regime of a step that processes `width` token rows (batch × tokens per row), given the knee.

    Below the knee (or with no knee seen) the rows ride on the weight stream: memory-bound; at or
    past it compute is saturated: compute-bound. A verify step at batch b with γ draft tokens has
    width b·(γ+1).
    """
    return MEMORY_BOUND if knee_batch is None or width < knee_batch else COMPUTE_BOUND


@dataclass
class BatchSweepClassification:
    """A decode-step batch sweep, judged: where the knee is and what the serving batch is."""

    batch_sizes: list[int]
    step_times_s: list[float]
    marginal_cost_s: list[float]  # seconds per added row vs the previous batch (first entry: t(b0)/b0)
    per_row_s: list[float]  # t(b)/b
    growth_fraction: list[float | None]  # (t(b)/t(b_prev)) / (b/b_prev); None for the first batch
    knee_batch: int | None
    serving_batch: int
    label: str  # "memory-bound" | "compute-bound"
    evidence: list[str] = field(default_factory=list)
    tokens_per_row: int = 1  # γ+1 when judging a verify step; 1 for a plain decode step


def _knee_pair(growth: Sequence[float], linear_fraction: float) -> int | None:
    """Index j of the first linear pair (b_j → b_j+1), confirmed by the next pair when there is one.

    A single linear-looking pair followed by flat growth is treated as timing noise.
    """
    linear = [g >= linear_fraction for g in growth]
    for j, is_linear in enumerate(linear):
        if is_linear and (j + 1 == len(linear) or linear[j + 1]):
            return j
    return None


def classify_batch_sweep(
    batch_sizes: Sequence[int],
    step_times_s: Sequence[float],
    serving_batch: int,
    linear_fraction: float = LINEAR_FRACTION,
    tokens_per_row: int = 1,
) -> BatchSweepClassification:
    """Find the knee of a step-time-vs-batch sweep and label the serving batch.

    Rule: the pair b_prev → b is linear when t(b)/t(b_prev) ≥ linear_fraction·(b/b_prev) (default
    0.8). The knee is the first batch reached by a (confirmed) linear pair; when the very first
    pair is already linear, no flat region was seen and the knee is the smallest batch measured.
    A step of serving_batch × tokens_per_row token rows (a verify step: tokens_per_row = γ+1) below
    the knee (or with no knee found) is memory-bound, at or past it compute-bound.
    """
    if len(batch_sizes) != len(step_times_s) or not batch_sizes:
        raise ValueError("batch_sizes and step_times_s must be non-empty and of equal length")
    pairs = sorted(zip((int(b) for b in batch_sizes), (float(t) for t in step_times_s), strict=True))
    bs = [b for b, _ in pairs]
    ts = [t for _, t in pairs]
    if bs[0] < 1 or len(set(bs)) != len(bs):
        raise ValueError("batch sizes must be distinct and >= 1")
    if any(t <= 0 for t in ts):
        raise ValueError("step times must be > 0")
    if serving_batch < 1 or tokens_per_row < 1:
        raise ValueError("serving_batch and tokens_per_row must be >= 1")

    growth = growth_fractions(bs, ts)
    marginal = [ts[0] / bs[0]] + [(ts[i] - ts[i - 1]) / (bs[i] - bs[i - 1]) for i in range(1, len(bs))]
    j = _knee_pair(growth, linear_fraction)
    knee = None if j is None else (bs[0] if j == 0 else bs[j + 1])

    evidence: list[str] = []
    flat_end = len(bs) - 1 if j is None else j
    if flat_end > 0:
        evidence.append(
            f"batch {bs[0]}→{bs[flat_end]}: step time ×{ts[flat_end] / ts[0]:.2f} for ×{bs[flat_end] / bs[0]:g} rows — "
            "extra rows ride on the weight stream (memory-bound)"
        )
    if j is not None:
        evidence.append(
            f"batch {bs[j]}→{bs[j + 1]}: step time ×{ts[j + 1] / ts[j]:.2f} for ×{bs[j + 1] / bs[j]:g} rows "
            f"({growth[j]:.0%} of proportional ≥ {linear_fraction:.0%}) — compute saturated, knee at batch {knee}"
        )
    else:
        evidence.append(f"no linear growth up to batch {bs[-1]} (threshold {linear_fraction:.0%} of proportional)")
    width = serving_batch * tokens_per_row
    label = regime_at_width(width, knee)
    if knee is None and serving_batch > bs[-1]:
        evidence.append(f"serving batch {serving_batch} is beyond the sweep (max {bs[-1]}): extrapolated")
    if tokens_per_row == 1:
        where = (
            f"serving batch {serving_batch} ≥ knee {knee}"
            if label == COMPUTE_BOUND
            else f"serving batch {serving_batch} {'is below the knee' if knee else 'saw no knee'}"
        )
    else:
        rows = f"serving batch {serving_batch} × {tokens_per_row} tokens per verify step (γ+1) = {width} token rows"
        where = (
            f"{rows} ≥ knee {knee}"
            if label == COMPUTE_BOUND
            else f"{rows}, {'below the knee ' + str(knee) if knee else 'no knee seen'}"
        )
    if label == MEMORY_BOUND:
        evidence.append(f"{where}: memory-bound, speculation's extra arithmetic is free")
    else:
        evidence.append(f"{where}: compute-bound, speculation's extra arithmetic is billed")
    return BatchSweepClassification(
        batch_sizes=bs,
        step_times_s=ts,
        marginal_cost_s=marginal,
        per_row_s=[t / b for b, t in zip(bs, ts, strict=True)],
        growth_fraction=[None, *growth],
        knee_batch=knee,
        serving_batch=serving_batch,
        label=label,
        evidence=evidence,
        tokens_per_row=tokens_per_row,
    )


@dataclass
class VerifyCurveClassification:
    """How much a k-token verification costs relative to a 1-token step."""

    k: int
    v_k: float
    billed_fraction: float  # (v(k) − 1)/(k − 1): 0 = free, 1 = fully billed
    label: str  # "free" | "partial" | "billed" | "measurement error" (v(k) outside 1…k: not evidence)
    regime: str  # "memory-bound" | "compute-bound" | "mixed"
    evidence: list[str] = field(default_factory=list)


def classify_verify_curve(verify_cost: Mapping[int, float], k: int = 8) -> VerifyCurveClassification:
    """v(k) near 1 → verification is free (memory-bound); near k → billed (compute-bound).

    Thresholds on the billed fraction (v(k)−1)/(k−1): ≤ 0.25 free, ≥ 0.75 billed, between partial.
    Missing k is interpolated/extrapolated linearly from the measured points (said in the evidence).
    """
    if not verify_cost:
        raise ValueError("verify_cost is empty: measure v(k) for a few k first")
    if k < 2:
        raise ValueError("k must be >= 2")
    v_k = verify_cost_at(verify_cost, k)
    fraction = max((v_k - 1.0) / (k - 1.0), 0.0)
    flag = check_verify_cost(v_k, k)
    if flag is not None:
        return VerifyCurveClassification(k=k, v_k=v_k, billed_fraction=fraction, label=MEASUREMENT_ERROR,
                                         regime=MEASUREMENT_ERROR, evidence=[flag.message])  # fmt: skip
    if fraction <= VERIFY_FREE_FRACTION:
        label, regime = "free", MEMORY_BOUND
    elif fraction >= VERIFY_BILLED_FRACTION:
        label, regime = "billed", COMPUTE_BOUND
    else:
        label, regime = "partial", "mixed"
    source = "measured" if k in {int(x) for x in verify_cost} else "interpolated from measured k"
    evidence = [
        f"v({k}) = {v_k:.2f} ({source}): verifying {k} tokens costs {v_k:.2f} single-token steps, "
        f"{fraction:.0%} of the way from free (1) to fully billed ({k}) → {label}"
    ]
    return VerifyCurveClassification(
        k=k, v_k=v_k, billed_fraction=fraction, label=label, regime=regime, evidence=evidence
    )


@dataclass
class Roofline:
    """Where one decode step sits against the memory and compute roofs."""

    bytes_per_step: float
    flops_per_step: float
    step_time_s: float
    achieved_bandwidth: float  # bytes/s
    achieved_flops: float  # FLOP/s
    bandwidth_fraction: float  # of peak
    flops_fraction: float  # of peak
    arithmetic_intensity: float  # FLOP per byte moved
    ridge_intensity: float  # peak FLOP/s ÷ peak bytes/s: above it a kernel is compute-bound
    closer_to: str  # "memory" | "compute": the roof the step is nearer to
    label: str  # "memory-bound" | "compute-bound" | "measurement error" (a fraction of peak above 100%)
    evidence: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # broken bounds (engine.analysis.bounds): not evidence


MEASUREMENT_ERROR = "measurement error"


def roofline_flags(bandwidth_fraction: float, flops_fraction: float) -> list[str]:
    """Achieved ≤ measured peak for both roofs; one message per broken bound."""
    found = [
        check_fraction_of_peak(bandwidth_fraction, 1.0, "bandwidth"),
        check_fraction_of_peak(flops_fraction, 1.0, "FLOP/s"),
    ]
    return [f.message for f in found if f is not None]


def roofline(
    weight_bytes: float,
    kv_bytes: float,
    flops_per_step: float,
    step_time_s: float,
    peak_bw: float,
    peak_flops: float,
) -> Roofline:
    """Achieved bandwidth and FLOP/s of one step, as fractions of the measured peaks.

    Bytes per step = weights (streamed once per step regardless of batch) + KV cache read. The step
    is labelled by whichever roof it is closer to (the larger fraction of peak) — unless either
    fraction is above 100% of peak, which is impossible: then it is a measurement error (flags),
    labelled as such and takes no side.
    """
    if step_time_s <= 0 or peak_bw <= 0 or peak_flops <= 0:
        raise ValueError("step time and peaks must be > 0")
    moved = float(weight_bytes) + float(kv_bytes)
    bw = moved / step_time_s
    fl = float(flops_per_step) / step_time_s
    bw_frac, fl_frac = bw / peak_bw, fl / peak_flops
    closer = "memory" if bw_frac >= fl_frac else "compute"
    label = MEMORY_BOUND if closer == "memory" else COMPUTE_BOUND
    intensity = flops_per_step / moved if moved > 0 else float("inf")
    ridge = peak_flops / peak_bw
    flags = roofline_flags(bw_frac, fl_frac)
    evidence = [
        f"step moves {moved / 1e9:.3g} GB and does {flops_per_step / 1e9:.3g} GFLOP in {step_time_s * 1e3:.3g} ms: "
        f"{bw_frac:.0%} of peak bandwidth, {fl_frac:.0%} of peak FLOP/s → closer to the {closer} roof",
        f"arithmetic intensity {intensity:.3g} FLOP/B vs ridge {ridge:.3g} FLOP/B",
    ]
    if flags:
        label = MEASUREMENT_ERROR
        evidence = flags + [f"(measurement error, not evidence) {e}" for e in evidence]
    return Roofline(
        bytes_per_step=moved,
        flops_per_step=float(flops_per_step),
        step_time_s=float(step_time_s),
        achieved_bandwidth=bw,
        achieved_flops=fl,
        bandwidth_fraction=bw_frac,
        flops_fraction=fl_frac,
        arithmetic_intensity=intensity,
        ridge_intensity=ridge,
        closer_to=closer,
        label=label,
        evidence=evidence,
        flags=flags,
    )


@dataclass
class RegimeReport:
    """One verdict with the evidence behind it."""

    label: str  # "memory-bound" | "compute-bound" | "unknown"
    evidence: list[str]
    votes: dict[str, str]  # source -> what it said
    agree: bool  # every source that took a side took the same side
    # filled by judge_regime: where the verdict was made and what it rests on
    batch_size: int | None = None
    gamma: int = 0
    knee_batch: int | None = None
    source: str = ""  # one sentence: where the label came from
    override: str | None = None
    sweep: BatchSweepClassification | None = None
    verify: VerifyCurveClassification | None = None
    roof: Roofline | None = None
    flags: list[str] = field(default_factory=list)  # measurements that broke a physical bound

    @property
    def width(self) -> int | None:
        """Token rows one verify step processes: batch × (γ+1)."""
        return None if self.batch_size is None else self.batch_size * (self.gamma + 1)


_WEIGHTS = {"batch sweep": 3.0, "verify curve": 2.0, "roofline": 1.0}
_SIDES = (MEMORY_BOUND, COMPUTE_BOUND)


def votes_agree(votes: Mapping[str, str]) -> bool:
    """Every source that took a side took the same side ("mixed", "measurement error" take none)."""
    return len({v for v in votes.values() if v in _SIDES}) <= 1


def _combine(votes: Mapping[str, str], evidence: list[str]) -> tuple[str, bool]:
    """Weighted vote (3 / 2 / 1), ties to the higher-weighted source; appends the verdict's own lines."""
    scores = {MEMORY_BOUND: 0.0, COMPUTE_BOUND: 0.0}
    first_side: str | None = None
    for source in ("batch sweep", "verify curve", "roofline"):
        side = votes.get(source)
        if side in scores:
            scores[side] += _WEIGHTS[source]
            first_side = first_side or side
    if first_side is None:
        label = "unknown"
        evidence.append("no decisive evidence: run a batch sweep at the serving batch or measure v(k)")
    elif scores[MEMORY_BOUND] == scores[COMPUTE_BOUND]:
        label = first_side
    else:
        label = max(scores, key=lambda s: scores[s])
    agree = votes_agree(votes)
    if not agree:
        said = ", ".join(f"{k}: {v}" for k, v in votes.items())
        evidence.append(f"sources disagree ({said}); weighted vote → {label}")
    return label, agree


def regime_report(
    sweep: BatchSweepClassification | None = None,
    verify: VerifyCurveClassification | None = None,
    roof: Roofline | None = None,
) -> RegimeReport:
    """Combine the evidence: the batch sweep at the serving batch weighs most, then v(k), then the roofline.

    Weighted vote (3 / 2 / 1); ties go to the higher-weighted source. "mixed" verify curves and a
    roofline flagged as a measurement error take no side. With no evidence the label is "unknown"
    — do not guess.

    NVML's "GPU utilisation" is deliberately not an input: it is the share of time *any* kernel was
    running, so a batch-1 decode that streams weights and leaves the tensor cores idle reads ~100%.
    It says nothing about whether you are memory- or compute-bound.
    """
    votes: dict[str, str] = {}
    evidence: list[str] = []
    if sweep is not None:
        votes["batch sweep"] = sweep.label
        evidence += [f"batch sweep: {e}" for e in sweep.evidence]
    if verify is not None:
        votes["verify curve"] = verify.regime
        evidence += [f"verify curve: {e}" for e in verify.evidence]
    if roof is not None:
        votes["roofline"] = roof.label
        evidence += [f"roofline: {e}" for e in roof.evidence]
    label, agree = _combine(votes, evidence)
    return RegimeReport(
        label=label, evidence=evidence, votes=votes, agree=agree, sweep=sweep, verify=verify, roof=roof,
        flags=list(roof.flags) if roof is not None else [],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- stored evidence


def stored_sweep(regime: Mapping[str, Any] | None) -> tuple[list[int], list[float]] | None:
    """The raw batch sweep of a regime record (batch sizes, step times in s, sorted) when usable, else None."""
    if not isinstance(regime, Mapping):
        return None
    sweep = regime.get("batch_sweep")
    if not isinstance(sweep, Mapping):
        return None
    try:
        bs = [int(b) for b in sweep.get("batch_sizes") or []]
        ts = [float(t) for t in sweep.get("step_times_s") or []]
    except (TypeError, ValueError):
        return None
    if not bs or len(bs) != len(ts) or len(set(bs)) != len(bs) or any(b < 1 for b in bs):
        return None
    if any(not (t > 0) for t in ts):
        return None
    pairs = sorted(zip(bs, ts, strict=True))
    return [b for b, _ in pairs], [t for _, t in pairs]


def stored_knee(regime: Mapping[str, Any] | None) -> int | None:
    """The knee a regime record stored (used only when its raw timings are not there to re-judge)."""
    if not isinstance(regime, Mapping):
        return None
    classification = regime.get("batch_classification")
    knee = classification.get("knee_batch") if isinstance(classification, Mapping) else None
    try:
        return None if knee is None else int(knee)
    except (TypeError, ValueError):
        return None


def stored_verify(regime: Mapping[str, Any] | None) -> dict[int, float]:
    """v(k) points of a regime record: its raw table, else the one point its verify classification kept."""
    if not isinstance(regime, Mapping):
        return {}
    try:
        points = measured_verify_points(regime.get("verify_cost") or {})
        if points:
            return points
        cls = regime.get("verify_classification")
        if isinstance(cls, Mapping) and cls.get("k") is not None and cls.get("v_k") is not None:
            return measured_verify_points({int(cls["k"]): float(cls["v_k"])})
    except (TypeError, ValueError, AttributeError):
        return {}
    return {}


def stored_roofline(regime: Mapping[str, Any] | None) -> Roofline | None:
    """The roofline of a regime record, re-checked against its bounds (old records were never checked)."""
    raw = regime.get("roofline") if isinstance(regime, Mapping) else None
    if not isinstance(raw, Mapping):
        return None
    names = {f.name for f in fields(Roofline)}
    try:
        roof = Roofline(**{k: v for k, v in raw.items() if k in names})
        bw, fl = float(roof.bandwidth_fraction), float(roof.flops_fraction)
    except (TypeError, ValueError):
        return None
    flags = roofline_flags(bw, fl)
    if flags and not roof.flags:
        roof.flags = flags
        roof.label = MEASUREMENT_ERROR
        roof.evidence = flags + [f"(measurement error, not evidence) {e}" for e in roof.evidence or []]
    return roof


_REJUDGED = ("batch sweep", "verify curve", "roofline", "sources disagree", "no decisive evidence")


def _source_sentence(
    override: str | None, knee: int | None, batch: int, gamma: int, label: str, stored: bool, votes: Mapping[str, str]
) -> str:
    if override:
        return f"Set by hand to {override} (the measured evidence is shown below for reference)."
    if knee is not None:
        width = batch * (gamma + 1)
        side = "at or past" if width >= knee else "below"
        if gamma == 0:
            return f"From the stored batch sweep: serving batch {batch} is {side} the knee at batch {knee}."
        return (
            f"From the stored batch sweep: a verify step at serving batch {batch} with γ = {gamma} processes "
            f"{batch} × {gamma + 1} = {width} token rows, {side} the knee at batch {knee}."
        )
    if label in _SIDES:
        sources = [source for source, side in votes.items() if side == label]
        if sources:
            return f"From the {' and the '.join(sources)} measured in the chosen sessions."
        return "From the stored regime evidence of the chosen sessions."
    if votes:
        return f"The evidence of these sessions does not decide the regime ({label}): memory-bound is assumed."
    return "No decisive regime evidence is stored for these sessions: the regime is unknown (assumed memory-bound)."


def judge_regime(
    evidence: Mapping[str, Any] | None,
    batch_size: int,
    gamma: int = 0,
    verify_cost: Mapping[int, float] | None = None,
    override: str | None = None,
) -> RegimeReport:
    """The regime at a serving batch, from a regime record: the one judgement the worker, CLI and page share.

    `evidence` is a regime record as the worker stores it (raw batch sweep, roofline, serving batch,
    evidence lines, votes) or None. The batch sweep is re-judged at `batch_size`: a verify step with
    γ draft tokens processes batch·(γ+1) token rows, and that width is what is compared with the
    knee. v(k) (`verify_cost`, else the record's own) and the roofline (only when it was measured
    at this batch, and only when within its physical bounds) vote as in regime_report. With nothing
    to re-judge, the record's stored label and votes stand. `override` ("memory-bound" |
    "compute-bound") replaces the label; the evidence is kept for reference. The label is
    "unknown" when nothing decides — never silently memory-bound.
    """
    if batch_size < 1 or gamma < 0:
        raise ValueError("batch_size must be >= 1 and gamma >= 0")
    if override is not None and override not in REGIMES:
        raise ValueError(f"override must be one of {REGIMES}, got {override!r}")
    record: Mapping[str, Any] = evidence if isinstance(evidence, Mapping) else {}
    lines: list[str] = []
    if override:
        lines.append(f"regime set by hand to {override}; the measured evidence follows for reference")
    votes: dict[str, str] = {}

    sweep_cls = None
    raw = stored_sweep(record)
    knee = stored_knee(record)
    if raw is not None:
        sweep_cls = classify_batch_sweep(raw[0], raw[1], batch_size, tokens_per_row=gamma + 1)
        knee = sweep_cls.knee_batch
        votes["batch sweep"] = sweep_cls.label
        lines += [f"batch sweep (judged at batch {batch_size}): {e}" for e in sweep_cls.evidence]
    elif knee is not None:
        votes["batch sweep"] = regime_at_width(batch_size * (gamma + 1), knee)
        lines.append(
            f"batch sweep (only its knee, batch {knee}, is stored): {batch_size} × {gamma + 1} token rows per step → "
            f"{votes['batch sweep']}"
        )

    verify_cls = None
    table = measured_verify_points(verify_cost) or stored_verify(record)
    if table:
        verify_cls = classify_verify_curve(table, k=8 if max(table) >= 8 else max(table))
        votes["verify curve"] = verify_cls.regime
        lines += [f"verify curve: {e}" for e in verify_cls.evidence]
    else:
        lines.append("verify curve: no v(k) measured (only v(1) = 1), so the cost of verification is not evidence here")

    roof = stored_roofline(record)
    flags = list(roof.flags) if roof is not None else []
    served = record.get("serving_batch")
    if roof is not None:
        if served is None or int(served) == batch_size:
            votes["roofline"] = roof.label
            lines += [f"roofline: {e}" for e in roof.evidence]
        else:
            lines += [f"roofline (measured at batch {served}, reference only at batch {batch_size}): {e}"
                      for e in roof.evidence]  # fmt: skip

    stored_lines = [str(e) for e in record.get("evidence") or []]
    stored_votes = record.get("votes") if isinstance(record.get("votes"), Mapping) else {}
    stored_label: str | None = None
    if not votes and (record.get("label") in _SIDES or stored_votes):
        # nothing to re-judge: the verdict stored with the session stands (judged at its serving batch)
        votes = {str(k): str(v) for k, v in stored_votes.items()}
        stored_label = None if votes else str(record["label"])
        keep = stored_lines
    else:
        keep = [e for e in stored_lines if not e.startswith(_REJUDGED)]
    if keep:
        where = f" (serving batch {served})" if served is not None else ""
        lines += [f"stored with the session{where}: {e}" for e in keep]

    label, agree = (stored_label, True) if stored_label else _combine(votes, lines)
    if override:
        label = override
    return RegimeReport(
        label=label,
        evidence=lines,
        votes=votes,
        agree=agree,
        batch_size=batch_size,
        gamma=gamma,
        knee_batch=knee,
        source=_source_sentence(override, knee, batch_size, gamma, label, bool(record), votes),
        override=override,
        sweep=sweep_cls,
        verify=verify_cls,
        roof=roof,
        flags=flags,
    )
