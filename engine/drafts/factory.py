"""Build the draft source a reference names: 'none', 'ngram[:MIN-MAX]', 'suffix[:…]', or a model reference."""

from __future__ import annotations

from engine.core.model import LoadedModel
from engine.core.proposal import DraftSource, NoDraft
from engine.drafts.model import ModelDraft
from engine.drafts.ngram import NgramDraft
from engine.drafts.refs import is_ngram, is_suffix, parse_ngram_spec, parse_suffix_spec
from engine.drafts.retokenize import RetokenizingDraft, same_tokenizer
from engine.drafts.suffix import SuffixDraft
from engine.errors import ModelError


def make_draft(
    ref: str,
    target: LoadedModel,
    loader: object,
    allow_retokenize: bool = True,
) -> DraftSource:
    """Build the draft source a CLI/UI reference names: 'none', 'ngram', 'suffix', or a model reference."""
    if ref == "none":
        return NoDraft()
    if is_ngram(ref):
        lo, hi = parse_ngram_spec(ref)
        return NgramDraft(max_ngram=hi, min_ngram=lo)
    if is_suffix(ref):
        return SuffixDraft(parse_suffix_spec(ref), name=ref)
    draft_model = loader(ref)
    if same_tokenizer(draft_model.tokenizer, target.tokenizer):
        return ModelDraft(draft_model, target.vocab_size, name=ref)
    if not allow_retokenize:
        raise ModelError(f"draft '{ref}' uses a different tokenizer from the target '{target.ref}'")
    return RetokenizingDraft(draft_model, target.tokenizer, name=ref)


def for_one_run(source: DraftSource) -> DraftSource:
    """The source a run decodes with: a stateful draft (suffix decoding's cache) starts empty for each run, so a
    run's drafts depend only on the run's own prompts in their order; stateless drafts are shared."""
    return source.fresh() if isinstance(source, SuffixDraft) else source
