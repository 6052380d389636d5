"""The concurrency surface without Streamlit: a batching engine's speedup per γ and requests in flight."""

from __future__ import annotations

from typing import Any

import pandas as pd

from app import data
from engine.service.api import (
    Surface,
)

SURFACE_TEXT = (
    "Measured, not predicted: each configuration at each concurrency level (requests in flight) against the target "
    "alone at the same level, measured side by side. A cell at or below 1.00× (red) is where speculation stops "
    "paying; ⚠ marks a speedup too noisy to tell (its per-prompt speedups straddle 1× or spread widely)."
)

NOISY_MARK = "⚠ noisy"

IMPOSSIBLE_MARK = "⚠ impossible"  # the run's stored bound verdict: a measurement error, never a result

IMPOSSIBLE_STYLE = "color: #888888; text-decoration: line-through"

LOSES = "background-color: rgba(214, 39, 40, 0.18)"

FLIP = "background-color: rgba(214, 39, 40, 0.35); font-weight: bold"


def level_column(level: int) -> str:
    return f"×{int(level)} in flight"


def gamma_text(gamma: int) -> str:
    """A fixed γ, or 'policy' for a run whose γ varies step by step (stored as γ 0)."""
    return str(int(gamma)) if gamma else "policy"


def surface_label(surface: Surface) -> str:
    """One session in the surface picker."""
    return f"#{surface.session_id} {surface.name} (concurrency {', '.join(map(str, surface.levels))})"


def surface_table(surface: Surface) -> pd.DataFrame:
    """One row per configuration and γ, one column per measured concurrency (the speedup, ⚠ when noisy), and
    where it stops paying."""
    stops = {(s.configuration, s.gamma): s for s in surface.stops}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for cell in surface.cells:
        row = rows.setdefault(
            (cell.configuration, cell.gamma), {"configuration": cell.configuration, "γ": gamma_text(cell.gamma)}
        )
        mark = f" {IMPOSSIBLE_MARK}" if cell.flag else f" {NOISY_MARK}" if cell.noisy else ""
        row[level_column(cell.concurrency)] = f"{cell.speedup:.2f}×{mark}"
    for key, row in rows.items():
        stop = stops[key]
        row["stops paying at"] = "pays at every level" if stop.at is None else f"concurrency {stop.at}"
    columns = ["configuration", "γ", *(level_column(n) for n in surface.levels), "stops paying at"]
    return pd.DataFrame(list(rows.values()), columns=columns)


def styled_surface(table: pd.DataFrame, surface: Surface) -> Any:
    """The surface table styled: cells that do not pay in red, the one where each row stops paying darker, an
    impossible one grey and struck through."""
    cells = {(c.configuration, gamma_text(c.gamma), level_column(c.concurrency)): c for c in surface.cells}
    flips = {(s.configuration, gamma_text(s.gamma)): s.at for s in surface.stops}

    def _style(row: Any) -> list[str]:
        key = (row["configuration"], row["γ"])
        out = []
        for column in row.index:
            cell = cells.get((*key, column))
            if cell is not None and cell.flag:
                out.append(IMPOSSIBLE_STYLE)
            elif cell is None or cell.pays:
                out.append("")
            else:
                out.append(FLIP if column == level_column(flips.get(key) or 0) else LOSES)
        return out

    return table.style.apply(_style, axis=1)


def surface_chart_frame(surface: Surface) -> pd.DataFrame:
    """Long form for app.charts.concurrency_surface (data.surface_frame of its cells)."""
    return data.surface_frame(surface.cells)
