"""vLLM (0.33.0 unless the user names another): JSON whose "speculative_config" is the dict for
`vllm serve --speculative-config`, and the vLLM version it is written for as "engine_version".

method "draft_model" | "ngram" | "suffix", model, num_speculative_tokens, prompt_lookup_max / _min (n-gram),
suffix_decoding_* (suffix decoding: Arctic Inference's trees, which vLLM imports),
use_heterogeneous_vocab for a draft with another tokenizer (vLLM then drafts from the tokens both vocabularies
share), and num_speculative_tokens_per_batch_size ([[bs_lo, bs_hi, K], ...]; vLLM ≥ 0.24.0; it switches on
dynamic speculative decoding) only when the schedule varies; a vLLM before that gets the headline γ fixed and
a note saying so. The version is checked by check_vllm_version (VLLM_OLDEST to VLLM_VERSION, the newest spectune
knows). Checked against vLLM's own source by scripts/check_vllm_export.py.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any

from engine.analysis.export.deployment import Deployment
from engine.analysis.export.files import Fit, JsonFile, with_notes
from engine.analysis.export.formats import BUILT_IN_DRAFTS, ExportFormat
from engine.analysis.export.refs import engine_ref, other_tokenizer, target_value
from engine.analysis.export.versions import VLLM_OLDEST, VLLM_SCHEDULE_SINCE, VLLM_VERSION
from engine.drafts.refs import SuffixParams, parse_suffix_spec
from engine.errors import SettingsError

# MAJOR.MINOR.PATCH with an optional pre-release, post-release, dev or local part (0.32.0, 0.11.0rc1,
# 0.8.5.post1, 0.32.0+cpu), as vLLM's releases are numbered
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)((?:rc|a|b)\d+)?(\.post\d+)?(\.dev\d+)?(\+[0-9A-Za-z.]+)?")

ENGINE_HEADER = "vllm"  # the file's "engine" field: what reads it back (vllm_read) checks first
OFF_RANGE_COMMENT = (
    "a range with K 0 is not the target alone: vLLM keeps its speculative path running there (spectune measured "
    "0.83× and 0.68× of the target alone with 2 and 4 requests in flight, vLLM CPU 0.32.0, check-export); where "
    "most of your traffic falls in those ranges, serve without --speculative-config"
)

OFF_RANGE_MEASURED = (
    "a range with K 0 is not the target alone: vLLM keeps its speculative path running there; the notes say what "
    "that cost in the measured sessions and how much of your traffic the schedule needs where it speculates"
)

REPLACES = "the speculation this file turns off: check-export measures it beside the target alone"


def version_tuple(version: str) -> tuple[int, int, int]:
    """'0.32.0+cpu' → (0, 32, 0); SettingsError for anything that is not a vLLM version number."""
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        raise SettingsError(
            f"vLLM version {version.strip()[:40]!r} is not a version number: write it as vLLM numbers its releases, "
            f"e.g. {VLLM_VERSION} (python -c 'import vllm; print(vllm.__version__)' prints yours)"
        )
    return int(match[1]), int(match[2]), int(match[3])


def check_vllm_version(version: str | None) -> str:
    """The vLLM version an export is written for (None or blank: VLLM_VERSION), or SettingsError when it is
    malformed or outside the versions spectune knows (VLLM_OLDEST to VLLM_VERSION)."""
    if version is None or not str(version).strip():
        return VLLM_VERSION
    text = str(version).strip()
    if text.lower().startswith("v"):
        text = text[1:]
    at = version_tuple(text)
    if at > version_tuple(VLLM_VERSION):
        raise SettingsError(
            f"vLLM {text} is unknown to spectune: the newest vLLM it knows is {VLLM_VERSION}, whose speculative_config "
            f"keys it checks its exports against; name {VLLM_VERSION} or older"
        )
    if at < version_tuple(VLLM_OLDEST):
        raise SettingsError(
            f"vLLM {text} is older than spectune's exports go: they are written for vLLM {VLLM_OLDEST} to "
            f"{VLLM_VERSION} (the V1 engine's speculative_config)"
        )
    return text


def has_schedule(version: str) -> bool:
    """Whether this vLLM takes num_speculative_tokens_per_batch_size (dynamic γ by batch size)."""
    return version_tuple(version) >= version_tuple(VLLM_SCHEDULE_SINCE)


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
    version = check_vllm_version(dep.vllm_version)
    doc: dict[str, Any] = {"engine": ENGINE_HEADER, "engine_version": version}
    fit = _fit(dep, version)
    notes = dep.notes
    if dep.off:
        doc |= {
            "speculative_config": None,
            "reason": dep.rec.explanation,
            "note": "Launch vLLM without --speculative-config.",
        }
        if dep.replaces is not None:
            doc["replaces"] = {"speculative_config": _speculative_config(dep.replaces, version)[0], "note": REPLACES}
    else:
        speculative, comments, fixed = _speculative_config(dep, version)
        notes += fixed
        model, model_notes = target_value(dep.target, "hf", "<target model>")
        doc |= {
            "spectune": dep.headline,
            "usage": (
                f'vllm serve {shlex.quote(model)} --speculative-config "$(jq -c .speculative_config {FORMAT.filename})"'
            ),
            "speculative_config": speculative,
        }
        comments += model_notes
        if comments:
            doc["comments"] = comments
    if dep.as_policy:
        doc |= {
            "spectune": dep.headline,
            "policy": {"spec": dep.policy.spec(), "exact": fit.exact, "runs": fit.runs, "lost": list(fit.lost)},
        }
    return JsonFile(with_notes(doc, notes), fit)


def suffix_config(p: SuffixParams, gamma: int) -> dict[str, Any]:
    """vLLM's speculative_config for suffix decoding with these parameters; num_speculative_tokens is its cap per
    step (what the export writes and what a vLLM session launches)."""
    return {
        "method": "suffix",
        "num_speculative_tokens": gamma,
        "suffix_decoding_max_tree_depth": p.max_tree_depth,
        "suffix_decoding_max_cached_requests": p.max_cached_requests,
        "suffix_decoding_max_spec_factor": p.max_spec_factor,
        "suffix_decoding_min_token_prob": p.min_token_prob,
    }


def _suffix_config(dep: Deployment) -> tuple[dict[str, Any], list[str]]:
    """vLLM's suffix decoding with the measured parameters, and what a deployer must know about it."""
    config = suffix_config(parse_suffix_spec(dep.rec.draft_name), dep.gamma)
    comments = [
        "suffix decoding needs Arctic Inference in vLLM's environment (pip install arctic-inference; vLLM imports "
        "arctic_inference.suffix_decoding); spectune measured with Arctic Inference 0.3.0's suffix tree",
        "the global tree is shared by all the server's requests: acceptance depends on the traffic it has seen "
        "(spectune's runs started from an empty cache and learnt the session's prompts in order)",
    ]
    return config, comments


