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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

GO, KEEP, DROP = "go", "keep", "drop"  # stop() answers: draft on; stop after this token; stop before it
MAX_DRAFT = 64  # no policy drafts more per step (the session's largest γ)
KINDS = ("fixed", "confidence", "heuristic", "adaptive", "batch")

Stop = Callable[[int, float], str]  # (1-based drafted position, the draft's confidence) -> GO | KEEP | DROP


class SpeculationPolicy(Protocol):
    kind: ClassVar[str]
    uses_confidence: ClassVar[bool]
    varies_per_step: ClassVar[bool]  # its γ can change from one step to the next (not only with the batch size)
    carries_state: ClassVar[bool]  # its γ depends on what earlier steps accepted (a replay must keep its order)

    def fixed_gamma(self) -> int | None:
        """The one γ it drafts at every step and every batch size; None where its γ varies."""

    def batch_schedule(self) -> dict[int, int] | None:
        """{serving batch: γ} where its γ is chosen by the batch size; None otherwise."""

    @property
    def min_draft(self) -> int:
        """Drafts shorter than this are discarded (0: keep every draft)."""

    def spec(self) -> str:
        """The spec string parse_policy reads back."""

    def max_draft(self) -> int:
        """The most tokens one step may draft."""

    def start(self) -> Any:
        """The state before the first step of a run."""

    def length(self, state: Any) -> int:
        """How many tokens to draft this step (at most)."""

    def stop(self, position: int, confidence: float) -> str:
        """After drafting token `position` (1-based) with this confidence: GO, KEEP or DROP."""

    def update(self, state: Any, drafted: int, accepted: int) -> Any:
        """The state after a step that drafted `drafted` tokens of which the target accepted `accepted`."""


def _go(position: int, confidence: float) -> str:
    return GO


@dataclass(frozen=True)
class FixedGamma:
    """γ tokens every step: what DecodeConfig(gamma) has always done."""

    gamma: int
    kind: ClassVar[str] = "fixed"
    uses_confidence: ClassVar[bool] = False
    varies_per_step: ClassVar[bool] = False
    carries_state: ClassVar[bool] = False
    min_draft: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.gamma <= MAX_DRAFT:
            raise ValueError(f"fixed γ = {self.gamma}: must be between 0 and {MAX_DRAFT}")

    def fixed_gamma(self) -> int | None:
        return self.gamma

    def batch_schedule(self) -> dict[int, int] | None:
        return None

    def spec(self) -> str:
        return f"fixed:{self.gamma}"

    def max_draft(self) -> int:
        return self.gamma

    def start(self) -> None:
        return None

    def length(self, state: Any) -> int:
        return self.gamma

    stop = staticmethod(_go)

    def update(self, state: Any, drafted: int, accepted: int) -> None:
        return None


@dataclass(frozen=True)
class ConfidenceStop:
    """Draft while the draft is sure: stop at the first token whose confidence is below p_min.

    keep_last=False drops that token (llama.cpp: `if (cur_p->data[0].p < p_min) break;` before the push);
    keep_last=True keeps it and stops after it (transformers' ConfidenceCriteria). Drafts shorter than
    n_min are discarded (llama.cpp's --spec-draft-n-min)."""

    p_min: float
    n_max: int = 16
    n_min: int = 0
    keep_last: bool = False
    kind: ClassVar[str] = "confidence"
    uses_confidence: ClassVar[bool] = True
    varies_per_step: ClassVar[bool] = True
    carries_state: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"confidence p = {self.p_min}: must be between 0 and 1")
        if not 1 <= self.n_max <= MAX_DRAFT:
            raise ValueError(f"confidence n-max = {self.n_max}: must be between 1 and {MAX_DRAFT}")
        if not 0 <= self.n_min <= self.n_max:
            raise ValueError(f"confidence n-min = {self.n_min}: must be between 0 and n-max ({self.n_max})")

    @property
    def min_draft(self) -> int:
        return self.n_min

    def fixed_gamma(self) -> int | None:
        return None

    def batch_schedule(self) -> dict[int, int] | None:
        return None

    def spec(self) -> str:
        return f"confidence:{self.p_min:g}:{self.n_max}:{self.n_min}" + (":keep" if self.keep_last else "")

    def max_draft(self) -> int:
        return self.n_max

    def start(self) -> None:
        return None

    def length(self, state: Any) -> int:
        return self.n_max

    def stop(self, position: int, confidence: float) -> str:
        if confidence < self.p_min:
            return KEEP if self.keep_last else DROP
        return GO

    def update(self, state: Any, drafted: int, accepted: int) -> None:
        return None


