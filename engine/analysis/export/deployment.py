"""What every export is made from: a recommendation as one typed input, a Deployment.

A recommendation is only useful if it can be deployed unchanged: flags the engine parses, a model it can
load, and the γ it was measured at actually drafted. "Off" is exported too, as an explicit, explained absence,
so nobody re-enables speculation by accident. Every export names the engine version it targets (docs/exports.md
has the commands and how to read acceptance back).

A Deployment is the draft (the recommendation's draft and its measurement), the policy it runs (a fixed γ is
engine.core.policy.FixedGamma), the γ an engine drafts where it cannot run the policy itself, the line that
explains it, and the target. recommended() makes one from a recommendation's own γ, for_policy() from a
speculation policy on the recommended draft. Each engine's module (vllm, sglang, transformers, llamacpp,
spectune) turns a Deployment into that engine's file, which renders itself (files.py); model references are
resolved in refs.py, the store's payload is payload.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.analysis.export.files import Fit
from engine.analysis.export.versions import LLAMACPP_BUILD, VLLM_VERSION
from engine.analysis.recommend import DraftMeasurement, Recommendation
from engine.analysis.regime import RegimeReport
from engine.core.policy import FixedGamma, SpeculationPolicy, describe, parse_policy
from engine.drafts.kinds import AsLookup, DraftKind, kind_of_method
from engine.drafts.refs import NGRAM_DEFAULT
from engine.engines.llamacpp.launch import ngram_simple_size


@dataclass(frozen=True)
class Deployment:
    """A recommendation as every engine is asked to deploy it."""

    rec: Recommendation
    policy: SpeculationPolicy
    gamma: int  # the fixed γ an engine drafts where it cannot run the policy itself
    headline: str  # the line that says what is deployed and what it predicts
    target: str | None = None
    per_batch: dict[int, int] | None = None  # γ by batch size where it differs from `gamma` somewhere
    schedule: dict[int, int] | None = None  # the γ schedule spectune's record keeps
    regime: RegimeReport | None = None
    llamacpp_build: int = LLAMACPP_BUILD
    as_policy: bool = False  # exported as a policy: each file says what its engine runs of it and what is lost
    predicted: Mapping[str, Any] = field(default_factory=dict)
    vllm_version: str = VLLM_VERSION  # the vLLM the user deploys (engine.analysis.export.vllm checks it)
    replaces: Deployment | None = None  # an "off" file: the speculating deployment it turns off, where one is known

    @property
    def off(self) -> bool:
        return self.gamma == 0

    @property
    def kind(self) -> DraftKind:
        """The kind of draft deployed (engine.drafts.kinds)."""
        return kind_of_method(self.rec.method)

    @property
    def looks_up(self) -> bool:
        """Whether an engine's n-gram lookup runs the draft: as itself, or standing in for a kind it lacks."""
        return self.kind.as_lookup is not None

    @property
    def lookup_stands_in(self) -> bool:
        """Whether an engine's n-gram lookup runs the draft only as its closest method (something is lost)."""
        return self._stand_in is not None

    @property
    def _stand_in(self) -> AsLookup | None:
        """How an n-gram lookup stands in for the draft, where it only stands in."""
        as_lookup = self.kind.as_lookup
        return None if as_lookup is None or as_lookup.exact else as_lookup

    def closest_fit(self, fit: Fit, engine: str, closest: str) -> Fit:
        """`fit`, marked inexact with what is lost where `engine`'s n-gram lookup, its `closest` method, stands in
        for the draft."""
        lost = self.lookup_lost(engine, closest)
        return fit if lost is None else Fit(False, fit.runs, (*fit.lost, lost), fit.remarks)

    def lookup_lost(self, engine: str, closest: str) -> str | None:
        """What `engine` loses running its n-gram lookup (`closest`) for the draft; None where nothing is."""
        stand_in = self._stand_in
        if stand_in is None or stand_in.lost is None:
            return None
        return stand_in.lost(self.rec.draft_name, engine, closest)

    @property
    def notes(self) -> list[str]:
        return list(self.rec.notes)

    def draft_ref(self) -> str:
        if not self.rec.model_ref:
            raise ValueError(f"draft {self.rec.draft_name!r} has no model reference to export")
        return self.rec.model_ref

    def ngram_lookup(self) -> NgramLookup:
        """The n-gram lookup the measurement ran, or the one that stands in for the draft (its kind's window)."""
        if self._stand_in is not None:
            return NgramLookup(*self._stand_in.window(self.rec.draft_name))
        return ngram_lookup(self.rec.measurement)


@dataclass(frozen=True)
class NgramLookup:
    """The n-gram lookup a recommendation was measured with: the draft's (shortest, longest) window, and whether
    the engine that measured it looks up one length only (llama-server's ngram-simple: ngram_simple_size)."""

    shortest: int
    longest: int
    one_length: bool = False

    @property
    def window(self) -> tuple[int, int]:
        """The (shortest, longest) window the draft reference names."""
        return self.shortest, self.longest

    @property
    def looked_up(self) -> tuple[int, int]:
        """The (shortest, longest) n-gram lengths the measurement actually looked up."""
        if self.one_length:
            size = ngram_simple_size(self.window)
            return size, size
        return self.window

    def said(self) -> str:
        """What was measured, in words, for an export's comment."""
        lo, hi = self.looked_up
        if self.one_length:
            return f"llama.cpp's ngram-simple, a lookup of exactly the last {hi} tokens (size-n {hi})"
        if lo == hi:
            return f"a lookup of exactly the last {hi} tokens"
        return f"a lookup of the last {hi} down to {lo} tokens, the longest match first"


