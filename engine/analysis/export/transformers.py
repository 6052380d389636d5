"""transformers 5.24.0: the assistant's generation_config settings apart from the generate() kwargs.

Assisted generation reads γ, its schedule and the confidence threshold only from the assistant model's
generation_config (generate(num_assistant_tokens=...) is silently ignored, and a threshold left unset becomes
0.4), so the JSON keeps "assistant_generation_config" apart from "generate_kwargs"; a draft with another
tokenizer adds tokenizer / assistant_tokenizer. Applied to real models and counted per step in
tests/test_export_engines.py.
"""

from __future__ import annotations

from typing import Any

from engine.analysis.export.deployment import Deployment
from engine.analysis.export.files import Fit, JsonFile, with_notes
from engine.analysis.export.formats import BUILT_IN_DRAFTS, ExportFormat
from engine.analysis.export.refs import engine_ref, other_tokenizer, target_value
from engine.analysis.export.versions import TRANSFORMERS_VERSION

NOTE = (
    "Load each generate_kwargs entry named in 'load' with <class>.from_pretrained(<ref>) and pass the object; "
    "set every assistant_generation_config entry on the assistant model's generation_config (transformers "
    "reads γ only from there and ignores generate(num_assistant_tokens=...)); 'constant' keeps the measured "
    "γ and threshold 0.0 drafts all γ tokens (unset, it becomes 0.4 and drafts stop early)."
)
PROMPT_LOOKUP_NOTE = "Prompt-lookup (n-gram) decoding, no second model: target.generate(ids, **generate_kwargs)."
POLICY_NOTE = (
    "Load each generate_kwargs entry named in 'load' with <class>.from_pretrained(<ref>) and pass the object; "
    "set every assistant_generation_config entry on the assistant model's generation_config: transformers "
    "reads γ, its schedule and the confidence threshold only from there (a threshold left unset becomes 0.4)."
)


def config(dep: Deployment) -> JsonFile:
    """The JSON; entries of generate_kwargs named in "load" are references to load (with the named
    from_pretrained) and pass as objects."""
    head: dict[str, Any] = {"engine": "transformers", "engine_version": TRANSFORMERS_VERSION}
    rec = dep.rec
    sampling: dict[str, Any] = {"do_sample": rec.temperature > 0}
    if rec.temperature > 0:
        sampling["temperature"] = rec.temperature
    assistant, fit = _assistant(dep) if not dep.looks_up else ({}, _prompt_lookup_fit(dep))
    fit = dep.closest_fit(fit, f"transformers {TRANSFORMERS_VERSION}", "prompt lookup (this prompt's n-grams)")
    if dep.off:
        doc = {
            **head,
            "speculation": "off",
            "generate_kwargs": sampling,
            "note": f"No assistant model or prompt lookup: {rec.explanation}",
        }
    elif dep.looks_up:
        doc = _prompt_lookup(dep, head, sampling)
        if dep.lookup_stands_in:
            doc |= {"speculation": "prompt_lookup", "lost": fit.lost[-1]}
    else:
        doc = _assisted(dep, head, assistant, sampling)
    if dep.as_policy:
        policy = {
            "spec": dep.policy.spec(),
            "exact": fit.exact,
            "runs": fit.runs,
            "lost": list(fit.lost),
            "notes": list(fit.remarks),
        }
        if dep.looks_up:
            doc |= {"spectune": dep.headline, "policy": policy}
        else:
            doc |= {
                "assistant_generation_config": assistant,
                "spectune": dep.headline,
                "policy": policy,
                "note": POLICY_NOTE,
            }
    return JsonFile(with_notes(doc, dep.notes), fit)


