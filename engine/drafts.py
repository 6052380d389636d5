"""Draft sources behind one small interface (cf. transformers' CandidateGenerator).

A draft source proposes up to γ next tokens for the target to verify. It may return the
distribution q it sampled each token from (a draft model at temperature > 0) or None, meaning
the proposal is a deterministic function of the context (n-gram lookup, re-tokenised drafts,
any greedy draft): rejection sampling then uses a one-hot q, which keeps the output exactly the
target's distribution whatever the proposal mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.errors import ModelError
from engine.loading import LoadedModel
from engine.sampling import SamplingConfig, probabilities, sample
from engine.settings import NGRAM_DEFAULT, parse_ngram_spec


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # (len(tokens), V) float32, or None for a deterministic proposal
    forwards: int  # draft model forward calls spent


class DraftSource(Protocol):
    name: str
    method: str  # "draft_model" | "ngram" | "none"

    def start(self, prompt_ids: list[int]) -> None:
        """Forget all state: a new prompt begins."""

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        """Propose up to `gamma` tokens that continue `tokens` (prompt + output so far)."""

    def commit(self, n_valid: int) -> None:
        """Only tokens[:n_valid] of the last proposal's context are final; drop cached state past it."""


class NoDraft:
    """Target alone: the autoregressive baseline runs through the same loop with γ = 0."""

    name = "none"
    method = "none"

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal([], None, 0)

    def commit(self, n_valid: int) -> None:
        pass


class NgramDraft:
    """Prompt lookup: find the latest earlier occurrence of the trailing n-gram, propose what followed.

    Draft-free (c ≈ 0): it pays on inputs that get copied into the output (code edits, RAG, summaries).
    """

    method = "ngram"

    def __init__(self, max_ngram: int = NGRAM_DEFAULT[1], min_ngram: int = NGRAM_DEFAULT[0]) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = "ngram"

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], gamma: int) -> list[int]:
        n_tokens = len(tokens)
        for n in range(min(self.max_ngram, n_tokens - 1), self.min_ngram - 1, -1):
            tail = tokens[n_tokens - n :]
            # search right-to-left for the most recent earlier match with a continuation
            for start in range(n_tokens - n - 1, -1, -1):
                if tokens[start : start + n] == tail:
                    follow = tokens[start + n : start + n + gamma]
                    if follow:
                        return follow
        return []

    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        return Proposal(self.lookup(tokens, gamma) if gamma > 0 else [], None, 0)

    def commit(self, n_valid: int) -> None:
        pass


def forward_step(model: LoadedModel, input_ids: list[int], cache: object, keep: int) -> torch.Tensor:
    """One forward over `input_ids` appended to `cache`; logits of the last `keep` positions, (keep, V)."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    out = model.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def crop_to(cache: object, length: int) -> None:
    """Roll a KV cache back to `length` positions (transformers 5 crops by a negative count)."""
    current = cache.get_seq_length()
    if current > length:
        cache.crop(length - current)


def new_cache(model: LoadedModel) -> object:
    from transformers import DynamicCache

    return DynamicCache(config=model.model.config)


class ModelDraft:
    """A smaller causal LM sharing the target's tokenizer, with its own KV cache and rollback."""

    method = "draft_model"

    def __init__(self, draft: LoadedModel, target_vocab: int, name: str | None = None) -> None:
        self.draft = draft
        self.name = name or draft.ref
        self.target_vocab = target_vocab
        self.cache: object = None
        self.cached_len = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = new_cache(self.draft)
        self.cached_len = 0

    def _fit_vocab(self, q: torch.Tensor) -> torch.Tensor:
        """Draft and target embeddings may be padded differently; align q to the target's vocabulary."""
        v = q.shape[-1]
        if v == self.target_vocab:
            return q
        if v > self.target_vocab:
            q = q[..., : self.target_vocab]
            return q / q.sum(-1, keepdim=True).clamp_min(1e-30)
        return torch.nn.functional.pad(q, (0, self.target_vocab - v))

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        if gamma <= 0:
            return Proposal([], None, 0)
        feed = tokens[self.cached_len :]
        proposed: list[int] = []
        qs: list[torch.Tensor] = []
        for _ in range(gamma):
            logits = forward_step(self.draft, feed, self.cache, 1)[0]
            self.cached_len += len(feed)
            if cfg.greedy:
                token = int(logits.argmax())
            else:
                q = self._fit_vocab(probabilities(logits, cfg))
                token = sample(q, gen)
                qs.append(q)
            proposed.append(token)
            feed = [token]
        q_all = torch.stack(qs) if qs else None
        return Proposal(proposed, q_all, gamma)

    def commit(self, n_valid: int) -> None:
        if self.cached_len > n_valid:
            crop_to(self.cache, n_valid)
            self.cached_len = n_valid