def _ngram_config(dep: Deployment) -> tuple[dict[str, Any], list[str]]:
    """vLLM's n-gram lookup with the lengths the measurement looked up, and a comment where the draft's window
    names more (llama.cpp's ngram-simple looked up its longest only: vLLM runs exactly that)."""
    lookup = dep.ngram_lookup()
    lo, hi = lookup.looked_up
    config = {"method": "ngram", "num_speculative_tokens": dep.gamma, "prompt_lookup_max": hi, "prompt_lookup_min": lo}
    comments: list[str] = []
    if lookup.looked_up != lookup.window:
        comments.append(
            f"prompt_lookup_min = prompt_lookup_max = {hi}: measured in {lookup.said()}; the draft's window "
            f"{lookup.shortest}-{lookup.longest} also falls back to shorter n-grams, which was not measured"
        )
    return config, comments


# the kinds of draft vLLM runs as themselves, beyond its n-gram lookup and draft models (kind method -> config)
OWN_METHODS: dict[str, Callable[[Deployment], tuple[dict[str, Any], list[str]]]] = {"suffix": _suffix_config}


def _speculative_config(dep: Deployment, version: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """vLLM's speculative_config, the comments on it, and the note when a γ schedule had to become a fixed γ
    (a vLLM before VLLM_SCHEDULE_SINCE)."""
    comments: list[str] = []
    notes: list[str] = []
    config: dict[str, Any]
    own = OWN_METHODS.get(dep.rec.method)
    if own is not None:
        config, comments = own(dep)
    elif dep.looks_up:
        config, comments = _ngram_config(dep)
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
    if len({k for _, _, k in ranges}) > 1 and not has_schedule(version):
        notes.append(
            f"vLLM {version} has no num_speculative_tokens_per_batch_size (it came in vLLM {VLLM_SCHEDULE_SINCE}): "
            f"the γ schedule {_ranges_text(ranges)} is exported as the fixed γ = {dep.gamma} of the serving batch; "
            f"deploy vLLM >= {VLLM_SCHEDULE_SINCE} for γ by batch size"
        )
    elif len({k for _, _, k in ranges}) > 1:
        # K values are capped at num_speculative_tokens, so it must cover the schedule's largest γ
        config["num_speculative_tokens"] = max(dep.gamma, *(k for _, _, k in ranges))
        config["num_speculative_tokens_per_batch_size"] = ranges
        comments.append(
            f"num_speculative_tokens_per_batch_size needs vLLM >= {VLLM_SCHEDULE_SINCE} and turns on its dynamic "
            "speculative decoding (γ per batch size); vLLM drops it when data_parallel_size > 1"
        )
        if any(k == 0 for _, _, k in ranges):
            comments.append(OFF_RANGE_MEASURED if dep.rec.off_range_speedups else OFF_RANGE_COMMENT)
    return config, comments, notes


def _ranges_text(ranges: list[list[int]]) -> str:
    """[[1, 3, 4], [4, 8, 2]] → 'batch 1–3: γ 4, batch 4–8: γ 2'."""
    return ", ".join(f"batch {lo}–{hi}: γ {k}" if lo != hi else f"batch {lo}: γ {k}" for lo, hi, k in ranges)


def _fit(dep: Deployment, version: str) -> Fit:
    """vLLM drafts a fixed K per step, or K by batch size (from VLLM_SCHEDULE_SINCE on)."""
    policy, gamma = dep.policy, dep.gamma
    schedule = policy.batch_schedule()
    if schedule is not None and has_schedule(version):
        return Fit(True, f"K by batch size {vllm_schedule(schedule)}")
    if policy.fixed_gamma() is not None or (schedule is not None and not dep.per_batch):
        return Fit(True, f"K = {gamma}")
    if schedule is not None:
        lost = (
            f"vLLM {version} has no K by batch size (num_speculative_tokens_per_batch_size came in vLLM "
            f"{VLLM_SCHEDULE_SINCE}): the {policy.kind} policy becomes a fixed K = {gamma}"
        )
        return Fit(False, f"K = {gamma}", (lost,))
    lost = (
        f"vLLM {version}'s {dep.rec.method} method drafts a fixed K per step (or K by batch size): the "
        f"{policy.kind} policy becomes a fixed K = {gamma}"
    )
    return Fit(False, f"K = {gamma}", (lost,))


FORMAT = ExportFormat(
    name="vllm",
    label="vLLM",
    filename="vllm-speculative-config.json",
    language="json",
    mime="application/json",
    policy_support="fixed γ; γ by batch size (num_speculative_tokens_per_batch_size)",
    config=config,
    draft_methods=BUILT_IN_DRAFTS,
)
