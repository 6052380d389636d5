"""Draft references that need no model: 'none', 'ngram[:MIN-MAX]' and 'suffix[:…]'. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class SuffixParams:
    """Suffix decoding's parameters, named and defaulted as vLLM's `suffix_decoding_*` fields."""

    max_tree_depth: int = 24
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    max_cached_requests: int = 10000  # 0: no global tree (each request sees its own prompt and response only)


SUFFIX_SPELLING = "suffix[:DEPTH[:SPEC_FACTOR[:MIN_PROB[:CACHED]]]], e.g. suffix:24:1.0:0.1 or suffix:24:1:0.1:0 (cold)"


def is_suffix(ref: str) -> bool:
    """Whether a draft reference names suffix decoding ("suffix" or "suffix:…")."""
    return ref == "suffix" or ref.startswith("suffix:")


def parse_suffix_spec(ref: str) -> SuffixParams:
    """SuffixParams from "suffix[:DEPTH[:SPEC_FACTOR[:MIN_PROB[:CACHED]]]]"; SettingsError when malformed."""
    parts = ref.split(":")[1:]
    if ref == "suffix":
        return SuffixParams()
    if not 1 <= len(parts) <= 4 or any(p.strip() == "" for p in parts):
        raise SettingsError(f"bad suffix spec '{ref}'; use {SUFFIX_SPELLING}")
    d = SuffixParams()
    defaults = [d.max_tree_depth, d.max_spec_factor, d.min_token_prob, d.max_cached_requests]
    try:
        given = [cast(p) for cast, p in zip((int, float, float, int), parts, strict=False)]
    except ValueError as exc:
        raise SettingsError(f"bad suffix spec '{ref}'; use {SUFFIX_SPELLING}") from exc
    depth, factor, prob, cached = given + defaults[len(given) :]
    if not 1 <= depth <= 1024:
        raise SettingsError(f"suffix spec '{ref}': DEPTH (max tree depth) must be 1..1024")
    if not 0 < factor <= 64:
        raise SettingsError(f"suffix spec '{ref}': SPEC_FACTOR must be > 0 (at most 64)")
    if not 0 <= prob <= 1:
        raise SettingsError(f"suffix spec '{ref}': MIN_PROB must be in [0, 1]")
    if not 0 <= cached <= 2**31 - 1:
        raise SettingsError(f"suffix spec '{ref}': CACHED (max cached requests) must be 0..2147483647")
    return SuffixParams(int(depth), float(factor), float(prob), int(cached))


def suffix_ref(params: SuffixParams) -> str:
    """The canonical reference for `params` ("suffix" for vLLM's defaults)."""
    if params == SuffixParams():
        return "suffix"
    p = params
    return f"suffix:{p.max_tree_depth}:{p.max_spec_factor:g}:{p.min_token_prob:g}:{p.max_cached_requests}"
