"""Plain JSON-ready values from dataclasses, tuples and dicts with non-string keys."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any


def jsonable(value: Any) -> Any:
    """`value` with dataclasses as dicts, tuples as lists and every dict key a string."""
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
