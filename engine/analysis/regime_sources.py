"""The three kinds of regime evidence, each judged on its own: a batch sweep, the verify curve v(k), a roofline.

Pure functions on numbers, so recorded measurements can be re-judged; engine.analysis.regime combines their votes
into one verdict (regime_report, judge_regime)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.analysis.bounds import check_fraction_of_peak, check_verify_cost
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, verify_cost_at
from engine.measure.microbench import LINEAR_FRACTION, growth_fractions

# v(k) judged at k = 8 by default: (v(k) - 1)/(k - 1) <= 0.25 → free, >= 0.75 → billed, else partial.
VERIFY_FREE_FRACTION = 0.25
VERIFY_BILLED_FRACTION = 0.75

MEASUREMENT_ERROR = "measurement error"
OVERHEAD_BOUND = "overhead-bound"  # a step far below both roofs: neither regime (launch, Python, scheduling)
ABSTAIN_FRACTION = 0.05  # the roofline takes no side when the step reaches less than this of both peaks
NON_MONOTONE_SLACK = 0.05  # a step time 5% below the previous batch's is timing noise


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


def _caveats(bs: Sequence[int], ts: Sequence[float], width: int, knee: int | None) -> list[str]:
    """What the sweep cannot tell: step times that fall between batches (noise), a width past the sweep."""
    said = [
        f"batch {bs[i - 1]}→{bs[i]}: step time fell ({ts[i - 1] * 1e3:.3g} → {ts[i] * 1e3:.3g} ms) — non-monotone, "
        "timing noise: treat this sweep with care"
        for i in range(1, len(bs))
        if ts[i] < ts[i - 1] * (1.0 - NON_MONOTONE_SLACK)
    ]
    if knee is None and width > bs[-1]:
        said.append(
            f"{width} token rows per step is beyond the sweep (largest batch {bs[-1]}): the regime there is "
            "extrapolated — sweep to that batch to know"
        )
    return said


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
    evidence += _caveats(bs, ts, width, knee)
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
    raw = {int(key): float(v) for key, v in verify_cost.items()}
    v_k = raw[k] if k in raw else verify_cost_at(verify_cost, k)  # the measurement itself, before the fit caps it
    fraction = max((v_k - 1.0) / (k - 1.0), 0.0)
    flag = check_verify_cost(v_k, k)
    if flag is not None:
        return VerifyCurveClassification(
            k=k,
            v_k=v_k,
            billed_fraction=fraction,
            label=MEASUREMENT_ERROR,
            regime=MEASUREMENT_ERROR,
            evidence=[flag.message],
        )
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
    elif bw_frac < ABSTAIN_FRACTION and fl_frac < ABSTAIN_FRACTION:
        label = OVERHEAD_BOUND
        evidence.append(
            f"both below {ABSTAIN_FRACTION:.0%} of peak: the step is overhead-bound (neither regime), so the roofline "
            "takes no side"
        )
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
