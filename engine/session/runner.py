"""The engine seam: what the one sweep driver (engine.session.driver) asks of an engine, and the plan it runs.

A Runner decodes one prompt for one configuration at a time and reports what happened in the one counters type
(engine.core.counters.SpecCounters); the driver owns the plan, the interleaving, the load marks, fidelity, the
noise verdict and the report. Engines implement it under engine/engines/ and are registered once there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from engine.analysis.prediction import DraftingLoop
from engine.analysis.step_overhead import LoopPoint
from engine.core.counters import SpecCounters
from engine.core.policy import SpeculationPolicy
from engine.core.records import PromptOutput, StepRecord
from engine.errors import SpectuneError
from engine.measure.fidelity import TargetTop
from engine.session.spec import SessionSpec, gammas_and_policies


@dataclass
class PromptText:
    prompt_id: str
    text: str
    category: str | None = None


@dataclass(frozen=True)
class RunKey:
    """One configuration of a session's plan: the target alone at a temperature, a draft at a fixed γ, a draft
    under a policy whose γ varies step by step (stored with γ 0, its spec under `policy`), or a deployment as it
    speculates itself (γ 0, no policy: the draft names the endpoint), measured with
    `concurrency` requests in flight (engines that batch continuously; 1 elsewhere)."""

    draft: str
    gamma: int
    temperature: float
    policy: SpeculationPolicy | None = None
    concurrency: int = 1

    def baseline(self) -> RunKey:
        """The target alone at this configuration's temperature and concurrency: what its speedup divides by."""
        return RunKey("none", 0, self.temperature, concurrency=self.concurrency)

    @property
    def kind(self) -> str:
        return "baseline" if self.draft == "none" else "speculative"

    @property
    def most_drafted(self) -> int:
        """γ, or the policy's most tokens per step (0 for the baseline)."""
        return self.policy.max_draft() if self.policy is not None else self.gamma

    def as_dict(self) -> dict[str, Any]:
        """The run's key as the hooks and the store take it."""
        key: dict[str, Any] = {
            "draft": self.draft,
            "gamma": self.gamma,
            "temperature": self.temperature,
            "kind": self.kind,
        }
        if self.policy is not None:
            key["policy"] = self.policy.spec()
        if self.concurrency != 1:
            key["concurrency"] = self.concurrency
        return key

    def label(self) -> str:
        """'baseline T=0', 'draft γ=2 T=0', 'draft confidence:… T=0.8' or 'URL as deployed T=0' for messages."""
        level = f" ×{self.concurrency}" if self.concurrency != 1 else ""
        if self.kind == "baseline":
            return f"baseline T={self.temperature:g}{level}"
        how = self.policy.spec() if self.policy is not None else f"γ={self.gamma}" if self.gamma else "as deployed"
        return f"{self.draft} {how} T={self.temperature:g}{level}"


def plan_runs(spec: SessionSpec, levels: Sequence[int] = (1,)) -> list[RunKey]:
    """The baseline at each temperature, then each draft × γ × temperature, then each draft × policy × temperature
    (a fixed:G policy is γ = G); each at every concurrency level of `levels` (an engine that batches)."""
    gammas, policies = gammas_and_policies(spec)
    drafts = [d for d in spec.drafts if d != "none"]
    plan = [RunKey("none", 0, t, None, n) for n in levels for t in spec.temperatures]
    plan += [RunKey(d, g, t, None, n) for d in drafts for g in gammas for n in levels for t in spec.temperatures]
    plan += [RunKey(d, 0, t, p, n) for d in drafts for p in policies for n in levels for t in spec.temperatures]
    return plan


class RunFailed(SpectuneError):
    """One configuration could not be measured (its server would not start, crashed or hung): the sweep goes on."""


class Enough(SpectuneError):
    """One configuration has measured all it may (a deployment's request or time cap, or its stop): what it measured
    stands, and it decodes no further prompt."""


