"""Suffix decoding (SuffixDecoding, Snowflake's Arctic Inference; vLLM's `"method": "suffix"`) as a draft source.

The trees are Arctic Inference's own (`arctic_inference.suffix_decoding`, its C++ suffix tree, built by
`make setup` from the pinned sdist), driven exactly as vLLM's SuffixDecodingProposer drives them:

* a prompt tree per request, holding the prompt and the response so far;
* one global tree of responses across requests (the response being generated included), keeping the latest
  `max_cached_requests` (oldest evicted first; 0 turns the global tree off: the prompt tree only, "cold");
* each step matches the longest suffix of the last `max_tree_depth` tokens in both trees and follows the most
  frequent continuation while its estimated probability (the product of child/parent counts) stays ≥
  `min_token_prob`, at most `max_spec_factor` × the match length and at most γ tokens; of all match lengths and
  both trees, the draft with the largest score (the sum of its token probabilities) wins.

So a draft depends on the requests that ran before in this cache, in their order. One SuffixDraft is one
cache; `fresh()` gives an empty one with the same parameters (a run starts cold), and `requests` records, per
request, how many responses the global tree held when it started (0: cold; k > 0: warm after k requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.core.proposal import Proposal, matching_run
from engine.core.sampling import SamplingConfig
from engine.drafts.refs import SuffixParams


@dataclass(frozen=True)
class SuffixRequest:
    """One request as the cache saw it: its position in the order and the responses cached when it began."""

    order: int
    cached_before: int

    @property
    def warm(self) -> bool:
        return self.cached_before > 0


class SuffixDraft:
    """Prompt tree + global tree of earlier responses (Arctic Inference's SuffixDecodingCache), as vLLM runs it.

    Draft-free (c ≈ 0) and deterministic given the text and the cache: verification uses a one-hot q."""

    method = "suffix"

    def __init__(self, params: SuffixParams | None = None, name: str = "suffix") -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # built by `make setup`

        self.params = params or SuffixParams()
        self.name = name
        self.cache = SuffixDecodingCache(self.params.max_tree_depth, self.params.max_cached_requests)
        self.requests: list[SuffixRequest] = []
        self._active: int | None = None
        self._fed = 0  # tokens of the active request already in its trees

    def fresh(self) -> SuffixDraft:
        """An empty cache with the same parameters."""
        return SuffixDraft(self.params, self.name)

    @property
    def cached_requests(self) -> int:
        return len(self.cache.cached_requests)

    def trace(self, prompt_ids: Sequence[int], output_ids: list[int], cap: int) -> dict[str, Any]:
        """Its trace fields for the policy replay (engine.measure.agreement.draft_trace), from the cache as it
        stands (this request is then learnt into it)."""
        by_cap = suffix_runs(self, prompt_ids, output_ids, sorted({*range(1, min(cap, 16) + 1), cap}))
        runs, proposable = by_cap[cap]
        state = self.requests[-1]
        return {
            "method": self.method,
            "runs": runs,
            "proposable": proposable,
            "order": state.order,
            "cached_before": state.cached_before,
            "gamma_exceptions": gamma_exceptions(by_cap, cap),
        }

    def start(self, prompt_ids: list[int]) -> None:
        """A new request: the previous one stops (its response stays cached); this prompt gets its own tree."""
        self._stop()
        order = len(self.requests)
        self.requests.append(SuffixRequest(order, self.cached_requests))
        self.cache.start_request(order, list(prompt_ids))
        self._active, self._fed = order, len(prompt_ids)

    def _feed(self, tokens: Sequence[int]) -> None:
        if self._active is None:
            raise RuntimeError("suffix draft: start() a request before proposing")
        if len(tokens) > self._fed:
            self.cache.add_active_response(self._active, list(tokens[self._fed :]))
            self._fed = len(tokens)

    def lookup(self, tokens: Sequence[int], gamma: int) -> list[int]:
        """The draft for context `tokens` (prompt + output so far), up to `gamma` tokens; learns the new tokens."""
        self._feed(tokens)
        if gamma <= 0:
            return []
        p = self.params
        draft = self.cache.speculate(
            self._active,
            list(tokens[-p.max_tree_depth :]),
            max_spec_tokens=gamma,
            max_spec_factor=p.max_spec_factor,
            min_token_prob=p.min_token_prob,
        )
        return list(draft.token_ids)

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal(self.lookup(tokens, gamma), None, 0)

    def commit(self, n_valid: int) -> None:
        pass

    def finish(self, tokens: Sequence[int]) -> None:
        """The request ended with `tokens`: its whole response goes into the global tree and it stops."""
        if self._active is not None:
            self._feed(tokens)
        self._stop()

    def _stop(self) -> None:
        if self._active is not None:
            self.cache.stop_request(self._active)
            self._active = None


def suffix_runs(
    draft: SuffixDraft, prompt_ids: Sequence[int], output_ids: Sequence[int], caps: Sequence[int]
) -> dict[int, tuple[list[int], list[int]]]:
    """Along a finished output, per cap in `caps`: (runs, proposable) per position — how many of the draft's
    up-to-cap tokens from there match the output, and how many it proposed. A cap is γ as vLLM passes it (its
    max_spec_tokens): the best-scoring draft within `cap` tokens may start differently from a longer one's, so
    each cap is looked up for itself. The request is started and finished in `draft`'s cache, so it learns this
    output as a live request would."""
    draft.start(list(prompt_ids))
    context = list(prompt_ids)
    out: dict[int, tuple[list[int], list[int]]] = {cap: ([], []) for cap in caps}
    for t, token in enumerate(output_ids):
        for cap, (runs, proposable) in out.items():
            proposal = draft.lookup(context, cap)
            runs.append(matching_run(proposal, output_ids[t:]))
            proposable.append(len(proposal))
        context.append(token)
    draft.finish(context)
    return out


def replay_fixed(draft: SuffixDraft, prompt_ids: Sequence[int], output_ids: Sequence[int], gamma: int) -> int:
    """Target calls the loop makes at fixed γ (temperature 0) to produce `output_ids`, the target's greedy output:
    each step drafts from the cache as the loop would (at most γ and at most the tokens left but one), keeps the
    drafted tokens that match the output and one more. Exact without a model: the draft is a function of the text.
    The request is learnt into `draft`'s cache as a live one."""
    draft.start(list(prompt_ids))
    context, t, calls = list(prompt_ids), 0, 0
    n = len(output_ids)
    while t < n:
        proposal = draft.lookup(context, min(gamma, n - t - 1))
        run = 0
        for p, o in zip(proposal, output_ids[t:], strict=False):
            if p != o:
                break
            run += 1
        context.extend(output_ids[t : t + run + 1])
        t, calls = t + run + 1, calls + 1
    draft.finish(context)
    return calls


def gamma_exceptions(by_cap: dict[int, tuple[list[int], list[int]]], cap: int) -> dict[str, dict[str, list[int]]]:
    """Where a smaller γ's draft is not the cap's draft cut to γ: {γ: {position: [run, proposable]}} (JSON keys).
    Empty for most texts; a replay at γ reads these positions instead of min(γ, …) of the cap's."""
    runs_cap, prop_cap = by_cap[cap]
    out: dict[str, dict[str, list[int]]] = {}
    for gamma, (runs, proposable) in sorted(by_cap.items()):
        if gamma == cap:
            continue
        diff = {
            str(t): [r, p]
            for t, (r, p) in enumerate(zip(runs, proposable, strict=True))
            if (r, p) != (min(gamma, runs_cap[t]), min(gamma, prop_cap[t]))
        }
        if diff:
            out[str(gamma)] = diff
    return out


def suffix_state(runs: dict[str, object], prompt_ids: Sequence[str]) -> dict[str, object]:
    """What a session keeps of its suffix caches: the order its prompts ran in and, per run (label → its draft
    source), how many earlier responses were cached when each prompt began (0: cold). Empty without suffix runs."""
    caches = {label: source for label, source in runs.items() if isinstance(source, SuffixDraft)}
    if not caches:
        return {}
    per_run = {
        label: [
            {
                "prompt_id": prompt_ids[r.order] if r.order < len(prompt_ids) else None,
                "cached_before": r.cached_before,
                "warm": r.warm,
            }
            for r in source.requests
        ]
        for label, source in caches.items()
    }
    return {"suffix_cache": {"prompt_order": list(prompt_ids), "runs": per_run}}
