"""What an engine's speculative step costs beyond its forward passes, fitted to what its loop measured.

The one model charges a step c · draft forwards + v(drafted + 1) (engine.analysis.prediction), with v(k) from a
batch benchmark of the target (llama-bench's k-token batch). llama-server's loop pays more per step than that
batch: it computes the output layer and runs its sampler chain at every verified position (llama-bench's batch
outputs the last position only), edits the KV cache and switches between two models. Measured on the bundled
models (2-core Xeon, Q4_K_M, 6 Spec-Bench prompts × 32 tokens, the draft's own time read from the server's
statistics): one verify of k = 2, 3, 5 positions cost 2.15, 2.58 and 3.36 single-token target steps against
llama-bench's 1.34, 1.64 and 1.96, while the draft's time per token in the loop was its time alone (0.89–1.02×).

spectune's own loop is timed the same way (engine.engines.spectune.runner): there a drafting step also pays the verify's
bookkeeping, the KV-cache crop and an n-gram lookup beside the target's forward.

So a step that verifies d ≥ 1 draft tokens is charged `per_step + per_token · d` more, in target-step units, both
fitted (non-negative) to the in-loop points (k̄, v_loop) of a session's runs: one run fixes `per_step` alone, two
widths or more fit both. A step that drafted nothing is a plain target step and pays none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Protocol, TypeVar

from engine.analysis.theory import VerifyFit

MIN_WIDTH_SPREAD = 0.5  # draft tokens per step: in-loop points closer than this fit the per-step term alone


@dataclass(frozen=True)
class LoopPoint:
    """One run's verify, measured inside the engine's loop: the mean verify width k̄ (1 + draft tokens per drafting
    step) and what a drafting step's target call cost there (`v`, target-step units), over `steps` steps."""

    k: float
    v: float
    steps: float

    def to_dict(self) -> dict[str, float]:
        return {"k": round(self.k, 4), "v": round(self.v, 4), "steps": self.steps}


@dataclass(frozen=True)
class InLoop:
    """One request (one prompt) as an engine's loop spent its time: the target's ms (its calls, and whatever the
    loop spends beside the draft's forwards) and the draft's ms (its forwards: what c charges), over
    `drafting_calls` target calls that verified a draft and `plain_calls` that did not; `drafted` draft tokens and
    `forwards` draft forwards in all."""

    index: int
    target_ms: float
    draft_ms: float
    drafting_calls: int
    plain_calls: int
    drafted: float
    forwards: int


def loop_point(
    requests: Sequence[InLoop], call_ms: Mapping[int, Sequence[float]]
) -> tuple[LoopPoint | None, list[float]]:
    """A run's verify in the loop, in units of the same prompt's target-alone step (`call_ms[index]`, its median),
    and c as each request measured it there (the draft's ms per forward ÷ that step). Requests whose prompt has no
    target-alone step are left out; no point without a drafting call."""
    units = steps = drafted = 0.0
    costs: list[float] = []
    for r in requests:
        if not call_ms.get(r.index):
            continue
        call = median(call_ms[r.index])
        units += r.target_ms / call - r.plain_calls
        steps += r.drafting_calls
        drafted += r.drafted
        if r.forwards:
            costs.append(r.draft_ms / r.forwards / call)
    if not steps:
        return None, costs
    return LoopPoint(k=1.0 + drafted / steps, v=units / steps, steps=steps), costs


class _OfDraft(Protocol):
    @property
    def draft(self) -> str: ...


RunKeyT = TypeVar("RunKeyT", bound=_OfDraft)


def loop_points(
    in_loop: Mapping[RunKeyT, Sequence[InLoop]], call_ms_of: Callable[[RunKeyT], Mapping[int, Sequence[float]]]
) -> tuple[dict[RunKeyT, LoopPoint], dict[str, list[float]]]:
    """Per run, its LoopPoint against the target-alone steps `call_ms_of(run)` (loop_point; runs without one left
    out); per draft (each run's `.draft`), c as each of its requests measured it in the loop."""
    points: dict[RunKeyT, LoopPoint] = {}
    costs: dict[str, list[float]] = {}
    for key, requests in in_loop.items():
        point, values = loop_point(requests, call_ms_of(key))
        if point is not None:
            points[key] = point
        if values:
            costs.setdefault(key.draft, []).extend(values)
    return points, costs


@dataclass(frozen=True)
class StepOverhead:
    """What a step that verifies d ≥ 1 draft tokens costs beyond c · forwards + v(d + 1): per_step + per_token · d."""

    per_step: float = 0.0
    per_token: float = 0.0

    def at(self, drafted: float) -> float:
        return 0.0 if drafted <= 0 else self.per_step + self.per_token * drafted

    def __bool__(self) -> bool:
        return self.per_step > 0 or self.per_token > 0

    def to_dict(self) -> dict[str, float]:
        return {"per_step": round(self.per_step, 4), "per_token": round(self.per_token, 4)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StepOverhead:
        if not data:
            return cls()
        return cls(max(0.0, float(data.get("per_step") or 0.0)), max(0.0, float(data.get("per_token") or 0.0)))


def fitted_v(fit: VerifyFit | None, k: float) -> float:
    """v at a run's mean width (fractional): the fit's own piecewise-linear line, capped at k; 1 without a fit."""
    return 1.0 if fit is None or k <= 1 else fit.at(k)


def fit_step_overhead(points: Sequence[LoopPoint], fit: VerifyFit | None) -> StepOverhead:
    """per_step and per_token (both ≥ 0), least squares over the points' residuals v_loop − v(k̄), weighted by
    steps; per_step alone when the points span less than MIN_WIDTH_SPREAD draft tokens."""
    rows = [(p.k - 1.0, p.v - fitted_v(fit, p.k), p.steps) for p in points if p.steps > 0 and p.k > 1]
    if not rows:
        return StepOverhead()
    weight = sum(w for _, _, w in rows)
    mean_d = sum(d * w for d, _, w in rows) / weight
    mean_r = sum(r * w for _, r, w in rows) / weight
    spread = max(d for d, _, _ in rows) - min(d for d, _, _ in rows)
    if spread < MIN_WIDTH_SPREAD:
        return StepOverhead(per_step=max(mean_r, 0.0))
    sxx = sum(w * (d - mean_d) ** 2 for d, _, w in rows)
    slope = sum(w * (d - mean_d) * (r - mean_r) for d, r, w in rows) / sxx
    if slope <= 0:
        return StepOverhead(per_step=max(mean_r, 0.0))
    intercept = mean_r - slope * mean_d
    if intercept < 0:  # through the origin: the whole excess is per verified token
        through = sum(w * d * r for d, r, w in rows) / sum(w * d * d for d, _, w in rows)
        return StepOverhead(per_token=max(through, 0.0))
    return StepOverhead(per_step=intercept, per_token=slope)
