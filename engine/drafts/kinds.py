"""The kinds of draft source, registered once: how a reference names each, and what each is to the rest of spectune.

A draft reference names one kind: "none" (the target alone), "ngram[:MIN-MAX]" (prompt lookup), "suffix[:…]"
(suffix decoding) or, the kind that takes every reference no other kind claims, a draft model. Each kind
declares what callers need of it, so they read a capability instead of asking which kind it is:

- `needs_model`: it loads a model of its own;
- `costs_forwards`: each drafted token costs a forward of that model (the draft cost c applies);
- `reports_confidence`: its proposals carry the draft's confidence (a confidence stop can fire);
- `speculates`: False only for the target alone;
- `replays`: its proposals are a function of the context alone, so the policy replay traces it by asking it at
  every position of the target's output (engine.measure.agreement); a draft model and suffix decoding have traces
  of their own;
- `engines`: the engines that sweep it (their registry names); another engine refuses it in one line;
- `as_lookup`: how an engine's n-gram lookup runs it (`AsLookup`: the window looked up and, where the lookup only
  stands in for it, what is lost), for the exports; None where a lookup cannot run it;
- `fresh_per_run`: its source learns across prompts (suffix decoding's cache), so each run starts from an empty
  one (its source's `fresh()`), and a run's drafts depend only on that run's own prompts in their order;
- `offered`: the reference a form offers for it (None: typed only, or a model chosen by name), and `help`, the
  sentence that says what it does.

Torch-free: the builders import their draft source when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.drafts.refs import SuffixParams, is_ngram, is_suffix, parse_ngram_spec, parse_suffix_spec
from engine.errors import SettingsError

if TYPE_CHECKING:
    from engine.core.model import LoadedModel
    from engine.core.proposal import DraftSource

Builder = Callable[[str, "LoadedModel", Callable[[str], Any], bool], "DraftSource"]


@dataclass(frozen=True)
class AsLookup:
    """How an engine's n-gram lookup runs a kind of draft: the (shortest, longest) window it looks up for a
    reference, and, where the lookup only stands in for the kind, what is lost (reference, engine, the engine's
    closest method) -> a sentence; None where the lookup is the kind itself."""

    window: Callable[[str], tuple[int, int]]
    lost: Callable[[str, str, str], str] | None = None

    @property
    def exact(self) -> bool:
        """Whether the lookup is the kind itself (its measurement names the window looked up)."""
        return self.lost is None


@dataclass(frozen=True)
class DraftKind:
    """One kind of draft source: its method name (as measurements keep it), its label, which references it claims,
    why one of them is malformed, how to build its source, and its capabilities (see the module docstring)."""

    method: str
    label: str
    claims: Callable[[str], bool]
    check: Callable[[str], str | None]  # why the reference is malformed, or None (a model is checked elsewhere)
    build: Builder  # (reference, target, model loader, may re-tokenize) -> the draft source
    needs_model: bool = False
    costs_forwards: bool = False
    reports_confidence: bool = False
    speculates: bool = True
    replays: bool = False
    fresh_per_run: bool = False
    measured_as: Callable[[str], dict[str, Any]] = lambda ref: {}  # the fields a measurement of it keeps (its window)
    engines: frozenset[str] = frozenset({"spectune"})
    as_lookup: AsLookup | None = None
    offered: str | None = None
    help: str = ""
    note: str = ""  # what a recommendation of it should add, in a sentence

    def runs_in(self, engine: str) -> bool:
        """Whether the engine registered as `engine` runs this kind."""
        return engine in self.engines

    def refused_by(self, engine: str, ref: str) -> str | None:
        """The one line refusing reference `ref` of this kind in `engine`, or None where the engine runs it."""
        if self.runs_in(engine):
            return None
        return f"{engine} has no {self.label}: measure '{ref}' with the {' or '.join(sorted(self.engines))} engine"


def check_by_parsing(parse: Callable[[str], Any]) -> Callable[[str], str | None]:
    """A kind's `check` from its parser: the parser's SettingsError as the reason, None when it parses."""

    def check(ref: str) -> str | None:
        try:
            parse(ref)
        except SettingsError as exc:
            return str(exc)
        return None

    return check


def _no_draft(ref: str, target: LoadedModel, loader: Callable[[str], Any], retokenize: bool) -> DraftSource:
    from engine.core.proposal import NoDraft

    return NoDraft()


def _ngram(ref: str, target: LoadedModel, loader: Callable[[str], Any], retokenize: bool) -> DraftSource:
    from engine.drafts.ngram import NgramDraft

    lo, hi = parse_ngram_spec(ref)
    return NgramDraft(max_ngram=hi, min_ngram=lo)


def _suffix(ref: str, target: LoadedModel, loader: Callable[[str], Any], retokenize: bool) -> DraftSource:
    from engine.drafts.suffix import SuffixDraft

    return SuffixDraft(parse_suffix_spec(ref), name=ref)


def _model(ref: str, target: LoadedModel, loader: Callable[[str], Any], retokenize: bool) -> DraftSource:
    from engine.drafts.model import ModelDraft
    from engine.drafts.retokenize import RetokenizingDraft, same_tokenizer
    from engine.errors import ModelError

    draft_model = loader(ref)
    if same_tokenizer(draft_model.tokenizer, target.tokenizer):
        return ModelDraft(draft_model, target.vocab_size, name=ref)
    if not retokenize:
        raise ModelError(f"draft '{ref}' uses a different tokenizer from the target '{target.ref}'")
    return RetokenizingDraft(draft_model, target.tokenizer, name=ref)


EVERY_ENGINE = frozenset({"spectune", "llama.cpp", "vllm"})  # the engines that sweep drafts themselves
NONE = DraftKind("none", "the target alone", lambda ref: ref == "none", lambda ref: None, _no_draft,
                 speculates=False, engines=EVERY_ENGINE)  # fmt: skip


def _ngram_window(ref: str) -> dict[str, Any]:
    lo, hi = parse_ngram_spec(ref)
    return {"ngram_min": lo, "ngram_max": hi}


NGRAM = DraftKind("ngram", "n-gram lookup", is_ngram, check_by_parsing(parse_ngram_spec), _ngram, replays=True,
                  measured_as=_ngram_window, engines=EVERY_ENGINE, as_lookup=AsLookup(parse_ngram_spec),
                  offered="ngram", help="'ngram' drafts by prompt lookup")  # fmt: skip
SUFFIX_NOTE = (
    "suffix decoding needs no second model and adds no draft load at peak (c = 0); its global tree learns from "
    "earlier responses, so its acceptance depends on the traffic it has seen: the session recorded the prompts' "
    "order and how warm the cache was for each (suffix_cache)"
)


def _suffix_params(ref: str) -> SuffixParams:
    """The parameters a suffix reference names (vLLM's defaults for one that names none)."""
    return parse_suffix_spec(ref) if is_suffix(ref) else SuffixParams()


def _suffix_window(ref: str) -> tuple[int, int]:
    """The n-gram lookup closest to suffix decoding: matches of one up to its tree depth − 1 tokens."""
    return 1, max(1, _suffix_params(ref).max_tree_depth - 1)


def _suffix_lost(ref: str, engine: str, closest: str) -> str:
    """What an engine without suffix decoding loses running `closest` instead."""
    p = _suffix_params(ref)
    return (
        f"{engine} has no suffix decoding: {closest} is its closest method. Lost: the global tree of earlier "
        f"responses (up to {p.max_cached_requests} requests), continuations scored by frequency (min token "
        f"probability {p.min_token_prob:g}) and a draft length that grows with the match (spec factor "
        f"{p.max_spec_factor:g} × match, depth {p.max_tree_depth}); expect lower acceptance on repetitive traffic"
    )


SUFFIX = DraftKind(
    "suffix",
    "suffix decoding",
    is_suffix,
    check_by_parsing(parse_suffix_spec),
    _suffix,
    note=SUFFIX_NOTE,
    engines=frozenset({"spectune", "vllm"}),
    as_lookup=AsLookup(_suffix_window, _suffix_lost),
    offered="suffix",
    fresh_per_run=True,
    help="'suffix' by suffix decoding (a suffix tree of the prompt and of earlier responses, warm after the first "
    "prompt)",
)
MODEL = DraftKind("draft_model", "a draft model", lambda ref: True, lambda ref: None, _model,
                  needs_model=True, costs_forwards=True, reports_confidence=True, engines=EVERY_ENGINE)  # fmt: skip

_KINDS: list[DraftKind] = [NONE, NGRAM, SUFFIX]  # a draft model takes every reference none of these claims


def register_draft_kind(kind: DraftKind) -> DraftKind:
    """Add a kind of draft source (once: the same record again is a no-op, another with a taken method a
    ValueError); returns it. It is asked before the draft model, which takes every other reference."""
    known = next((k for k in [*_KINDS, MODEL] if k.method == kind.method), None)
    if known is not None and known != kind:
        raise ValueError(f"a draft kind with method {kind.method!r} is already registered")
    if known is None:
        _KINDS.append(kind)
    return kind


def draft_kinds() -> list[DraftKind]:
    """Every registered kind, the draft model last."""
    return [*_KINDS, MODEL]


def draft_kind(ref: str) -> DraftKind:
    """The kind a draft reference names."""
    return next((kind for kind in _KINDS if kind.claims(ref)), MODEL)


def draft_method(ref: str) -> str:
    """The method a draft reference names: "none", "ngram", "suffix", "draft_model", or a registered kind's."""
    return draft_kind(ref).method


def kind_of_method(method: str | None) -> DraftKind:
    """The kind a measurement's method names ("ngram", "draft_model", ...); a draft model when unknown."""
    return next((kind for kind in _KINDS if kind.method == method), MODEL)
