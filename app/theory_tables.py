"""The Theory page's tables, recomputed from engine.analysis.theory so the page and the paper can never disagree."""

from __future__ import annotations

import pandas as pd

from engine.service.api import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    cost_per_token_multiplier,
    crossover_gamma,
    expected_tokens_per_call,
    operations_multiplier,
    walltime_improvement,
)

SOURCE = 'Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023'
ALPHA_GAMMA_ROWS = [(0.6, 3), (0.6, 7), (0.75, 7), (0.8, 7), (0.9, 3), (0.9, 7)]
COST_ROWS = [(0.6, 7), (0.75, 7), (0.9, 7)]
CROSSOVER_ALPHAS = [0.5, 0.6, 0.7, 0.8, 0.9]
# The paper's three drafts for T5-XXL at γ=7: (name, α, c, measured speedup reported in the paper)
PARADOX_ROWS = [("T5-small", 0.75, 0.02, 3.4), ("T5-base", 0.80, 0.04, 2.8), ("T5-large", 0.82, 0.11, 1.7)]
MAX_GAMMA = 32


def point(alpha: float, gamma: int, c: float, c_hat: float) -> dict[str, float]:
    """Every number the Theory page shows for one (α, γ, c, ĉ)."""
    speed = walltime_improvement(alpha, gamma, c)
    ops = operations_multiplier(alpha, gamma, c_hat)
    return {
        "expected tokens per call": expected_tokens_per_call(alpha, gamma),
        "speedup": speed,
        "ops multiplier": ops,
        "cost memory-bound": cost_per_token_multiplier(speed, ops, MEMORY_BOUND),
        "cost compute-bound": cost_per_token_multiplier(speed, ops, COMPUTE_BOUND),
    }


def pct_change(multiplier: float) -> str:
    change = multiplier - 1.0
    return f"{change:+.0%}"


def alpha_gamma_table(c: float = 0.0, c_hat: float = 0.0) -> pd.DataFrame:
    rows = []
    for alpha, gamma in ALPHA_GAMMA_ROWS:
        p = point(alpha, gamma, c, c_hat)
        rows.append(
            {
                "α": alpha,
                "γ": gamma,
                "Latency": f"{p['speedup']:.2f}× faster",
                "Arithmetic": f"{p['ops multiplier']:.2f}× more",
            }
        )
    return pd.DataFrame(rows)


def cost_table(c: float = 0.0, c_hat: float = 0.0) -> pd.DataFrame:
    rows = []
    for alpha, gamma in COST_ROWS:
        p = point(alpha, gamma, c, c_hat)
        rows.append(
            {
                "α": alpha,
                "γ": gamma,
                "Latency": f"{p['speedup']:.2f}× faster",
                "compute-bound": pct_change(p["cost compute-bound"]),
                "memory-bound": pct_change(p["cost memory-bound"]),
            }
        )
    return pd.DataFrame(rows)


def crossover_table(c: float = 0.0, c_hat: float = 0.0, max_gamma: int = MAX_GAMMA) -> pd.DataFrame:
    rows = []
    for alpha in CROSSOVER_ALPHAS:
        cross = crossover_gamma(alpha, c, c_hat, max_gamma)
        if cross is None:
            rows.append({"α": alpha, "Crossover": f"none below γ={max_gamma}", "Just before it": "—"})
            continue
        before = "—"
        if cross > 1:
            g = cross - 1
            before = (
                f"γ={g}: {walltime_improvement(alpha, g, c):.2f}× speed, "
                f"{operations_multiplier(alpha, g, c_hat):.2f}× ops"
            )
        rows.append({"α": alpha, "Crossover": f"γ={cross}", "Just before it": before})
    return pd.DataFrame(rows)


def paradox_table(gamma: int = 7) -> pd.DataFrame:
    rows = []
    for name, alpha, c, measured in PARADOX_ROWS:
        rows.append(
            {
                "Draft model": name,
                "α": alpha,
                "c": c,
                "Predicted (Thm 3.8)": f"{walltime_improvement(alpha, gamma, c):.2f}×",
                "Measured (paper)": f"{measured:.1f}×",
            }
        )
    return pd.DataFrame(rows)


def curve(alpha: float, c: float, c_hat: float, max_gamma: int = MAX_GAMMA) -> pd.DataFrame:
    rows = []
    for g in range(1, max_gamma + 1):
        rows.append(
            {
                "γ": g,
                "speedup": walltime_improvement(alpha, g, c),
                "ops multiplier": operations_multiplier(alpha, g, c_hat),
            }
        )
    return pd.DataFrame(rows)