def _prompt_lookup(dep: Deployment, head: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """Prompt lookup up to the longest n-gram the measurement looked up; transformers always falls back to
    shorter matches down to one token, so a longer shortest match that was measured is named as lost."""
    lookup = dep.ngram_lookup()
    shortest, longest = lookup.looked_up
    kwargs = {"prompt_lookup_num_tokens": dep.gamma, "max_matching_ngram_size": longest, **sampling}
    doc = {
        **head,
        "spectune": dep.headline,
        "speculation": dep.rec.method,
        "generate_kwargs": kwargs,
        "note": PROMPT_LOOKUP_NOTE,
    }
    if shortest > 1 and not dep.lookup_stands_in:
        doc["comments"] = [
            f"measured: {lookup.said()}; transformers has no shortest match (prompt lookup tries "
            f"max_matching_ngram_size = {longest} down to 1 token), so it also drafts after matches shorter than "
            f"{shortest} tokens, which was not measured"
        ]
    return doc


def _assisted(
    dep: Deployment, head: dict[str, Any], assistant: dict[str, Any], sampling: dict[str, Any]
) -> dict[str, Any]:
    """Assisted generation with the draft model as the assistant."""
    draft = engine_ref(dep.draft_ref(), "hf")
    kwargs = {"assistant_model": draft.value, **sampling}
    load = {"assistant_model": "AutoModelForCausalLM"}
    comments = list(draft.notes)
    other, assumed = other_tokenizer(dep.rec.model_ref, dep.target)
    if other:
        tokenizer, tokenizer_notes = target_value(dep.target, "hf", "<target model>")
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
        "spectune": dep.headline,
        "speculation": dep.rec.method,
        "assistant_generation_config": assistant,
        "generate_kwargs": kwargs,
        "load": load,
        "note": NOTE,
    }
    if comments:
        doc["comments"] = comments
    return doc


def _assistant(dep: Deployment) -> tuple[dict[str, Any], Fit]:
    """The assistant's generation_config for the policy, and how closely it runs the policy."""
    policy, gamma = dep.policy, dep.gamma
    config: dict[str, Any] = {
        "num_assistant_tokens": gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    lost: list[str] = []
    remarks: list[str] = []
    controls = policy.controls()
    if controls.schedule == "heuristic" and not controls.beyond:
        config |= {
            "num_assistant_tokens": controls.n_max,
            "num_assistant_tokens_schedule": "heuristic",
            "assistant_confidence_threshold": controls.p_min,
        }
        remarks.append(
            "'heuristic' carries num_assistant_tokens over generate() calls, as spectune's run carries it over "
            "prompts; 'heuristic_transient' would restart it per call"
        )
    elif controls.schedule is None and not controls.beyond:  # a length cap and a confidence stop
        if controls.p_min or controls.n_min:
            config |= {"num_assistant_tokens": controls.n_max, "assistant_confidence_threshold": controls.p_min}
        if controls.p_min and not controls.keeps_unsure:
            lost.append("transformers keeps the unsure token (llama.cpp's rule drops it): one more token drafted")
        if controls.n_min:
            lost.append(f"transformers has no n-min: drafts shorter than {controls.n_min} are verified anyway")
    else:
        if controls.schedule is not None:
            lost.append(f"transformers has no {controls.schedule} schedule: a constant {gamma} tokens instead")
        lost += [
            f"transformers has no {what}: a constant {gamma} tokens instead of {instead}"
            for what, instead in controls.beyond
        ]
    if config["assistant_confidence_threshold"]:
        remarks.append(
            "with scikit-learn installed transformers re-fits the threshold during generation "
            "(update_candidate_strategy, ROC cost fpr + 3·fnr); without it the threshold stays as set"
        )
    runs = ", ".join(f"{k} {v}" for k, v in config.items())
    return config, Fit(not lost, runs, tuple(lost), tuple(remarks))


def _prompt_lookup_fit(dep: Deployment) -> Fit:
    """Prompt lookup drafts a fixed number of tokens."""
    runs = f"prompt_lookup_num_tokens {dep.gamma}"
    if not dep.policy.varies_per_step:
        return Fit(True, runs)
    return Fit(
        False, runs, (f"prompt lookup drafts a fixed {dep.gamma} tokens: the {dep.policy.kind} policy is not applied",)
    )


FORMAT = ExportFormat(
    name="transformers",
    label="transformers",
    filename="transformers-generate-kwargs.json",
    language="json",
    mime="application/json",
    policy_support=(
        "fixed γ; the confidence stop (assistant_confidence_threshold, the unsure token kept); the heuristic schedule"
    ),
    config=config,
    draft_methods=BUILT_IN_DRAFTS,
)
