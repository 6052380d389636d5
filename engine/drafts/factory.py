"""Build the draft source a reference names, through its kind (engine.drafts.kinds)."""

from __future__ import annotations

from engine.core.model import LoadedModel
from engine.core.proposal import DraftSource
from engine.drafts.kinds import draft_kind, kind_of_method


def make_draft(
    ref: str,
    target: LoadedModel,
    loader: object,
    allow_retokenize: bool = True,
) -> DraftSource:
    """Build the draft source a CLI/UI reference names: 'none', 'ngram', 'suffix', a registered kind's, or a model
    reference."""
    return draft_kind(ref).build(ref, target, loader, allow_retokenize)  # type: ignore[arg-type]


def for_one_run(source: DraftSource) -> DraftSource:
    """The source a run decodes with: a kind that learns across prompts (`fresh_per_run`: suffix decoding's cache)
    starts empty for each run, so a run's drafts depend only on the run's own prompts in their order (its source's
    `fresh()`); every other source is shared."""
    if kind_of_method(source.method).fresh_per_run:
        return source.fresh()  # type: ignore[attr-defined]
    return source
