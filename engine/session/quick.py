"""A quick session: probe, predict, confirm.

Instead of every configuration of the grid, a quick session runs the target alone and each draft once (at the
grid's widest γ, so the recorded pass reaches every γ the grid names, and c, v(k) and acceptance are measured in
the engine's own loop; a draft model in llama.cpp at the narrowest γ too: its loop's step overhead needs two
widths); the one prediction model then predicts the whole grid (every γ and policy) from that recorded pass, and
the configurations it recommends — the best policy and the best fixed γ — run live beside the target alone to
confirm them. The full grid stays available (mode "full")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.policy import SpeculationPolicy
from engine.drafts.kinds import draft_kind
from engine.measure.noise import MeasurementFloor, MeasurementOverhead
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec, gammas_and_policies
from engine.session.sweep import SweepReport

PROBE_POLICY_DEPTH = 8  # the probe's γ for a grid of policies only: deep enough for most of their steps


def probe_gamma(spec: SessionSpec) -> int:
    """The γ each draft is probed at: the grid's widest fixed γ (a policy-only grid: its most drafted, ≤ 8)."""
    gammas, policies = gammas_and_policies(spec)
    if gammas:
        return max(gammas)
    return min(max(p.max_draft() for p in policies), PROBE_POLICY_DEPTH)


def probe_widths(spec: SessionSpec, draft: str, two_widths: bool) -> list[int]:
    """The γs a draft is probed at: the probe γ, and for a draft model in an engine whose loop costs a drafting step
    more than its forwards (`two_widths`) the grid's narrowest γ too, so that cost is fitted at two widths
    (engine.analysis.step_overhead) instead of assumed the same at every γ."""
    gamma = probe_gamma(spec)
    if not two_widths or not draft_kind(draft).costs_forwards:
        return [gamma]
    gammas, _ = gammas_and_policies(spec)
    narrow = min(gammas) if gammas else 1
    return [narrow, gamma] if narrow < gamma else [gamma]


def probe_plan(spec: SessionSpec, levels: Sequence[int] = (1,), two_widths: bool = False) -> list[RunKey]:
    """The target alone at each temperature, then each draft at its probe γs (probe_widths), at each level."""
    drafts = [d for d in spec.drafts if d != "none"]
    plan = [RunKey("none", 0, t, None, n) for n in levels for t in spec.temperatures]
    return plan + [
        RunKey(d, g, t, None, n)
        for d in drafts
        for g in probe_widths(spec, d, two_widths)
        for n in levels
        for t in spec.temperatures
    ]


@dataclass(frozen=True)
class Choice:
    """A configuration the one model recommends at one temperature, and what it predicted for it."""

    role: str  # "recommended" (the best of everything) or "best fixed γ"
    draft: str
    gamma: int
    temperature: float
    predicted_speedup: float
    policy: SpeculationPolicy | None = None

    def key(self, concurrency: int = 1) -> RunKey:
        return RunKey(
            self.draft, 0 if self.policy is not None else self.gamma, self.temperature, self.policy, concurrency
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "configuration": self.key().label(),
            "draft": self.draft,
            "gamma": self.gamma,
            "policy": self.policy.spec() if self.policy else None,
            "temperature": self.temperature,
            "predicted_speedup": self.predicted_speedup,
        }


@dataclass
class ConfirmChoices:
    """What the probe led to: the choices to confirm and why (an off recommendation still confirms its best γ)."""

    choices: list[Choice] = field(default_factory=list)
    off: dict[float, bool] = field(default_factory=dict)  # per temperature: the recommendation is speculation off
    notes: list[str] = field(default_factory=list)


def confirm_plan(
    spec: SessionSpec, decision: ConfirmChoices, measured: Sequence[RunKey], levels: Sequence[int] = (1,)
) -> list[RunKey]:
    """The target alone at each temperature of a choice, then each choice not measured by the probe already."""
    done = set(measured)
    wanted = [c.key(n) for c in decision.choices for n in levels]
    fresh = list(dict.fromkeys(k for k in wanted if k not in done))
    if not fresh:
        return []
    temperatures = sorted({k.temperature for k in fresh})
    return [RunKey("none", 0, t, None, n) for n in levels for t in temperatures] + fresh


CONFIRM_RUNS = 3  # a confirmation at each temperature and level: the target alone and at most two choices


def confirm_runs(spec: SessionSpec, levels: Sequence[int] = (1,)) -> int:
    """The most runs a confirmation measures: at each level and temperature the target alone and two choices (a
    recommended policy and the best fixed γ)."""
    return CONFIRM_RUNS * len(spec.temperatures) * len(levels)


CHANGED_RUNS = 2  # a second round, where the first changed the decision: the target alone and the new choice


def confirm_reserve(spec: SessionSpec, n_prompts: int, levels: Sequence[int] = (1,)) -> int:
    """The most prompt decodes a confirmation adds over `n_prompts` prompts: its runs, and a second round's (the
    decision the first round changed); a confirmation measures no A/A check (its session's first sweep did)."""
    return n_prompts * (confirm_runs(spec, levels) + CHANGED_RUNS * len(spec.temperatures) * len(levels))


def merged(probe: SweepReport, confirm: SweepReport | None) -> SweepReport:
    """One report for the session: the probe's runs and v(k), then the confirmation's runs beside its own
    baselines (each run's speedup is against the baseline measured alongside it)."""
    if confirm is None:
        return probe
    times = dict(probe.phase_times_s)
    for name, seconds in confirm.phase_times_s.items():
        times[name] = round(times.get(name, 0.0) + seconds, 3)
    return replace(
        confirm,
        verify_cost=probe.verify_cost,
        baselines=probe.baselines + confirm.baselines,
        runs=probe.runs + confirm.runs,
        failed=probe.failed + confirm.failed,
        notes=list(dict.fromkeys(probe.notes + confirm.notes)),
        noisy_runs=probe.noisy_runs + confirm.noisy_runs,
        impossible_runs=probe.impossible_runs + confirm.impossible_runs,
        phase_times_s=times,
        engine_info=probe.engine_info | confirm.engine_info,
        measurement_floor=merged_floor(probe.measurement_floor, confirm.measurement_floor),
        measurement_overhead=merged_overhead(probe.measurement_overhead, confirm.measurement_overhead),
    )


def merged_overhead(*stored: dict | None) -> dict | None:
    """What measuring cost over every sweep of a session (None where no sweep kept it)."""
    parts = [o for data in stored if (o := MeasurementOverhead.from_dict(data)) is not None]
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = total.plus(part)
    return total.to_dict()


def merged_floor(*floors: dict | None) -> dict | None:
    """One measurement floor over the A/A ratios of every sweep of a session, counting each prompt once."""
    judged = [f for stored in floors if (f := MeasurementFloor.from_dict(stored)) is not None]
    if not judged:
        return None
    ratios = tuple(r for f in judged for r in f.ratios)
    return MeasurementFloor(ratios, max(f.n_prompts for f in judged)).to_dict()  # the sweeps pair the same prompts
