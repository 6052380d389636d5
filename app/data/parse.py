"""The Run form's and the address bar's text parsing: lists of γ, temperatures, draft references, session ids."""

from __future__ import annotations

import re
from typing import Any

from engine.errors import SettingsError
from engine.service.api import cancelled_text as cancelled_text
from engine.service.api import run_concurrency as run_concurrency

_SPLIT = re.compile(r"[,;\s]+")


def parse_int_list(text: str, what: str = "γ") -> list[int]:
    """'1, 2 4;8' → [1, 2, 4, 8]; 'a-b' ranges allowed ('1-4'). Raises SettingsError naming the bad item."""
    values: list[int] = []
    for item in (x for x in _SPLIT.split(text.strip()) if x):
        bounds = item.split("-")
        try:
            if len(bounds) == 2 and bounds[0] and bounds[1]:
                lo, hi = int(bounds[0]), int(bounds[1])
                if hi < lo:
                    raise SettingsError(f"{what} range '{item}' runs backwards")
                if hi - lo > 256:
                    raise SettingsError(f"{what} range '{item}' is too long")
                values.extend(range(lo, hi + 1))
            else:
                values.append(int(item))
        except ValueError:
            raise SettingsError(f"{what} list: '{item}' is not a whole number (write e.g. 1,2,4,8)") from None
    if not values:
        raise SettingsError(f"no {what} given (write e.g. 1,2,4,8)")
    return sorted(set(values))


def parse_float_list(text: str, what: str = "temperature") -> list[float]:
    """'0, 0.7' → [0.0, 0.7]; raises SettingsError naming the bad item."""
    values: list[float] = []
    for item in (x for x in _SPLIT.split(text.strip()) if x):
        try:
            value = float(item)
        except ValueError:
            raise SettingsError(f"{what} list: '{item}' is not a number (write e.g. 0, 0.7)") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise SettingsError(f"{what} list: '{item}' is not a finite number")
        values.append(value)
    if not values:
        raise SettingsError(f"no {what} given (write e.g. 0 for greedy)")
    return list(dict.fromkeys(values))


def parse_refs(text: str) -> list[str]:
    """Free-text model references, separated by commas or new lines (paths may contain spaces)."""
    return [x.strip() for x in re.split(r"[,\n]+", text or "") if x.strip()]


def parse_session_param(raw: Any) -> list[int]:
    """'?session=3' or '?session=3,5' → [3] / [3, 5]; malformed items are dropped, order kept, no repeats."""
    if raw is None:
        return []
    ids: list[int] = []
    for item in (x for x in _SPLIT.split(str(raw).strip()) if x):
        try:
            value = int(item)
        except ValueError:
            continue
        if value not in ids:
            ids.append(value)
    return ids
