"""After the parse: prompts over the model's context, and the numbers for the upload preview."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from engine.prompts.model import ParseIssue, ParseResult, Prompt, one_line


def check_prompt_lengths(
    prompts: Iterable[Prompt], tokenizer_len: Callable[[str], int], max_tokens: int
) -> list[ParseIssue]:
    """Flag prompts that do not fit the model's context (the caller supplies the tokenizer's count)."""
    issues: list[ParseIssue] = []
    for p in prompts:
        try:
            n = int(tokenizer_len(p.text))
        except Exception as e:  # noqa: BLE001 -- a tokenizer failure on one prompt must not hide the others
            issues.append(ParseIssue(p.source_line, one_line(f"could not count tokens ({type(e).__name__}: {e})")))
            continue
        if n > max_tokens:
            issues.append(
                ParseIssue(p.source_line, f"prompt {p.prompt_id} is {n:,} tokens; the limit is {max_tokens:,}")
            )
    return issues


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "max": 0, "mean": 0.0, "median": 0.0, "total": 0}
    return {
        "min": min(values),
        "max": max(values),
        "mean": round(statistics.fmean(values), 1),
        "median": float(statistics.median(values)),
        "total": sum(values),
    }


def summarise(result: ParseResult, tokenizer_len: Callable[[str], int] | None = None) -> dict[str, Any]:
    """Numbers for the upload preview; token lengths (for the histogram) only when a tokenizer count is given."""
    char_lengths = [len(p.text) for p in result.prompts]
    categories = Counter(p.category or "(none)" for p in result.prompts)
    summary: dict[str, Any] = {
        "count": len(result.prompts),
        "format": result.format,
        "issues": len(result.issues),
        "duplicates_removed": result.duplicates_removed,
        "categories": dict(categories.most_common()),
        "chars": _stats(char_lengths),
        "char_lengths": char_lengths,
    }
    if tokenizer_len is not None:
        token_lengths = [int(tokenizer_len(p.text)) for p in result.prompts]
        summary["tokens"] = _stats(token_lengths)
        summary["token_lengths"] = token_lengths
    return summary
