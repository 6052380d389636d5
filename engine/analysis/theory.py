"""The speculative-decoding arithmetic from Leviathan et al. (2023), as pure functions.

Why a module of its own: every number the dashboard shows (latency multiple, arithmetic bill,
crossover γ, cost per token) must come from one place, so that the UI, the recommender and the
tests cannot disagree. Symbols follow the paper:

* α — probability that the target accepts a draft token (the single-α model), or a list of
  per-position *conditional* acceptance rates a_1, a_2, … (the positional model: a_i is the chance
  that draft token i is accepted given tokens 1..i-1 were);
* γ — draft tokens proposed per target call;
* c — wall time of one draft forward relative to one target forward (memory-bound world);
* ĉ — arithmetic of one draft forward relative to one target forward (compute-bound world);
* v(k) — wall time of a k-token target forward relative to a 1-token one (v(1) = 1). The paper
  assumes v(γ+1) = 1, i.e. verification is free because the step is memory-bound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Regime = str  # "memory-bound" | "compute-bound"
VerifyCost = Callable[[int], float] | Mapping[int, float] | None

MEMORY_BOUND = "memory-bound"
COMPUTE_BOUND = "compute-bound"
REGIMES = (MEMORY_BOUND, COMPUTE_BOUND)

_ALPHA_ONE_EPS = 1e-12


def _check(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 − α^(γ+1)) / (1 − α); γ+1 at α = 1 (every guess accepted)."""
    _check(alpha, gamma)
    if alpha >= 1.0 - _ALPHA_ONE_EPS:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the latency multiple, verification assumed free."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def operations_multiplier(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
    """Theorem 3.11: (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1)); the arithmetic bill relative to no speculation.

    Equivalently (γĉ + γ + 1) / E[tokens per call]: you always pay for γ+1 target positions (plus γ
    draft forwards) but only get E tokens back.
    """
    return (gamma * c_hat + gamma + 1.0) / expected_tokens_per_call(alpha, gamma)


def _acceptance_at(acceptance: Sequence[float], i: int) -> float:
    """a_i for draft position i (1-based); positions past the list reuse the last measured value."""
    return float(acceptance[min(i, len(acceptance)) - 1])


