"""vLLM 0.33.0: JSON whose "speculative_config" is the dict for `vllm serve --speculative-config`.

method "draft_model" | "ngram" | "suffix", model, num_speculative_tokens, prompt_lookup_max / _min (n-gram),
suffix_decoding_* (suffix decoding: Arctic Inference's trees, which vLLM imports),
use_heterogeneous_vocab for a draft with another tokenizer (vLLM then drafts from the tokens both vocabularies
share), and num_speculative_tokens_per_batch_size ([[bs_lo, bs_hi, K], ...]; vLLM ≥ 0.24.0; it switches on
dynamic speculative decoding) only when the schedule varies. Checked against vLLM's own source by
scripts/check_vllm_export.py.
"""

from __future__ import annotations

import shlex
from typing import Any

from engine.analysis.export.deployment import Deployment
from engine.analysis.export.files import Fit, JsonFile, with_notes
from engine.analysis.export.formats import FILENAMES, VLLM_SCHEDULE_SINCE, VLLM_VERSION
from engine.analysis.export.refs import engine_ref, other_tokenizer, target_value
from engine.core.policy import BatchSchedule, FixedGamma


def vllm_schedule(schedule: dict[int, int]) -> list[list[int]]:
    """{batch: γ} sampled at a few batch sizes → vLLM's contiguous [[bs_lo, bs_hi, K], ...] ranges.

    Each sampled batch's γ holds until the next sampled batch; the first range starts at 1 and the
    last ends at the largest sampled batch (vLLM keeps the last K for larger batches). Adjacent
    ranges with the same K are merged.
    """
    if not schedule:
        return []
    points = sorted((int(b), int(k)) for b, k in schedule.items())
    ranges: list[list[int]] = []
    for i, (b, k) in enumerate(points):
        lo = 1 if i == 0 else b
        hi = points[i + 1][0] - 1 if i + 1 < len(points) else b
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = hi
        else:
            ranges.append([lo, hi, k])
    return ranges


def config(dep: Deployment) -> JsonFile:
    """The engine header and "speculative_config" for `vllm serve`; off → speculative_config null and why."""
    doc: dict[str, Any] = {"engine": "vllm", "engine_version": VLLM_VERSION}
    fit = _fit(dep)
    if dep.off:
        doc |= {
            "speculative_config": None,
            "reason": dep.rec.explanation,
            "note": "Launch vLLM without --speculative-config.",
        }
    else:
        speculative, comments = _speculative_config(dep)
        model, model_notes = target_value(dep.target, "hf", "<target model>")
        doc |= {
            "spectune": dep.headline,
            "usage": (
                f"vllm serve {shlex.quote(model)} "
                f'--speculative-config "$(jq -c .speculative_config {FILENAMES["vllm"]})"'
            ),
            "speculative_config": speculative,
        }
        comments += model_notes
        if comments:
            doc["comments"] = comments
    if dep.as_policy:
        doc |= {"spectune": dep.headline, "policy": {"spec": dep.policy.spec(), "exact": fit.exact, "runs": fit.runs,
                                                     "lost": list(fit.lost)}}  # fmt: skip
    return JsonFile(with_notes(doc, dep.notes), fit)


def _suffix_config(dep: Deployment) -> tuple[dict[str, Any], list[str]]:
    """vLLM's suffix decoding with the measured parameters; num_speculative_tokens is its cap per step."""
    p = dep.suffix_params()
    config = {
        "method": "suffix", "num_speculative_tokens": dep.gamma,
        "suffix_decoding_max_tree_depth": p.max_tree_depth,
        "suffix_decoding_max_cached_requests": p.max_cached_requests,
        "suffix_decoding_max_spec_factor": p.max_spec_factor,
        "suffix_decoding_min_token_prob": p.min_token_prob,
    }  # fmt: skip
    comments = [
        "suffix decoding needs Arctic Inference in vLLM's environment (pip install arctic-inference; vLLM imports "
        "arctic_inference.suffix_decoding); spectune measured with Arctic Inference 0.3.0's suffix tree",
        "the global tree is shared by all the server's requests: acceptance depends on the traffic it has seen "
        "(spectune's runs started from an empty cache and learnt the session's prompts in order)",
    ]
    return config, comments


def _speculative_config(dep: Deployment) -> tuple[dict[str, Any], list[str]]:
    """vLLM's speculative_config and the comments on it."""
    comments: list[str] = []
    config: dict[str, Any]
    if dep.suffix:
        config, comments = _suffix_config(dep)
    elif dep.ngram:
        window_max, window_min = dep.ngram_window()
        config = {"method": "ngram", "num_speculative_tokens": dep.gamma, "prompt_lookup_max": window_max,
                  "prompt_lookup_min": window_min}  # fmt: skip
    else:
        draft = engine_ref(dep.draft_ref(), "hf")
        config = {"method": "draft_model", "model": draft.value, "num_speculative_tokens": dep.gamma}
        comments += draft.notes
        other, assumed = other_tokenizer(dep.rec.model_ref, dep.target)
        if other:
            config["use_heterogeneous_vocab"] = True
            comments.append(
                "the draft has another tokenizer: with use_heterogeneous_vocab vLLM drafts greedily from the tokens "
                "both vocabularies share (token-level intersection); spectune measured re-tokenised drafting, so "
                "acceptance will differ" + (f" ({assumed})" if assumed else "")
            )
    ranges = vllm_schedule(dep.per_batch or {})
    if len({k for _, _, k in ranges}) > 1:
        # K values are capped at num_speculative_tokens, so it must cover the schedule's largest γ
        config["num_speculative_tokens"] = max(dep.gamma, *(k for _, _, k in ranges))
        config["num_speculative_tokens_per_batch_size"] = ranges
        comments.append(
            f"num_speculative_tokens_per_batch_size needs vLLM >= {VLLM_SCHEDULE_SINCE} and turns on its dynamic "
            "speculative decoding (γ per batch size); vLLM drops it when data_parallel_size > 1"
        )
    return config, comments


def _fit(dep: Deployment) -> Fit:
    """vLLM drafts a fixed K per step, or K by batch size."""
    policy, gamma = dep.policy, dep.gamma
    if isinstance(policy, BatchSchedule):
        return Fit(True, f"K by batch size {vllm_schedule(dict(policy.schedule))}")
    if isinstance(policy, FixedGamma):
        return Fit(True, f"K = {gamma}")
    lost = (
        f"vLLM {VLLM_VERSION}'s {dep.rec.method} method drafts a fixed K per step (or K by batch size): the "
        f"{policy.kind} policy becomes a fixed K = {gamma}"
    )
    return Fit(False, f"K = {gamma}", (lost,))
