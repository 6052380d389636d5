"""SGLang 0.5.23 flags for `python -m sglang.launch_server`.

STANDALONE with --speculative-num-steps γ, --speculative-eagle-topk 1 and --speculative-num-draft-tokens γ+1
(a chain; SGLang counts the verified root token); NGRAM with --speculative-num-draft-tokens γ+1,
--speculative-ngram-max-bfs-breadth 1 and --speculative-ngram-max-trie-depth (the match-window flags were
removed in 0.5.10). STANDALONE refuses a draft with another vocabulary: none is exported. Checked with SGLang's
own CLI builder by scripts/check_sglang_export.py.
"""

from __future__ import annotations

import shlex

from engine.analysis.export.deployment import Deployment, head_lines, varies
from engine.analysis.export.files import Fit, FlagsFile, note_comments
from engine.analysis.export.formats import BUILT_IN_DRAFTS, ExportFormat
from engine.analysis.export.refs import engine_ref, other_tokenizer, target_value
from engine.analysis.export.versions import SGLANG_VERSION


def config(dep: Deployment) -> FlagsFile:
    """The launch_server flags; off, or a draft SGLang cannot use → only comments saying why."""
    head = f"SGLang {SGLANG_VERSION} flags for python -m sglang.launch_server"
    notes = note_comments(dep.notes)
    fit = dep.closest_fit(_fit(dep), f"SGLang {SGLANG_VERSION}", SGLANG_CLOSEST)
    if dep.off:
        return FlagsFile((head, dep.rec.explanation, "launch SGLang without --speculative-* flags", *notes), (), fit)
    model, model_notes = target_value(dep.target, "hf", "<target model>")
    comments = [
        head,
        *head_lines(dep, fit),
        f'usage: eval "python -m sglang.launch_server --model-path {shlex.quote(model)} '
        f"$(grep -v '^#' {FORMAT.filename})\"",
        *model_notes,
    ]
    gamma = dep.gamma
    if dep.looks_up:
        lookup = dep.ngram_lookup()
        _, longest = lookup.looked_up
        flags = [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(gamma + 1),
            "--speculative-ngram-max-bfs-breadth",
            "1",
            "--speculative-ngram-max-trie-depth",
            str(longest + gamma),
        ]
        comments.append(
            "NGRAM needs CUDA; --speculative-num-draft-tokens counts the verified root token (γ+1); SGLang matches "
            f"suffixes of up to {longest} tokens plus γ drafted in a trie of recent n-grams (trie depth "
            f"{longest}+γ), not spectune's prompt lookup, so acceptance can differ"
        )
        if not dep.lookup_stands_in:
            comments.append(
                f"measured: {lookup.said()}; SGLang {SGLANG_VERSION} cannot set the shortest match (the "
                "--speculative-ngram-min-match-window-size flag was removed in 0.5.10): it matches any suffix length"
            )
        if dep.lookup_stands_in:
            comments.append(fit.lost[-1])
    else:
        other, assumed = other_tokenizer(dep.rec.model_ref, dep.target)
        if other:
            comments += [
                f"no SGLang {SGLANG_VERSION} config: STANDALONE requires the draft to share the target's "
                "vocabulary (sglang/srt/speculative/standalone_worker_v2.py, _validate_vocab_compatibility) and "
                f"{dep.rec.model_ref} has another tokenizer" + (f" ({assumed})" if assumed else ""),
                "deploy this draft with the transformers or vLLM export instead",
            ]
            return FlagsFile((*comments, *notes), (), fit)
        draft = engine_ref(dep.draft_ref(), "hf")
        flags = [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", draft.value,
            "--speculative-num-steps", str(gamma),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(gamma + 1),
        ]  # fmt: skip
        comments += draft.notes
    if dep.per_batch and not dep.as_policy:
        comments.append(f"SGLang has no per-batch γ flag; schedule {dict(sorted(dep.per_batch.items()))} not applied")
    return FlagsFile((*comments, *notes), tuple(flags), fit)


SGLANG_CLOSEST = "NGRAM (a trie of recent n-grams, greedy, no scores)"


def _fit(dep: Deployment) -> Fit:
    """SGLang drafts a fixed γ: adaptive steps exist for EAGLE/EAGLE3 drafts only."""
    policy, runs = dep.policy, f"γ = {dep.gamma}"
    if varies(policy):
        return Fit(False, runs, (f"SGLang has no per-batch γ flag: {runs} (serving batch {policy.serving_batch})",))
    if policy.fixed_gamma() is not None:
        return Fit(True, runs)
    lost = (
        f"SGLang {SGLANG_VERSION} adapts steps only for EAGLE/EAGLE3 drafts (--speculative-adaptive; "
        f"STANDALONE and NGRAM fall back to static steps): the {policy.kind} policy becomes {runs}"
    )
    return Fit(False, runs, (lost,))


FORMAT = ExportFormat(
    name="sglang",
    label="SGLang",
    filename="sglang-flags.txt",
    language="bash",
    mime="text/plain",
    policy_support="fixed γ (adaptive steps exist for EAGLE/EAGLE3 drafts only)",
    config=config,
    draft_methods=BUILT_IN_DRAFTS,
)