class RetokenizingDraft:
    """A draft with a different tokenizer: context and proposals cross over as text.

    The draft sees the target's context re-tokenised with its own tokenizer (its KV cache is kept
    up to the longest common prefix), drafts greedily, and its text is re-tokenised for the target.
    The proposal is deterministic given the context, so verification uses a one-hot q and the
    output stays exactly the target's distribution; only acceptance suffers from boundary effects.
    """

    method = "draft_model"

    def __init__(self, draft: LoadedModel, target_tokenizer: object, name: str | None = None) -> None:
        self.draft = draft
        self.target_tokenizer = target_tokenizer
        self.name = name or draft.ref
        self.cache: object = None
        self.cached_ids: list[int] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = new_cache(self.draft)
        self.cached_ids = []

    @torch.inference_mode()
    def propose(self, tokens: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Proposal:
        if gamma <= 0:
            return Proposal([], None, 0)
        text = self.target_tokenizer.decode(tokens, skip_special_tokens=False)
        draft_ids = self.draft.tokenizer.encode(text, add_special_tokens=False)
        if not draft_ids:
            return Proposal([], None, 0)
        common = 0
        limit = min(len(draft_ids) - 1, len(self.cached_ids))  # always feed at least one token
        while common < limit and draft_ids[common] == self.cached_ids[common]:
            common += 1
        if len(self.cached_ids) > common:
            crop_to(self.cache, common)
        feed = draft_ids[common:]
        self.cached_ids = draft_ids[:common]
        new_ids: list[int] = []
        forwards = 0
        # draft a little more than gamma: target tokens are often longer than draft tokens
        for _ in range(gamma + 2):
            logits = forward_step(self.draft, feed, self.cache, 1)[0]
            forwards += 1
            self.cached_ids.extend(feed)
            token = int(logits.argmax())
            new_ids.append(token)
            feed = [token]
            if token == self.draft.tokenizer.eos_token_id:
                break
        new_text = self.draft.tokenizer.decode(new_ids, skip_special_tokens=False)
        proposal = self.target_tokenizer.encode(new_text, add_special_tokens=False)[:gamma]
        return Proposal(proposal, None, forwards)

    def commit(self, n_valid: int) -> None:
        pass  # state is re-derived from text on every proposal


def same_tokenizer(a: object, b: object) -> bool:
    """Two tokenizers are interchangeable when their vocabularies map the same strings to the same ids."""
    if a is b:
        return True
    try:
        return a.get_vocab() == b.get_vocab()
    except Exception:  # tokenizers without get_vocab: compare on a probe string
        probe = "def f(x):\n    return x * 2  # héllo 世界"
        return a.encode(probe) == b.encode(probe)


def make_draft(
    ref: str,
    target: LoadedModel,
    loader: object,
    allow_retokenize: bool = True,
) -> DraftSource:
    """Build the draft source a CLI/UI reference names: 'none', 'ngram', or a model reference."""
    if ref == "none":
        return NoDraft()
    if ref == "ngram" or ref.startswith("ngram:"):
        lo, hi = parse_ngram_spec(ref)
        return NgramDraft(max_ngram=hi, min_ngram=lo)
    draft_model = loader(ref)
    if same_tokenizer(draft_model.tokenizer, target.tokenizer):
        return ModelDraft(draft_model, target.vocab_size, name=ref)
    if not allow_retokenize:
        raise ModelError(f"draft '{ref}' uses a different tokenizer from the target '{target.ref}'")
    return RetokenizingDraft(draft_model, target.tokenizer, name=ref)