@dataclass
class Decoded:
    """One prompt through one configuration: its output, its counters, and the engine's decode seconds. At a
    concurrency above 1 the prompt went with others in flight: `tokens` are all their tokens over `decode_s` (the
    batch's wall time), the counters theirs, and `ttft_s`/`itl_s` every request's."""

    output: PromptOutput
    counters: SpecCounters
    decode_s: float
    tokens: int | None = None  # None: the output's own tokens
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)


@dataclass
class DecodeContext:
    """What a runner may call back while it decodes one prompt."""

    on_step: Callable[[StepRecord], None]
    should_stop: Callable[[], bool]
    phase: Callable[[str, int, int, float | None], None]
    on_requests: Callable[[list[dict[str, Any]]], None] = lambda rows: None  # a deployment's request rows
    record_traces: bool = True  # finish records the drafts' traces (False: the session has them already)


@dataclass
class EngineOutputs:
    """What a runner adds to the report once the decoding is done."""

    traces: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per draft: the policy replay's input
    draft_costs: dict[str, float] = field(default_factory=dict)  # per draft: c
    # per run: its verify measured inside the engine's loop, where the engine's loop costs more than its forwards
    # (engine.analysis.step_overhead)
    loop_points: dict[RunKey, LoopPoint] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the engine stopped the session early (a deployment's fatal error)
    hardware: str | None = None  # what the numbers ran on, where that is not this machine


class Runner(Protocol):
    """An engine a session measures in. Lifecycle: start → verify_cost → warm_up → (prime, decode…) per prompt →
    finish → stop."""

    name: ClassVar[str]
    dtype: str  # what the report says the numbers were computed in ("float32", "gguf", …)
    device: str
    unavailable: ClassVar[tuple[str, ...]]  # contract fields this engine cannot give (reported as None)
    drafting_loop: ClassVar[DraftingLoop]  # how its loop reads confidence and counts calls (the replay models it)

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        """Load the models or start the servers for `plan`; returns the configurations that failed, with why."""
        ...

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        """v(k) for k = 1 … widest (a ratio of forward times), and notes when it could not be measured."""
        ...

    def warm_up(self, plan: list[RunKey]) -> None:
        """A few untimed tokens through each configuration: first-call initialisation lands nowhere."""
        ...

    def prime(self, index: int, ctx: DecodeContext) -> None:
        """Before any configuration decodes prompt `index`, untimed and unrecorded, whatever a first pass over the
        prompt costs in this engine's loop (the target alone over the prompt's shapes), so that it lands on no
        measurement; nothing where a first pass costs nothing more (a server without a prompt cache)."""
        ...

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        """Decode prompt `index` in configuration `key`; `reference`: the logged baseline, whose output the others are
        judged against (the target alone without it is the sweep's A/A check, which an engine may decline by raising
        Enough). No decode records top logits (reference_at gives them where needed). Raises RunFailed when the
        configuration breaks, Enough when it has measured all it may (it keeps its measurements), Cancelled when told
        to stop."""
        ...

    def reference_at(self, index: int, prefix: Sequence[int]) -> TargetTop | None:
        """The target's top logits (or log-probs) after prompt `index` and the tokens `prefix`, untimed: what a greedy
        output that leaves the target alone's after `prefix` is judged by; None where this engine cannot tell."""
        ...

    def side_measure(self, index: int) -> None:
        """Engine-specific measurements interleaved with prompt `index`'s round (e.g. a draft alone, for c)."""
        ...

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        """After decoding: each draft's c and its trace along the baseline's outputs (`baselines` by temperature)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Extra top-level report fields (the build, say)."""
        ...

    def stop(self) -> None:
        """Release every process and model this runner started; safe to call twice."""
        ...


def baseline_of(plan: Sequence[RunKey]) -> RunKey | None:
    """The configuration an engine primes a prompt with: the plan's target alone, greedy where it runs greedy, at
    the lowest concurrency."""
    bases = [key for key in plan if key.kind == "baseline"]
    return min(bases, key=lambda k: (k.concurrency, k.temperature != 0.0), default=None)