def ngram_lookup(m: DraftMeasurement | None) -> NgramLookup:
    """The n-gram lookup of an n-gram measurement (the default window where there is none)."""
    if m is None:
        return NgramLookup(*NGRAM_DEFAULT)
    return NgramLookup(m.ngram_min, m.ngram_max, m.drafting_loop.one_ngram_length)


def varies(policy: SpeculationPolicy) -> bool:
    """Whether the policy's γ changes with the batch size."""
    schedule = policy.batch_schedule()
    return schedule is not None and len(set(schedule.values())) > 1


def varying(schedule: Mapping[int, int] | None, gamma: int) -> dict[int, int] | None:
    """The schedule when it differs from the headline γ somewhere; a constant one says nothing more."""
    if not schedule or all(int(k) == int(gamma) for k in schedule.values()):
        return None
    return dict(schedule)


def summary_line(rec: Recommendation) -> str:
    return (
        f"spectune: {rec.draft_name} ({rec.method}) γ={rec.gamma}, predicted {rec.predicted_speedup:.2f}× "
        f"faster, cost per token {rec.cost_change * 100:+.0f}% ({rec.regime}, objective {rec.objective})"
    )


def policy_line(policy: SpeculationPolicy, predicted: Mapping[str, Any] | None) -> str:
    text = f"spectune policy {policy.spec()} ({describe(policy)})"
    if predicted:
        parts = []
        if predicted.get("tokens_per_call") is not None:
            parts.append(f"{predicted['tokens_per_call']:.2f} tokens per target call")
        if predicted.get("speedup") is not None:
            parts.append(f"{predicted['speedup']:.2f}× predicted")
        if predicted.get("gain") is not None and predicted.get("best_fixed_gamma") is not None:
            parts.append(f"{predicted['gain'] * 100:+.1f}% over the best fixed γ={predicted['best_fixed_gamma']}")
        if predicted.get("basis"):
            parts.append(f"replayed, {predicted['basis']}")
        text += ": " + ", ".join(parts) if parts else ""
    return text


def recommended(
    rec: Recommendation,
    schedule: Mapping[int, int] | None = None,
    regime: RegimeReport | None = None,
    *,
    target: str | None = None,
    llamacpp_build: int | None = None,
    vllm_version: str | None = None,
) -> Deployment:
    """The recommendation's own γ (and its schedule: `schedule`, else rec.schedule); `vllm_version` None: the
    vLLM spectune checked its exports against."""
    if schedule is None:
        schedule = rec.schedule
    return Deployment(
        rec,
        FixedGamma(rec.gamma),
        rec.gamma,
        summary_line(rec),
        target,
        varying(schedule, rec.gamma),
        None if schedule is None else dict(schedule),
        regime,
        LLAMACPP_BUILD if llamacpp_build is None else int(llamacpp_build),
        vllm_version=VLLM_VERSION if vllm_version is None else str(vllm_version),
    )


def not_run_by(dep: Deployment, engine: str) -> Deployment:
    """`dep` for an engine that has no draft of its kind: speculation off, and the file says why (and nothing of
    the configuration it cannot run)."""
    label = dep.kind.label
    why = (
        f"{engine} has no {label} ({dep.rec.draft_name}): this file turns speculation off; the spectune record "
        "keeps the recommendation"
    )
    off = replace(dep.rec, gamma=0, explanation=why, notes=[], schedule=None)
    return replace(
        dep, rec=off, policy=FixedGamma(0), gamma=0, headline=why, per_batch=None, schedule=None, as_policy=False
    )


def for_policy(
    rec: Recommendation,
    policy: SpeculationPolicy | str,
    *,
    closest_gamma: int | None = None,
    predicted: Mapping[str, Any] | None = None,
    target: str | None = None,
    llamacpp_build: int | None = None,
    vllm_version: str | None = None,
) -> Deployment:
    """A speculation policy on the recommendation's draft; engines that cannot run it draft a fixed γ:
    `closest_gamma` (the best fixed γ of the replay; default rec.gamma)."""
    if isinstance(policy, str):
        policy = parse_policy(policy)
    # one γ at the serving batch (a fixed γ, a batch schedule's) where the policy keeps γ from step to step
    gamma = int(closest_gamma or rec.gamma or 1) if policy.varies_per_step else policy.max_draft()
    schedule = policy.batch_schedule()
    per_batch = None if schedule is None else varying(schedule, gamma)
    return Deployment(
        rec,
        policy,
        gamma,
        policy_line(policy, predicted),
        target,
        per_batch,
        rec.schedule,
        None,
        LLAMACPP_BUILD if llamacpp_build is None else int(llamacpp_build),
        True,
        dict(predicted or {}),
        VLLM_VERSION if vllm_version is None else str(vllm_version),
    )


def head_lines(dep: Deployment, fit: Fit) -> list[str]:
    """The comments that open a flags file: the headline, and for a policy what the engine runs and loses."""
    if not dep.as_policy:
        return [dep.headline]
    return [dep.headline, f"runs: {fit.runs}", *(f"lost: {x}" for x in fit.lost), *fit.remarks]
