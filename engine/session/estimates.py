"""How long the slow phases of a session take, estimated from one decode step's seconds on this machine."""

from __future__ import annotations

BATCH_SWEEP_COMPILES = 2  # the compiled loop's batch sweep compiles one row, then one step for every other batch


def batch_sweep_eta_s(step_s: float | None, serving_batch: int = 1, compile_each_s: float = 0.0) -> float | None:
    """About how long regime detection's batch sweep takes, from one single-token decode step's seconds on
    this machine (None when unknown): each batch size b prefills 32·b tokens and times 3 steps, which on the
    machines measured so far came to roughly (4 + 1.5·b) steps per size, over the sizes the regime evidence
    uses (1…64, the serving batch and twice it). An upper bound: the sweep stops once growth is linear. In the
    compiled loop its steps compile first: BATCH_SWEEP_COMPILES × `compile_each_s` (what one width took)."""
    if not step_s or step_s <= 0:
        return None
    sizes = {1, 2, 4, 8, 16, 32, 64, serving_batch, serving_batch * 2}
    return step_s * sum(4 + 1.5 * b for b in sizes) + BATCH_SWEEP_COMPILES * max(compile_each_s, 0.0)


def compile_each_s(compile_s: float | None, widths: int, models: int) -> float:
    """What compiling one width of one model took a session (its loop's compile time over what it compiled); 0 when
    it compiled nothing."""
    return float(compile_s or 0.0) / max(1, widths * models)


def verify_cost_eta_s(step_s: float | None, max_gamma: int, reps: int = 5) -> float | None:
    """About how long the v(k) measurement takes: k-token forwards for k = 1, 2, 4, … γ+1, ``reps`` each
    (after a warm-up), each costing at most k single steps (at least one)."""
    if not step_s or step_s <= 0:
        return None
    ks = {k for k in (1, 2, 4, 8, 16) if k <= max_gamma + 1} | {1, max_gamma + 1}
    return step_s * (reps + 1) * sum(max(1.0, k / 4) for k in ks)
