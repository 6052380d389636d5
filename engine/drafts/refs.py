"""Draft references that need no model: 'none', 'ngram' and 'ngram:MIN-MAX'. Torch-free."""

from __future__ import annotations

from engine.errors import SettingsError

NGRAM_DEFAULT = (1, 3)  # (min, max) n-gram length for "ngram" without a window


def is_ngram(ref: str) -> bool:
    """Whether a draft reference names n-gram lookup ("ngram" or "ngram:MIN-MAX")."""
    return ref == "ngram" or ref.startswith("ngram:")


def parse_ngram_spec(ref: str) -> tuple[int, int]:
    """(min, max) n-gram window from "ngram" or "ngram:MIN-MAX"; SettingsError when malformed."""
    if ref == "ngram":
        return NGRAM_DEFAULT
    try:
        lo, hi = (int(x) for x in ref.split(":", 1)[1].split("-"))
    except (IndexError, ValueError) as exc:
        raise SettingsError(f"bad n-gram spec '{ref}'; use ngram or ngram:MIN-MAX, e.g. ngram:1-3") from exc
    if not 1 <= lo <= hi <= 16:
        raise SettingsError(f"n-gram window '{ref}': need 1 <= MIN <= MAX <= 16")
    return lo, hi
