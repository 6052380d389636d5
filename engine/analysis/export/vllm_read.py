"""A vLLM export read back into what spectune launches to measure it (engine.service.export_check).

The inverse of engine.analysis.export.vllm for the methods it writes: n-gram lookup, a draft model and suffix
decoding, each with a fixed K or K by batch size. The vLLM session runner turns the result back into the same
speculative_config (engine.engines.vllm.runner.speculative_config); the check session compares the two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.analysis.export.refs import HF_ORIGIN
from engine.analysis.export.vllm import ENGINE_HEADER
from engine.core.policy import BatchSchedule
from engine.drafts.refs import NGRAM_DEFAULT, SuffixParams, suffix_ref
from engine.errors import SettingsError


@dataclass(frozen=True)
class VllmExported:
    """What a vLLM export runs: the draft as spectune names it, the K one request in flight gets (the fixed γ the
    schedule is compared with), and K by batch size ({lowest batch of a range: K}) when the file has one."""

    draft: str
    gamma: int
    schedule: dict[int, int] | None
    speculative_config: dict[str, Any]
    off: bool = False  # the file turns speculation off: draft, γ and config are those of the speculation it replaces

    def policy(self) -> BatchSchedule | None:
        return BatchSchedule(tuple(self.schedule.items())) if self.schedule else None


def read_vllm_export(text: str) -> VllmExported:
    """The export's speculative_config read back; SettingsError saying what is wrong with the file otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"not a vLLM export: the file is not JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(doc, dict) or doc.get("engine") != ENGINE_HEADER:
        raise SettingsError('not a vLLM export: it has no "engine": "vllm" (recommend --export vllm writes one)')
    config = doc.get("speculative_config")
    if config is None:
        return _off(doc.get("replaces"))
    if not isinstance(config, dict):
        raise SettingsError("the export's speculative_config is not a JSON object")
    gamma = _positive(config.get("num_speculative_tokens"), "num_speculative_tokens")
    schedule = _schedule(config.get("num_speculative_tokens_per_batch_size"), gamma)
    first = schedule[min(schedule)] if schedule else gamma
    return VllmExported(_draft(config), first, schedule, config)


def _off(replaces: Any) -> VllmExported:
    """An "off" file, measured as the speculation it names under "replaces" beside the target alone it serves."""
    config = replaces.get("speculative_config") if isinstance(replaces, dict) else None
    if not isinstance(config, dict):
        raise SettingsError(
            "the export turns speculation off (speculative_config null) and names no speculation it "
            'replaces ("replaces": {"speculative_config": …}, as `watch` writes it): there is nothing '
            "to measure it against"
        )
    if config.get("num_speculative_tokens_per_batch_size") is not None:
        raise SettingsError("the speculation an off file replaces must be a fixed num_speculative_tokens")
    gamma = _positive(config.get("num_speculative_tokens"), "replaced num_speculative_tokens")
    return VllmExported(_draft(config), gamma, None, config, off=True)


def _positive(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SettingsError(f"the export's {name} must be a whole number ≥ 1, not {value!r}")
    return value


def _schedule(ranges: Any, cap: int) -> dict[int, int] | None:
    """{batch: K} from [[bs_lo, bs_hi, K], ...] (contiguous from batch 1, each K between 0 and the cap): each
    range's bs_lo, and the last range's bs_hi too, so that vllm_schedule gives the same ranges back."""
    if ranges is None:
        return None
    if not isinstance(ranges, list) or not ranges:
        raise SettingsError("num_speculative_tokens_per_batch_size must be a list of [bs_lo, bs_hi, K] ranges")
    schedule: dict[int, int] = {}
    expected = 1
    for item in ranges:
        if not (isinstance(item, list) and len(item) == 3 and all(isinstance(x, int) for x in item)):
            raise SettingsError(f"num_speculative_tokens_per_batch_size: {item!r} is not [bs_lo, bs_hi, K]")
        lo, hi, k = item
        if lo != expected or hi < lo or not 0 <= k <= cap:
            raise SettingsError(
                f"num_speculative_tokens_per_batch_size: range {item!r} must start at batch "
                f"{expected}, end at or after it, and have 0 ≤ K ≤ {cap}"
            )
        schedule[lo] = k
        expected = hi + 1
    lo, hi, k = ranges[-1]
    if hi > lo:
        schedule[hi] = k
    return schedule


def _ngram_ref(config: dict[str, Any]) -> str:
    lo, hi = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    if (lo, hi) == NGRAM_DEFAULT:
        return "ngram"
    return f"ngram:{_positive(lo, 'prompt_lookup_min')}-{_positive(hi, 'prompt_lookup_max')}"


def _model_ref(config: dict[str, Any]) -> str:
    model = config.get("model")
    if not isinstance(model, str) or not model:
        raise SettingsError("the export's draft_model method names no model")
    bundled = next((alias for alias, origin in HF_ORIGIN.items() if origin == model), None)
    return bundled or (str(Path(model)) if Path(model).exists() else model)


def _suffix_ref(config: dict[str, Any]) -> str:
    d = SuffixParams()
    return suffix_ref(
        SuffixParams(
            int(config.get("suffix_decoding_max_tree_depth", d.max_tree_depth)),
            float(config.get("suffix_decoding_max_spec_factor", d.max_spec_factor)),
            float(config.get("suffix_decoding_min_token_prob", d.min_token_prob)),
            int(config.get("suffix_decoding_max_cached_requests", d.max_cached_requests)),
        )
    )


# vLLM's speculative_config methods spectune measures -> the draft reference a config of that method names
DRAFT_REFS: dict[str, Callable[[dict[str, Any]], str]] = {
    "ngram": _ngram_ref,
    "draft_model": _model_ref,
    "suffix": _suffix_ref,
}


def _draft(config: dict[str, Any]) -> str:
    method = config.get("method")
    read = DRAFT_REFS.get(method) if isinstance(method, str) else None
    if read is None:
        raise SettingsError(f"the export's method {method!r} is not one spectune measures ({', '.join(DRAFT_REFS)})")
    return read(config)
