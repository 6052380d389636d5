"""Turn a Recommendation into configuration for the servers people actually run, plus spectune's own record.

Why: a recommendation is only useful if it can be pasted into a launch command unchanged, and
"off" must be exported too — as an explicit, explained absence — so nobody re-enables speculation
by accident. Each exporter returns (filename, text); flag formats are shell-quoted single lines
preceded by `#` comments (parse with shlex.split(text, comments=True)), the others are JSON.

Flag names, as of the engines' documentation and source at the time of writing:

* vLLM `--speculative-config` JSON: method "draft_model" | "ngram", model, num_speculative_tokens,
  prompt_lookup_max / prompt_lookup_min (n-gram), num_speculative_tokens_per_batch_size
  ([[bs_lo, bs_hi, K], ...], inclusive ranges, first starting at 1, K ≥ 0, K capped at
  num_speculative_tokens) for a batch-size schedule.
* SGLang: --speculative-algorithm STANDALONE (small draft LLM) or NGRAM,
  --speculative-draft-model-path, --speculative-num-steps γ, --speculative-eagle-topk 1 (a chain,
  not a tree) and --speculative-num-draft-tokens γ+1 (with topk 1 SGLang counts the verified root
  token, so steps + 1); NGRAM uses --speculative-num-draft-tokens and
  --speculative-ngram-{min,max}-match-window-size.
* transformers generate(): assistant_model (load the model from the exported ref first),
  num_assistant_tokens, num_assistant_tokens_schedule="constant" (the measured, fixed γ; the
  default "heuristic" would change γ at run time), or prompt_lookup_num_tokens /
  max_matching_ngram_size for n-gram.
* llama.cpp llama-server: -md draft.gguf --draft-max γ --draft-min 0 --draft-p-min 0 (always
  draft γ, the policy that was measured), or --spec-type ngram-simple --draft-max γ for n-gram.
  Newer builds also spell these --spec-draft-n-max / --spec-draft-n-min; older builds without
  --spec-type have no server-side n-gram mode (the separate llama-lookup example does it).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict
from typing import Any

from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport

FORMATS = ("vllm", "sglang", "transformers", "llamacpp", "spectune")
FILENAMES = {
    "vllm": "vllm-speculative-config.json",
    "sglang": "sglang-flags.txt",
    "transformers": "transformers-generate-kwargs.json",
    "llamacpp": "llama-server-flags.txt",
    "spectune": "spectune-recommendation.json",
}
SPECTUNE_FORMAT = "spectune.recommendation/1"


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


def export_vllm(rec: Recommendation, schedule: dict[int, int] | None = None) -> str:
    """JSON for `vllm serve --speculative-config '<json>'`; off → explanatory JSON with speculative_config null."""
    if rec.off:
        return _dumps(
            {
                "speculative_config": None,
                "reason": rec.explanation,
                "note": "Launch vLLM without --speculative-config.",
            }
        )
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
        config = {"method": "draft_model", "model": _draft_ref(rec), "num_speculative_tokens": rec.gamma}
    ranges = vllm_schedule(schedule or {})
    if ranges and any(k > 0 for _, _, k in ranges):
        # K values are capped at num_speculative_tokens, so it must cover the schedule's largest γ
        config["num_speculative_tokens"] = max(rec.gamma, *(k for _, _, k in ranges))
        config["num_speculative_tokens_per_batch_size"] = ranges
    return _dumps(config)


def export_sglang(rec: Recommendation, schedule: dict[int, int] | None = None) -> str:
    """`python -m sglang.launch_server` flags; off → only a comment saying why."""
    if rec.off:
        return _flags_text([rec.explanation, "launch SGLang without --speculative-* flags"], [])
    comments = [_summary_line(rec)]
    if rec.method == "ngram":
        window_max, window_min = _ngram_window(rec)
        flags = [
            "--speculative-algorithm", "NGRAM",
            "--speculative-num-draft-tokens", str(rec.gamma + 1),
            "--speculative-ngram-max-match-window-size", str(window_max),
            "--speculative-ngram-min-match-window-size", str(window_min),
        ]  # fmt: skip
        comments.append("NGRAM needs CUDA; --speculative-num-draft-tokens counts the verified root token (γ+1)")
    else:
        flags = [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", _draft_ref(rec),
            "--speculative-num-steps", str(rec.gamma),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(rec.gamma + 1),
        ]  # fmt: skip
    if schedule:
        comments.append(f"SGLang has no per-batch γ flag; schedule {dict(sorted(schedule.items()))} not applied")
    return _flags_text(comments, flags)


def export_transformers(rec: Recommendation) -> str:
    """JSON with the generate() kwargs; assistant_model holds the ref to load and pass as a model."""
    sampling: dict[str, Any] = {"do_sample": rec.temperature > 0}
    if rec.temperature > 0:
        sampling["temperature"] = rec.temperature
    if rec.off:
        return _dumps(
            {
                "speculation": "off",
                "generate_kwargs": sampling,
                "note": f"No assistant model or prompt lookup: {rec.explanation}",
            }
        )
    if rec.method == "ngram":
        window_max, _ = _ngram_window(rec)
        kwargs = {"prompt_lookup_num_tokens": rec.gamma, "max_matching_ngram_size": window_max, **sampling}
        note = "Prompt-lookup (n-gram) decoding: no second model."
    else:
        kwargs = {
            "assistant_model": _draft_ref(rec),
            "num_assistant_tokens": rec.gamma,
            "num_assistant_tokens_schedule": "constant",
            **sampling,
        }
        note = (
            "Load assistant_model with AutoModelForCausalLM.from_pretrained(<ref>) and pass the model object; "
            "'constant' keeps the measured γ instead of the default heuristic schedule."
        )
    return _dumps({"speculation": rec.method, "generate_kwargs": kwargs, "note": note})


def export_llamacpp(rec: Recommendation, schedule: dict[int, int] | None = None) -> str:
    """llama-server flags; off → only a comment saying why."""
    if rec.off:
        return _flags_text([rec.explanation, "launch llama-server without -md / --spec-type"], [])
    comments = [_summary_line(rec)]
    if rec.method == "ngram":
        flags = ["--spec-type", "ngram-simple", "--draft-max", str(rec.gamma)]
        comments.append("builds without --spec-type have no server-side n-gram mode (see the llama-lookup example)")
    else:
        ref = _draft_ref(rec)
        flags = ["-md", ref, "--draft-max", str(rec.gamma), "--draft-min", "0", "--draft-p-min", "0"]
        if not ref.lower().endswith(".gguf"):
            comments.append(f"-md expects a GGUF file: convert {ref} to GGUF first")
        comments.append("--draft-p-min 0 always drafts γ tokens (the measured policy); raise it to cut unsure drafts")
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


def export(
    rec: Recommendation,
    fmt: str,
    regime: RegimeReport | None = None,
    schedule: dict[int, int] | None = None,
) -> tuple[str, str]:
    """(filename, text) for one format. `schedule` defaults to rec.schedule; an "off" recommendation wins over it."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if schedule is None:
        schedule = rec.schedule
    if fmt == "vllm":
        text = export_vllm(rec, schedule)
    elif fmt == "sglang":
        text = export_sglang(rec, schedule)
    elif fmt == "transformers":
        text = export_transformers(rec)
    elif fmt == "llamacpp":
        text = export_llamacpp(rec, schedule)
    else:
        text = export_spectune(rec, regime, schedule)
    return FILENAMES[fmt], text