def expected_tokens_per_call_positional(acceptance: Sequence[float], gamma: int) -> float:
    """1 + Σ_{i=1..γ} Π_{j≤i} a_j: the positional model, because acceptance usually decays with depth.

    acceptance[i] is the conditional acceptance rate at draft position i+1. An empty list means
    nothing was measured, which returns 0 (no prediction), not 1.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if not acceptance:
        return 0.0
    for a in acceptance:
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"acceptance rates must be in [0, 1], got {a}")
    total, run = 1.0, 1.0
    for i in range(1, gamma + 1):
        run *= _acceptance_at(acceptance, i)
        total += run
    return total


def measured_verify_points(verify_cost: Mapping[int, float] | None) -> dict[int, float]:
    """The measured v(k) points with k ≥ 2 (v(1) = 1 is the unit, not a measurement); empty when none."""
    return {int(k): float(v) for k, v in (verify_cost or {}).items() if int(k) >= 2}


def largest_measured_k(verify_cost: Mapping[int, float] | None) -> int | None:
    """The largest k with a measured v(k) (k ≥ 2), None when v(k) was not measured at all."""
    points = measured_verify_points(verify_cost)
    return max(points) if points else None


def _pooled_blocks(points: Sequence[tuple[int, float]]) -> list[tuple[list[int], float]]:
    """Pool adjacent violators (ties pooled too): blocks of k with one strictly increasing value each."""
    blocks: list[tuple[list[int], float]] = []
    for k, v in points:
        ks, value = [k], v
        while blocks and blocks[-1][1] >= value:
            prev_ks, prev_value = blocks.pop()
            value = (prev_value * len(prev_ks) + value * len(ks)) / (len(prev_ks) + len(ks))
            ks = prev_ks + ks
        blocks.append((ks, value))
    return blocks


@dataclass(frozen=True)
class VerifyFit:
    """v(k) fitted monotone non-decreasing from k = 2, at most k, with v(1) = 1 (fit_verify_cost).

    `values` holds the fitted value at every measured k; beyond the largest measured k the fit is
    extended linearly with `slope` (0 ≤ slope ≤ 1: the line through the last two pooled blocks'
    centroids), so one noisy point can neither bend the extrapolation downwards, make verification
    free, nor make a k-token forward dearer than k one-token ones (v(k) ≤ k everywhere).
    """

    values: dict[int, float]
    slope: float

    @property
    def largest_k(self) -> int:
        return max(self.values)

    def at(self, k: float) -> float:
        """v(k), linear between measured k (a fractional k too: a run's mean width), capped at k."""
        return min(self._line(k), float(k))

    def floor(self, widest: int) -> float:
        """The cheapest verify of at most `widest` tokens, in one-token forwards (1 unless a k-token forward
        measured cheaper): what a measured or predicted speedup's bound divides by."""
        return min([1.0] + [self.at(k) for k in range(2, int(widest) + 1)])

    def extrapolated(self, k: int) -> bool:
        """Is v(k) beyond the largest measured k (a line, not a measurement)?"""
        return k > self.largest_k

    def _line(self, k: float) -> float:
        if k in self.values:
            return self.values[k]
        ks = sorted(self.values)
        if k > ks[-1]:
            return self.values[ks[-1]] + self.slope * (k - ks[-1])
        hi = next(x for x in ks if x > k)
        lo = max(x for x in ks if x < k)
        return self.values[lo] + (self.values[hi] - self.values[lo]) * (k - lo) / (hi - lo)


# the cheapest a k-token forward (k ≥ 2) may measure against a one-token one: in bfloat16 on a CPU with AVX-512 BF16
# a 2–5-token forward of the bundled 1.5B took 0.94 of a one-token one (its one-token kernel is the slower path)
VERIFY_FLOOR = 0.8


def fit_verify_cost(verify_cost: Mapping[int, float] | None) -> VerifyFit:
    """Isotonic (pool-adjacent-violators) fit of measured v(k): monotone non-decreasing from k = 2, v(k) ≤ k,
    v(1) = 1.

    A k-token forward is not cheaper than a shorter one of k ≥ 2, so a dip is timing noise: it is pooled with its
    neighbours instead of being extrapolated. It can be cheaper than the one-token forward, where that is the
    slower kernel (engine.measure.verify_cost keeps a v(k) < 1 only when every interleaved round measured it): then
    the fit starts at k = 2, no lower than VERIFY_FLOOR; otherwise it starts at (1, 1) and never dips below 1.
    """
    measured = sorted(measured_verify_points(verify_cost).items())
    below_one = any(v < 1.0 for _, v in measured)
    floor = VERIFY_FLOOR if below_one else 1.0
    points = ([] if below_one else [(1, 1.0)]) + [(k, min(max(v, floor), float(k))) for k, v in measured]
    blocks = _pooled_blocks(points)
    values = {k: value for ks, value in blocks for k in ks}
    values[1] = 1.0
    slope = 0.0
    if len(blocks) >= 2:
        (ks0, v0), (ks1, v1) = blocks[-2], blocks[-1]
        c0, c1 = sum(ks0) / len(ks0), sum(ks1) / len(ks1)
        slope = min(max((v1 - v0) / (c1 - c0), 0.0), 1.0)
    return VerifyFit(values=values, slope=slope)


def verify_cost_at(verify_cost: VerifyCost, k: int) -> float:
    """v(k) from a callable, a measured table, or None (free verification: v ≡ 1).

    A table is fitted monotone non-decreasing from k = 2 (fit_verify_cost), interpolated
    linearly between measured k and extended linearly (slope ≥ 0) beyond the largest measured k,
    because measured sessions rarely cover every γ+1. v(1) = 1 by definition.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if verify_cost is None:
        return 1.0
    if callable(verify_cost) and not isinstance(verify_cost, Mapping):
        return float(verify_cost(k))
    return fit_verify_cost(verify_cost).at(k)


def speedup_positional(acceptance: Sequence[float], gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """E_positional / (γc + v(γ+1)): Theorem 3.8 generalised to decaying acceptance and non-free verification.

    `verify_cost` is v(γ+1) itself (a number). With a constant acceptance list and v = 1 this is
    exactly Theorem 3.8.
    """
    return expected_tokens_per_call_positional(acceptance, gamma) / (gamma * c + verify_cost)


def operations_multiplier_positional(acceptance: Sequence[float], gamma: int, c_hat: float = 0.0) -> float:
    """(γĉ + γ + 1) / E_positional: the arithmetic bill with per-position acceptance."""
    expected = expected_tokens_per_call_positional(acceptance, gamma)
    if expected <= 0.0:
        return float("inf")
    return (gamma * c_hat + gamma + 1.0) / expected


def crossover_gamma(alpha: float, c: float = 0.0, c_hat: float = 0.0, max_gamma: int = 32) -> int | None:
    """Smallest γ ≥ 1 where the arithmetic multiplier exceeds the latency multiplier; None if none ≤ max_gamma.

    In a compute-bound deployment this is the configuration limit: past it you burn arithmetic
    faster than you gain time.
    """
    for gamma in range(1, max_gamma + 1):
        if operations_multiplier(alpha, gamma, c_hat) > walltime_improvement(alpha, gamma, c):
            return gamma
    return None


def crossover_gamma_positional(
    acceptance: Sequence[float],
    c: float = 0.0,
    c_hat: float = 0.0,
    verify_cost: VerifyCost = None,
    max_gamma: int = 32,
) -> int | None:
    """The crossover with per-position acceptance and a measured v(k) (callable or {k: v(k)} table)."""
    if not acceptance:
        return None
    for gamma in range(1, max_gamma + 1):
        v = verify_cost_at(verify_cost, gamma + 1)
        ops = operations_multiplier_positional(acceptance, gamma, c_hat)
        if ops > speedup_positional(acceptance, gamma, c, v):
            return gamma
    return None


def cost_per_token_multiplier(speedup: float, ops_multiplier: float, regime: Regime) -> float:
    """What cost per token is multiplied by: 1/speedup when memory-bound, the ops multiplier when compute-bound.

    Memory-bound: the extra arithmetic runs in idle capacity you already rent, so finishing sooner
    means more tokens per rented hour. Compute-bound: the extra arithmetic displaces real work, so
    throughput per accelerator falls by the ops multiplier at an unchanged hourly rate.
    """
    if regime == MEMORY_BOUND:
        return 1.0 / speedup
    if regime == COMPUTE_BOUND:
        return ops_multiplier
    raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")


def cost_per_token_change(alpha: float, gamma: int, regime: Regime, c: float = 0.0, c_hat: float = 0.0) -> float:
    """Fractional change in cost per token (2.25 means +225%, −0.59 means 59% cheaper) under the regime."""
    multiplier = cost_per_token_multiplier(
        walltime_improvement(alpha, gamma, c), operations_multiplier(alpha, gamma, c_hat), regime
    )
    return multiplier - 1.0


def alpha_from_mean_accepted(mean_tokens_per_call: float, gamma: int, tol: float = 1e-10) -> float:
    """Invert E(α) = (1 − α^(γ+1))/(1 − α) by bisection, to read a single α off a measured mean.

    `mean_tokens_per_call` is tokens emitted per target call (accepted draft tokens + 1), which is
    what a run log gives directly. E is increasing in α from 1 (α=0) to γ+1 (α=1), so values at
    or beyond those ends clamp to 0 and 1.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1 to identify alpha, got {gamma}")
    if mean_tokens_per_call <= 1.0:
        return 0.0
    if mean_tokens_per_call >= gamma + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        if expected_tokens_per_call(mid, gamma) < mean_tokens_per_call:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