@dataclass(frozen=True)
class HeuristicSchedule:
    """transformers' num_assistant_tokens_schedule="heuristic" (candidate_generator.update_candidate_strategy):
    start at `start`; +2 when every drafted token was accepted, else −1 (never below 1). With p_min > 0,
    transformers' confidence stop too (the unsure token is kept). The state carries over the run's prompts,
    as transformers keeps it on the assistant's generation_config between generate() calls."""

    start_tokens: int = 20
    p_min: float = 0.0
    cap: int = MAX_DRAFT
    kind: ClassVar[str] = "heuristic"
    varies_per_step: ClassVar[bool] = True
    carries_state: ClassVar[bool] = True
    min_draft: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.start_tokens <= self.cap <= MAX_DRAFT:
            raise ValueError(f"heuristic start = {self.start_tokens}: must be between 1 and {min(self.cap, MAX_DRAFT)}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"heuristic confidence p = {self.p_min}: must be between 0 and 1")

    @property
    def uses_confidence(self) -> bool:  # type: ignore[override]
        return self.p_min > 0

    def fixed_gamma(self) -> int | None:
        return None

    def batch_schedule(self) -> dict[int, int] | None:
        return None

    def spec(self) -> str:
        return f"heuristic:{self.start_tokens}" + (f":{self.p_min:g}" if self.p_min > 0 else "")

    def max_draft(self) -> int:
        return self.cap

    def start(self) -> int:
        return self.start_tokens

    def length(self, state: int) -> int:
        return min(int(state), self.cap)

    def stop(self, position: int, confidence: float) -> str:
        return KEEP if confidence < self.p_min else GO

    def update(self, state: int, drafted: int, accepted: int) -> int:
        return min(state + 2, self.cap) if accepted == drafted else max(1, state - 1)


@dataclass(frozen=True)
class AdaptiveEMA:
    """SGLang's adaptive speculation (AdaptiveStepSlot, batch-size slot 1), step for step.

    The EMA of accepted drafts per step (weight `ema`) starts at initial − 1; after `warmup` steps and then
    every `interval` steps γ moves down one candidate while the EMA is at or below (previous − 0.5 + down),
    else up one while it is above (current − 0.5 + up). A 0 candidate turns drafting off until the next probe.
    The state is (γ, EMA, steps seen) and carries over the run's prompts, as a server's does."""

    candidates: tuple[int, ...] = (1, 3, 5, 7)
    initial: int = 3
    ema: float = 0.2
    interval: int = 5
    warmup: int = 10
    down: float = -0.25
    up: float = 0.0
    kind: ClassVar[str] = "adaptive"
    uses_confidence: ClassVar[bool] = False
    varies_per_step: ClassVar[bool] = True
    carries_state: ClassVar[bool] = True
    min_draft: int = 0

    def __post_init__(self) -> None:
        cands = tuple(sorted(set(int(c) for c in self.candidates)))
        if not cands or cands[0] < 0 or cands[-1] > MAX_DRAFT:
            raise ValueError(f"adaptive candidates {self.candidates}: need values between 0 and {MAX_DRAFT}")
        object.__setattr__(self, "candidates", cands)
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"adaptive EMA weight = {self.ema}: must be in (0, 1]")
        if self.interval < 1 or self.warmup < 0:
            raise ValueError("adaptive interval must be at least 1 and warm-up at least 0")

    def fixed_gamma(self) -> int | None:
        return None

    def batch_schedule(self) -> dict[int, int] | None:
        return None

    def spec(self) -> str:
        cands = ",".join(map(str, self.candidates))
        return f"adaptive:{cands}:{self.initial}:{self.ema:g}:{self.interval}:{self.warmup}"

    def max_draft(self) -> int:
        return self.candidates[-1]

    def start(self) -> tuple[int, float, int]:
        steps = self.initial if self.initial in self.candidates else self.candidates[len(self.candidates) // 2]
        return (steps, float(steps - 1), 0)

    def length(self, state: tuple[int, float, int]) -> int:
        return state[0]

    stop = staticmethod(_go)

    def update(self, state: tuple[int, float, int], drafted: int, accepted: int) -> tuple[int, float, int]:
        steps, ema, count = state
        if steps > 0:
            ema = (1 - self.ema) * ema + self.ema * accepted
        count += 1
        if count <= self.warmup or (count - self.warmup) % self.interval != 0:
            return (steps, ema, count)
        return (*self._recompute(steps, ema), count)

    def _recompute(self, steps: int, ema: float) -> tuple[int, float]:
        cands = self.candidates
        idx = old = cands.index(steps)
        if steps == 0:  # probe the smallest positive step after a nospec interval
            idx = min(idx + 1, len(cands) - 1)
            if cands[idx] > 0 and ema < 0:
                ema = float(cands[idx] - 1)
            return cands[idx], ema
        while idx > 0:
            prev = cands[idx - 1]
            threshold = (0.5 if prev == 0 else prev - 0.5) + self.down
            if ema > threshold:
                break
            idx -= 1
        if idx == old:
            while idx < len(cands) - 1 and ema > cands[idx] - 0.5 + self.up:
                idx += 1
        return cands[idx], ema


@dataclass(frozen=True)
class BatchSchedule:
    """γ by serving batch size ({batch: γ}, each γ holding up to the next listed batch); the loop decodes one
    sequence at a time, so it drafts the γ of `serving_batch`."""

    schedule: tuple[tuple[int, int], ...]
    serving_batch: int = 1
    kind: ClassVar[str] = "batch"
    uses_confidence: ClassVar[bool] = False
    varies_per_step: ClassVar[bool] = False
    carries_state: ClassVar[bool] = False
    min_draft: int = 0

    def __post_init__(self) -> None:
        points = tuple(sorted((int(b), int(g)) for b, g in self.schedule))
        if not points or points[0][0] < 1 or any(not 0 <= g <= MAX_DRAFT for _, g in points):
            raise ValueError(f"batch schedule {self.schedule}: need batch ≥ 1 and γ between 0 and {MAX_DRAFT}")
        object.__setattr__(self, "schedule", points)

    def gamma_at(self, batch: int) -> int:
        gamma = self.schedule[0][1]
        for b, g in self.schedule:
            if b <= batch:
                gamma = g
        return gamma

    def fixed_gamma(self) -> int | None:
        return None

    def batch_schedule(self) -> dict[int, int] | None:
        return dict(self.schedule)

    def spec(self) -> str:
        text = "batch:" + ",".join(f"{b}={g}" for b, g in self.schedule)
        return text + (f"@{self.serving_batch}" if self.serving_batch != 1 else "")

    def max_draft(self) -> int:
        return self.gamma_at(self.serving_batch)

    def start(self) -> None:
        return None

    def length(self, state: Any) -> int:
        return self.gamma_at(self.serving_batch)

    stop = staticmethod(_go)

    def update(self, state: Any, drafted: int, accepted: int) -> None:
        return None


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


def _number(text: str, kind: type, what: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{what}: '{text}' is not a {'whole number' if kind is int else 'number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}: '{text}' is not finite")
    return value


def parse_policy(text: str, default_gamma: int = 4) -> SpeculationPolicy:
    """A policy from its spec string (see the module docstring); ValueError with one clear line otherwise."""
    raw = (text or "").strip()
    kind, _, rest = raw.partition(":")
    parts = rest.split(":") if rest else []
    kind = kind.lower()
    if kind == "fixed":
        return FixedGamma(_number(parts[0], int, "fixed γ") if parts else default_gamma)
    if kind == "confidence":
        if not parts or len(parts) > 4:
            raise ValueError("confidence policy: write confidence:P[:NMAX[:NMIN[:keep]]], e.g. confidence:0.6:16:2")
        keep = len(parts) == 4
        if keep and parts[3].lower() != "keep":
            raise ValueError(f"confidence policy: the fourth field must be 'keep', not '{parts[3]}'")
        return ConfidenceStop(
            _number(parts[0], float, "confidence p"),
            _number(parts[1], int, "confidence n-max") if len(parts) > 1 else 16,
            _number(parts[2], int, "confidence n-min") if len(parts) > 2 else 0,
            keep_last=keep,
        )
    if kind == "heuristic":
        if len(parts) > 2:
            raise ValueError("heuristic policy: write heuristic:START[:P], e.g. heuristic:20")
        return HeuristicSchedule(
            _number(parts[0], int, "heuristic start") if parts else 20,
            _number(parts[1], float, "heuristic confidence p") if len(parts) > 1 else 0.0,
        )
    if kind == "adaptive":
        if len(parts) > 5:
            raise ValueError("adaptive policy: write adaptive[:C1,C2,..[:INITIAL[:EMA[:INTERVAL[:WARMUP]]]]]")
        args: dict[str, Any] = {}
        if parts and parts[0]:
            args["candidates"] = tuple(_number(c, int, "adaptive candidate") for c in parts[0].split(","))
        names = (("initial", int), ("ema", float), ("interval", int), ("warmup", int))
        for (name, kind_of), value in zip(names, parts[1:], strict=False):
            args[name] = _number(value, kind_of, f"adaptive {name}")
        return AdaptiveEMA(**args)
    if kind == "batch":
        body, _, serving = rest.partition("@")
        points = []
        for item in filter(None, body.split(",")):
            b, eq, g = item.partition("=")
            if not eq:
                raise ValueError(f"batch policy: '{item}' is not BATCH=γ (e.g. batch:1=4,8=2,32=1)")
            points.append((_number(b, int, "batch size"), _number(g, int, "batch γ")))
        if not points:
            raise ValueError("batch policy: write batch:B=G,B=G,..[@SERVING], e.g. batch:1=4,8=2,32=1")
        return BatchSchedule(tuple(points), _number(serving, int, "serving batch") if serving else 1)
    raise ValueError(
        f"policy '{raw}': choose fixed:G, confidence:P[:NMAX[:NMIN]], heuristic:START, adaptive[:...] or batch:B=G,.."
    )


def describe(policy: SpeculationPolicy) -> str:
    """A short human label for a policy's setting ('p=0.6, n-max 16, n-min 2')."""
    if isinstance(policy, FixedGamma):
        return f"γ={policy.gamma}"
    if isinstance(policy, ConfidenceStop):
        text = f"p={policy.p_min:g}, n-max {policy.n_max}"
        text += f", n-min {policy.n_min}" if policy.n_min else ""
        return text + (", keep unsure token" if policy.keep_last else "")
    if isinstance(policy, HeuristicSchedule):
        return f"start {policy.start_tokens}" + (f", p={policy.p_min:g}" if policy.p_min > 0 else "")
    if isinstance(policy, AdaptiveEMA):
        return (
            f"γ∈{{{','.join(map(str, policy.candidates))}}}, start {policy.initial}, EMA {policy.ema:g}, "
            f"every {policy.interval} after {policy.warmup}"
        )
    if isinstance(policy, BatchSchedule):
        return ", ".join(f"b≥{b}: γ={g}" for b, g in policy.schedule) + f" (serving batch {policy.serving_batch})"
    return policy.spec()
