"""The built-in speculation policies, each a frozen settings class with pure methods, and their kind records
(parse, replay grid, simplicity) that engine.core.policy registers. The module docstring of engine.core.policy
gives their spec strings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from engine.core.policy_base import (
    DROP,
    GO,
    KEEP,
    MAX_DRAFT,
    DraftControls,
    GridAsk,
    PolicyKind,
    SpeculationPolicy,
    go,
    number,
)


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

    def describe(self) -> str:
        return f"γ={self.gamma}"

    def controls(self) -> DraftControls:
        return DraftControls(self.gamma)

    def max_draft(self) -> int:
        return self.gamma

    def start(self) -> None:
        return None

    def length(self, state: Any) -> int:
        return self.gamma

    stop = staticmethod(go)

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

    def describe(self) -> str:
        text = f"p={self.p_min:g}, n-max {self.n_max}" + (f", n-min {self.n_min}" if self.n_min else "")
        return text + (", keep unsure token" if self.keep_last else "")

    def controls(self) -> DraftControls:
        return DraftControls(self.n_max, self.n_min, self.p_min, keeps_unsure=self.keep_last)

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

    def describe(self) -> str:
        return f"start {self.start_tokens}" + (f", p={self.p_min:g}" if self.p_min > 0 else "")

    def controls(self) -> DraftControls:
        return DraftControls(self.start_tokens, p_min=self.p_min, keeps_unsure=self.p_min > 0, schedule="heuristic")

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

    def describe(self) -> str:
        return (
            f"γ∈{{{','.join(map(str, self.candidates))}}}, start {self.initial}, EMA {self.ema:g}, "
            f"every {self.interval} after {self.warmup}"
        )

    def controls(self) -> DraftControls:
        return DraftControls(self.max_draft(), beyond=(("acceptance-driven γ", "SGLang's EMA rule"),))

    def max_draft(self) -> int:
        return self.candidates[-1]

    def start(self) -> tuple[int, float, int]:
        steps = self.initial if self.initial in self.candidates else self.candidates[len(self.candidates) // 2]
        return (steps, float(steps - 1), 0)

    def length(self, state: tuple[int, float, int]) -> int:
        return state[0]

    stop = staticmethod(go)

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

    def describe(self) -> str:
        return ", ".join(f"b≥{b}: γ={g}" for b, g in self.schedule) + f" (serving batch {self.serving_batch})"

    def controls(self) -> DraftControls:
        gamma = self.gamma_at(self.serving_batch)
        if len({g for _, g in self.schedule}) == 1:
            return DraftControls(gamma)
        return DraftControls(gamma, beyond=(("per-batch γ", f"γ by batch size (serving batch {self.serving_batch})"),))

    def max_draft(self) -> int:
        return self.gamma_at(self.serving_batch)

    def start(self) -> None:
        return None

    def length(self, state: Any) -> int:
        return self.gamma_at(self.serving_batch)

    stop = staticmethod(go)

    def update(self, state: Any, drafted: int, accepted: int) -> None:
        return None


# ---- parsing: each kind reads the text after "name:" ---------------------------------------------------------


def _parse_fixed(rest: str, default_gamma: int) -> SpeculationPolicy:
    parts = rest.split(":") if rest else []
    return FixedGamma(number(parts[0], int, "fixed γ") if parts else default_gamma)


def _parse_confidence(rest: str, default_gamma: int) -> SpeculationPolicy:
    parts = rest.split(":") if rest else []
    if not parts or len(parts) > 4:
        raise ValueError("confidence policy: write confidence:P[:NMAX[:NMIN[:keep]]], e.g. confidence:0.6:16:2")
    keep = len(parts) == 4
    if keep and parts[3].lower() != "keep":
        raise ValueError(f"confidence policy: the fourth field must be 'keep', not '{parts[3]}'")
    return ConfidenceStop(
        number(parts[0], float, "confidence p"),
        number(parts[1], int, "confidence n-max") if len(parts) > 1 else 16,
        number(parts[2], int, "confidence n-min") if len(parts) > 2 else 0,
        keep_last=keep,
    )


def _parse_heuristic(rest: str, default_gamma: int) -> SpeculationPolicy:
    parts = rest.split(":") if rest else []
    if len(parts) > 2:
        raise ValueError("heuristic policy: write heuristic:START[:P], e.g. heuristic:20")
    return HeuristicSchedule(
        number(parts[0], int, "heuristic start") if parts else 20,
        number(parts[1], float, "heuristic confidence p") if len(parts) > 1 else 0.0,
    )


def _parse_adaptive(rest: str, default_gamma: int) -> SpeculationPolicy:
    parts = rest.split(":") if rest else []
    if len(parts) > 5:
        raise ValueError("adaptive policy: write adaptive[:C1,C2,..[:INITIAL[:EMA[:INTERVAL[:WARMUP]]]]]")
    args: dict[str, Any] = {}
    if parts and parts[0]:
        args["candidates"] = tuple(number(c, int, "adaptive candidate") for c in parts[0].split(","))
    names = (("initial", int), ("ema", float), ("interval", int), ("warmup", int))
    for (name, kind_of), value in zip(names, parts[1:], strict=False):
        args[name] = number(value, kind_of, f"adaptive {name}")
    return AdaptiveEMA(**args)


def _parse_batch(rest: str, default_gamma: int) -> SpeculationPolicy:
    body, _, serving = rest.partition("@")
    points = []
    for item in filter(None, body.split(",")):
        b, eq, g = item.partition("=")
        if not eq:
            raise ValueError(f"batch policy: '{item}' is not BATCH=γ (e.g. batch:1=4,8=2,32=1)")
        points.append((number(b, int, "batch size"), number(g, int, "batch γ")))
    if not points:
        raise ValueError("batch policy: write batch:B=G,B=G,..[@SERVING], e.g. batch:1=4,8=2,32=1")
    return BatchSchedule(tuple(points), number(serving, int, "serving batch") if serving else 1)


# ---- what the replay tries of each kind -----------------------------------------------------------------------

P_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
N_MAX_GRID = (4, 8, 16)
N_MIN_GRID = (0, 2)
HEURISTIC_STARTS = (1, 2, 4, 8, 20)
ADAPTIVE_SETS = (((1, 3, 5, 7), 3), ((1, 2, 3, 4, 5, 6, 7, 8), 4), ((2, 4, 6, 8, 12, 16), 6))


def _fixed_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    return [FixedGamma(g) for g in range(1, ask.max_gamma + 1)]


def _confidence_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    """p-min 0.1..0.95 × n-max × n-min (llama.cpp's rule), and transformers' rule at its default n-max 20."""
    if not ask.confidence:
        return []
    grid: list[SpeculationPolicy] = [
        ConfidenceStop(p, n, m) for p in P_GRID for n in N_MAX_GRID for m in N_MIN_GRID if m < n
    ]
    return grid + [ConfidenceStop(p, 20, 0, keep_last=True) for p in P_GRID]


def _heuristic_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    """Several start values; with a confidence, transformers' heuristic with its default threshold first."""
    with_confidence: list[SpeculationPolicy] = [HeuristicSchedule(20, 0.4)] if ask.confidence else []
    return with_confidence + [HeuristicSchedule(start) for start in HEURISTIC_STARTS]


def _adaptive_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    """Three candidate sets × two EMA weights × SGLang's default and a fast re-decision."""
    grid: list[SpeculationPolicy] = []
    for cands, initial in ADAPTIVE_SETS:
        for ema in (0.2, 0.5):
            grid.append(AdaptiveEMA(cands, initial, ema))
            grid.append(AdaptiveEMA(cands, initial, ema, interval=1, warmup=0))
    return grid


def _batch_grid(ask: GridAsk) -> list[SpeculationPolicy]:
    """γ by batch size, when the session measured a schedule."""
    if not ask.schedule:
        return []
    return [BatchSchedule(tuple(sorted(ask.schedule.items())), ask.serving_batch)]


BUILTIN_KINDS = (
    PolicyKind("fixed", "fixed:G", "γ = G every step", _parse_fixed, _fixed_grid, simplicity=0),
    PolicyKind("confidence", "confidence:P[:NMAX[:NMIN[:keep]]]", "draft until the draft's confidence falls below P",
               _parse_confidence, _confidence_grid, simplicity=2),
    PolicyKind("heuristic", "heuristic:START[:P]", "transformers' schedule", _parse_heuristic, _heuristic_grid,
               simplicity=3),
    PolicyKind("adaptive", "adaptive[:C1,C2,..]", "SGLang-style EMA", _parse_adaptive, _adaptive_grid, simplicity=4),
    PolicyKind("batch", "batch:B=G,..", "γ by serving batch size", _parse_batch, _batch_grid, simplicity=1),
)  # fmt: skip
