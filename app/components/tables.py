"""Tables as every page draws them: numbers formatted per column, the index hidden, reference tables folded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import streamlit as st

MISSING = "—"


def table(
    frame: Any,
    *,
    numbers: Mapping[str, str] | None = None,
    dates: Sequence[str] = (),
    helps: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    widths: Mapping[str, Literal["small", "medium", "large"] | int] | None = None,
    **kwargs: Any,
) -> None:
    """A table without the index, full width, missing values shown as "—" (never a literal None).

    ``numbers`` maps columns to a printf format ("%.2f×"), ``dates`` lists datetime columns and
    ``helps`` gives column tooltips; ``labels`` shows a column under a shorter header than its name and
    ``widths`` caps a column's width (a long text column would push the others out of view).
    """
    helps, labels, widths = helps or {}, labels or {}, widths or {}
    config: dict[str, Any] = {}
    for column, fmt in (numbers or {}).items():
        config[column] = st.column_config.NumberColumn(
            labels.get(column), format=fmt, help=helps.get(column), width=widths.get(column)
        )
    for column in dates:
        config[column] = st.column_config.DatetimeColumn(
            labels.get(column), format="YYYY-MM-DD HH:mm", help=helps.get(column), width=widths.get(column)
        )
    for column in {**helps, **labels, **widths}:
        config.setdefault(
            column, st.column_config.Column(labels.get(column), help=helps.get(column), width=widths.get(column))
        )
    st.dataframe(frame, hide_index=True, width="stretch", placeholder=MISSING, column_config=config or None, **kwargs)


def reference_table(frame: Any) -> None:
    """A small table that never changes shape (the paper's tables on the Theory page) as static text: no grid to
    draw, sort or scroll."""
    st.table(frame.astype(str), hide_index=True)
