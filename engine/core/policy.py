"""Speculation policies: how many tokens to draft each step, when to stop early, and what to learn from a step.

The decoding loop (engine.core.decoder) asks its policy, every step:

1. ``length(state)``: how many tokens to draft at most (then capped by the tokens still to generate);
2. ``stop(position, confidence)``, after each drafted token when ``uses_confidence``: go on, stop keeping
   this token (KEEP, transformers' rule) or stop dropping it (DROP, llama.cpp's rule), given the draft's
   confidence in it (its largest next-token probability, softmax at temperature 1);
3. ``update(state, drafted, accepted)``: what the target accepted, for policies that adapt.

A draft shorter than ``min_draft`` is discarded (the step runs the target alone), as llama.cpp's n-min does.

Policies are frozen settings with pure methods; the state they adapt is a plain value threaded through the
calls (PolicyRun holds it for the loop, one per run, carried across the run's prompts like a server would).
The replay (engine.analysis.policy_replay) calls the very same methods on a recorded pass, so what it
predicts is what the loop does. Every policy keeps the output exact: it only decides how much to draft.

Policies and their spec strings (``parse_policy``):

* ``fixed:G``: γ = G every step (the default; DecodeConfig without a policy is ``fixed:gamma``);
* ``confidence:P[:NMAX[:NMIN[:keep]]]``: draft until the draft's confidence falls below P, at most NMAX
  tokens; drafts shorter than NMIN are discarded. The token below P is dropped (llama.cpp's
  ``--spec-draft-p-min``); with ``keep`` it is kept and drafting stops after it (transformers'
  ``assistant_confidence_threshold``);
* ``heuristic:START[:P]``: transformers' "heuristic" schedule: START tokens first, +2 after a step whose
  every drafted token was accepted, −1 otherwise (floor 1); with P, transformers' confidence stop as well;
* ``adaptive[:C1,C2,..[:INITIAL[:EMA[:INTERVAL[:WARMUP]]]]]``: SGLang's adaptive steps
  (sglang/srt/speculative/adaptive_spec_params.py, AdaptiveStepSlot): an EMA of accepted drafts picks γ
  among the candidates, re-decided every INTERVAL steps after WARMUP steps (defaults 1,3,5,7 : 3 : 0.2 : 5 : 10);
* ``batch:B=G,B=G,..[@SERVING]``: γ by serving batch size (vLLM's num_speculative_tokens_per_batch_size);
  the loop decodes one sequence, so it drafts the γ of the SERVING batch (default 1).

Each kind is registered once (``PolicyKind``: its grammar, parse, replay grid and simplicity); the built-in kinds
live in engine.core.policy_kinds, and another kind is added with ``register_policy_kind`` from its own module.
No code outside a policy's own module asks which kind it is: the loop calls the protocol, the replay asks each
kind for its grid, and engines and export formats read the policy's ``controls()`` (engine.core.policy_base).
"""

from __future__ import annotations

from engine.core.policy_base import (
    DROP,
    GO,
    KEEP,
    MAX_DRAFT,
    DraftControls,
    GridAsk,
    PolicyKind,
    SpeculationPolicy,
    Stop,
    go,
)
from engine.core.policy_kinds import (
    BUILTIN_KINDS,
    AdaptiveEMA,
    BatchSchedule,
    ConfidenceStop,
    FixedGamma,
    HeuristicSchedule,
)

_KINDS: dict[str, PolicyKind] = {kind.name: kind for kind in BUILTIN_KINDS}


def register_policy_kind(kind: PolicyKind) -> PolicyKind:
    """Add a kind of policy (once: the same record again is a no-op, another under a taken name a ValueError);
    returns it, so a module can write ``KIND = register_policy_kind(PolicyKind(...))``."""
    name = kind.name.lower()
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"policy kind name {kind.name!r}: a word without ':'")
    known = _KINDS.get(name)
    if known is not None and known != kind:
        raise ValueError(f"a policy kind named {name!r} is already registered")
    _KINDS[name] = kind
    return kind


def policy_kinds() -> list[PolicyKind]:
    """Every registered kind, simplest first."""
    return sorted(_KINDS.values(), key=lambda kind: kind.simplicity)


def simplicity(kind_name: str) -> int:
    """How simple a kind is (ties in a ranking go to the simpler one); unknown kinds rank last."""
    kind = _KINDS.get(kind_name)
    return kind.simplicity if kind is not None else max((k.simplicity for k in _KINDS.values()), default=0) + 1


def grammar() -> str:
    """Every kind's spec string, for help texts and error lines: 'fixed:G | confidence:P[..] | ...'."""
    return " | ".join(kind.grammar for kind in policy_kinds())


def policy_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    """Every setting of every kind the replay tries, in registration order (built-ins first)."""
    return [policy for kind in _KINDS.values() for policy in kind.grid(ask)]


def parse_policy(text: str, default_gamma: int = 4) -> SpeculationPolicy:
    """A policy from its spec string (see the module docstring); ValueError with one clear line otherwise."""
    raw = (text or "").strip()
    name, _, rest = raw.partition(":")
    kind = _KINDS.get(name.lower())
    if kind is None:
        raise ValueError(f"policy '{raw}': choose {grammar()}")
    return kind.parse(rest, default_gamma)


def describe(policy: SpeculationPolicy) -> str:
    """A short human label for a policy's setting ('p=0.6, n-max 16, n-min 2')."""
    return policy.describe()


class PolicyRun:
    """One run's policy and its state: the loop asks it and tells it, step by step, across the run's prompts."""

    def __init__(self, policy: SpeculationPolicy) -> None:
        self.policy = policy
        self.state = policy.start()

    def length(self) -> int:
        return self.policy.length(self.state)

    @property
    def stopper(self) -> Stop | None:
        """The confidence stop to hand a draft that reports confidence (None: draft the full length)."""
        return self.policy.stop if self.policy.uses_confidence else None

    def observe(self, drafted: int, accepted: int) -> None:
        self.state = self.policy.update(self.state, drafted, accepted)


__all__ = [
    "DROP", "GO", "KEEP", "MAX_DRAFT", "AdaptiveEMA", "BatchSchedule", "ConfidenceStop", "DraftControls",
    "FixedGamma", "GridAsk", "HeuristicSchedule", "PolicyKind", "PolicyRun", "SpeculationPolicy", "Stop",
    "describe", "go", "grammar", "parse_policy", "policy_grid", "policy_kinds", "register_policy_kind", "simplicity",
]  # fmt: skip
