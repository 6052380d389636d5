"""Memory-bound or compute-bound at the serving batch: decided from measured evidence, never assumed.

Why this matters: speculation's extra arithmetic is free when decoding is memory-bound (weights
stream from memory once per step, compute idles) and billed when it is compute-bound (Theorem
3.11's multiplier lands on the bill). The chapter's diagnostic says nothing else matters until
this is answered, so this module answers it from three kinds of evidence:

1. a batch sweep — decode step time vs batch size: flat while memory-bound, then about linear
   once compute saturates (the knee);
2. the verify curve v(k) — cost of a k-token target forward relative to 1 token: near 1 means
   verification rides on the weight stream (memory-bound), near k means it is billed;
3. a roofline — achieved bytes/s and FLOP/s of a step against measured peaks.

The classifiers are pure functions on numbers, so recorded sweeps can be re-judged; judge_regime
is the one place that turns evidence (fresh from the worker, or stored with a session) into a
verdict at a serving batch, for the worker, the CLI and the dashboard alike. A verify step at batch
b with γ draft tokens processes b·(γ+1) token rows, so the knee is compared with that width.

The three sources are judged in engine.analysis.regime_sources and stored records are read back in
engine.analysis.regime_stored; their public names are importable from here too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.regime_sources import (
    ABSTAIN_FRACTION,
    MEASUREMENT_ERROR,
    OVERHEAD_BOUND,
    VERIFY_BILLED_FRACTION,
    VERIFY_FREE_FRACTION,
    BatchSweepClassification,
    Roofline,
    VerifyCurveClassification,
    classify_batch_sweep,
    classify_verify_curve,
    regime_at_width,
    roofline,
    roofline_flags,
)
from engine.analysis.regime_stored import stored_knee, stored_roofline, stored_sweep, stored_verify
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, REGIMES, measured_verify_points

__all__ = [
    "MEASUREMENT_ERROR",
    "VERIFY_BILLED_FRACTION",
    "VERIFY_FREE_FRACTION",
    "BatchSweepClassification",
    "RegimeReport",
    "Roofline",
    "VerifyCurveClassification",
    "classify_batch_sweep",
    "classify_verify_curve",
    "evidence_said",
    "judge_regime",
    "regime_at_width",
    "regime_report",
    "roofline",
    "roofline_flags",
    "stored_knee",
    "stored_roofline",
    "stored_sweep",
    "stored_verify",
    "votes_agree",
]


@dataclass
class RegimeReport:
    """One verdict with the evidence behind it."""

    label: str  # "memory-bound" | "compute-bound" | "unknown"
    evidence: list[str]
    votes: dict[str, str]  # source -> what it said
    agree: bool  # every source that took a side took the same side
    # filled by judge_regime: where the verdict was made and what it rests on
    batch_size: int | None = None
    gamma: int = 0
    knee_batch: int | None = None
    source: str = ""  # one sentence: where the label came from
    override: str | None = None
    sweep: BatchSweepClassification | None = None
    verify: VerifyCurveClassification | None = None
    roof: Roofline | None = None
    flags: list[str] = field(default_factory=list)  # measurements that broke a physical bound

    @property
    def width(self) -> int | None:
        """Token rows one verify step processes: batch × (γ+1)."""
        return None if self.batch_size is None else self.batch_size * (self.gamma + 1)


_WEIGHTS = {"batch sweep": 3.0, "verify curve": 2.0, "roofline": 1.0}
_SIDES = (MEMORY_BOUND, COMPUTE_BOUND)


def votes_agree(votes: Mapping[str, str]) -> bool:
    """Every source that took a side took the same side ("mixed", "measurement error" take none)."""
    return len({v for v in votes.values() if v in _SIDES}) <= 1


_NAMES = {"batch sweep": "batch sweep", "verify curve": "v(k)", "roofline": "roofline"}
_NO_SIDE = {
    "mixed": "partly billed, between free and fully billed",
    MEASUREMENT_ERROR: "outside its physical bounds, so not evidence",
    OVERHEAD_BOUND: f"overhead-bound, below {ABSTAIN_FRACTION:.0%} of both peaks",
}


def evidence_said(votes: Mapping[str, str]) -> str:
    """Which evidence decided the regime, which was measured but took no side (and why), which was not measured.

    The one wording of the evidence's verdict: the regime's own lines, the source sentence and the recommendation's
    notes all say it this way, so a measured v(k) is never called missing."""
    decided = [f"the {_NAMES[s]} says {votes[s]}" for s in _WEIGHTS if votes.get(s) in _SIDES]
    abstained = [
        f"{_NAMES[s]} ({_NO_SIDE.get(votes[s], votes[s])})" for s in _WEIGHTS if s in votes and votes[s] not in _SIDES
    ]
    missing = [_NAMES[s] for s in _WEIGHTS if s not in votes]
    parts = [", ".join(decided)] if decided else []
    parts += [f"measured but taking no side: {', '.join(abstained)}"] if abstained else []
    parts += [f"not measured: {', '.join(missing)}"] if missing else []
    return "; ".join(parts)


def _combine(votes: Mapping[str, str], evidence: list[str]) -> tuple[str, bool]:
    """Weighted vote (3 / 2 / 1), ties to the higher-weighted source; appends the verdict's own lines."""
    scores = {MEMORY_BOUND: 0.0, COMPUTE_BOUND: 0.0}
    first_side: str | None = None
    for source in ("batch sweep", "verify curve", "roofline"):
        side = votes.get(source)
        if side in scores:
            scores[side] += _WEIGHTS[source]
            first_side = first_side or side
    if first_side is None:
        label = "unknown"
        missing = [
            what
            for source, what in (
                ("batch sweep", "run a batch sweep at the serving batch"),
                ("verify curve", "measure v(k)"),
            )
            if source not in votes
        ]
        todo = f"; to decide it, {' or '.join(missing)}" if missing else ""
        evidence.append(f"no decisive evidence — {evidence_said(votes)}{todo}")
    elif scores[MEMORY_BOUND] == scores[COMPUTE_BOUND]:
        label = first_side
    else:
        label = max(scores, key=lambda s: scores[s])
    agree = votes_agree(votes)
    if not agree:
        said = ", ".join(f"{k}: {v}" for k, v in votes.items())
        evidence.append(f"sources disagree ({said}); weighted vote → {label}")
    return label, agree


def regime_report(
    sweep: BatchSweepClassification | None = None,
    verify: VerifyCurveClassification | None = None,
    roof: Roofline | None = None,
) -> RegimeReport:
    """Combine the evidence: the batch sweep at the serving batch weighs most, then v(k), then the roofline.

    Weighted vote (3 / 2 / 1); ties go to the higher-weighted source. "mixed" verify curves and a
    roofline flagged as a measurement error take no side. With no evidence the label is "unknown"
    — do not guess.

    NVML's "GPU utilisation" is deliberately not an input: it is the share of time *any* kernel was
    running, so a batch-1 decode that streams weights and leaves the tensor cores idle reads ~100%.
    It says nothing about whether you are memory- or compute-bound.
    """
    votes: dict[str, str] = {}
    evidence: list[str] = []
    if sweep is not None:
        votes["batch sweep"] = sweep.label
        evidence += [f"batch sweep: {e}" for e in sweep.evidence]
    if verify is not None:
        votes["verify curve"] = verify.regime
        evidence += [f"verify curve: {e}" for e in verify.evidence]
    if roof is not None:
        votes["roofline"] = roof.label
        evidence += [f"roofline: {e}" for e in roof.evidence]
    label, agree = _combine(votes, evidence)
    return RegimeReport(
        label=label,
        evidence=evidence,
        votes=votes,
        agree=agree,
        sweep=sweep,
        verify=verify,
        roof=roof,
        flags=list(roof.flags) if roof is not None else [],
    )


_REJUDGED = ("batch sweep", "verify curve", "roofline", "sources disagree", "no decisive evidence")


def _source_sentence(
    override: str | None, knee: int | None, batch: int, gamma: int, label: str, stored: bool, votes: Mapping[str, str]
) -> str:
    if override:
        return f"Set by hand to {override} (the measured evidence is shown below for reference)."
    if knee is not None:
        width = batch * (gamma + 1)
        side = "at or past" if width >= knee else "below"
        if gamma == 0:
            return f"From the stored batch sweep: serving batch {batch} is {side} the knee at batch {knee}."
        return (
            f"From the stored batch sweep: a verify step at serving batch {batch} with γ = {gamma} processes "
            f"{batch} × {gamma + 1} = {width} token rows, {side} the knee at batch {knee}."
        )
    if label in _SIDES:
        sources = [source for source, side in votes.items() if side == label]
        if sources:
            return f"From the {' and the '.join(sources)} measured in the chosen sessions."
        return "From the stored regime evidence of the chosen sessions."
    if votes:
        return (
            f"The evidence of these sessions does not decide the regime ({label}) — {evidence_said(votes)}; "
            "memory-bound is assumed."
        )
    return "No decisive regime evidence is stored for these sessions: the regime is unknown (assumed memory-bound)."


def _timed_in(record: Mapping[str, Any]) -> str:
    """Which loop timed the stored sweep, as the start of its evidence lines ("" where the record does not say)."""
    sweep = record.get("batch_sweep")
    loop = sweep.get("loop") if isinstance(sweep, Mapping) else None
    return f"timed in the {loop} loop, " if loop in ("compiled", "eager") else ""


def _judge_sweep(
    record: Mapping[str, Any], batch_size: int, gamma: int, votes: dict[str, str], lines: list[str]
) -> tuple[BatchSweepClassification | None, int | None]:
    """The stored batch sweep re-judged at batch·(γ+1) token rows (else its stored knee alone): (sweep, knee)."""
    sweep_cls = None
    raw = stored_sweep(record)
    knee = stored_knee(record)
    if raw is not None:
        sweep_cls = classify_batch_sweep(raw[0], raw[1], batch_size, tokens_per_row=gamma + 1)
        knee = sweep_cls.knee_batch
        votes["batch sweep"] = sweep_cls.label
        lines += [f"batch sweep ({_timed_in(record)}judged at batch {batch_size}): {e}" for e in sweep_cls.evidence]
    elif knee is not None:
        votes["batch sweep"] = regime_at_width(batch_size * (gamma + 1), knee)
        lines.append(
            f"batch sweep (only its knee, batch {knee}, is stored): {batch_size} × {gamma + 1} token rows per step → "
            f"{votes['batch sweep']}"
        )
    return sweep_cls, knee


def _judge_verify(
    record: Mapping[str, Any], verify_cost: Mapping[int, float] | None, votes: dict[str, str], lines: list[str]
) -> VerifyCurveClassification | None:
    """v(k) (the given table, else the record's own) judged at k = 8, or at the largest k measured below that."""
    verify_cls = None
    table = measured_verify_points(verify_cost) or stored_verify(record)
    if table:
        verify_cls = classify_verify_curve(table, k=8 if max(table) >= 8 else max(table))
        votes["verify curve"] = verify_cls.regime
        lines += [f"verify curve: {e}" for e in verify_cls.evidence]
    else:
        lines.append("verify curve: no v(k) measured (only v(1) = 1), so the cost of verification is not evidence here")
    return verify_cls


def _judge_roofline(
    record: Mapping[str, Any], batch_size: int, votes: dict[str, str], lines: list[str]
) -> Roofline | None:
    """The stored roofline: it votes when measured at this batch (or at one not recorded), else it is a reference."""
    roof = stored_roofline(record)
    served = record.get("serving_batch")
    if roof is not None:
        if served is None or int(served) == batch_size:
            votes["roofline"] = roof.label
            lines += [f"roofline: {e}" for e in roof.evidence]
        else:
            lines += [
                f"roofline (measured at batch {served}, reference only at batch {batch_size}): {e}"
                for e in roof.evidence
            ]
    return roof


def _stored_verdict(
    record: Mapping[str, Any], votes: dict[str, str], lines: list[str]
) -> tuple[dict[str, str], str | None]:
    """The record's own evidence lines, and with nothing re-judged its stored votes or label: (votes, label).

    Stored lines of the sources that were re-judged are dropped (the fresh ones replace them)."""
    served = record.get("serving_batch")
    stored_lines = [str(e) for e in record.get("evidence") or []]
    stored_votes = record.get("votes") if isinstance(record.get("votes"), Mapping) else {}
    stored_label: str | None = None
    if not votes and (record.get("label") in _SIDES or stored_votes):
        # nothing to re-judge: the verdict stored with the session stands (judged at its serving batch)
        votes = {str(k): str(v) for k, v in stored_votes.items()}
        stored_label = None if votes else str(record["label"])
        keep = stored_lines
    else:
        keep = [e for e in stored_lines if not e.startswith(_REJUDGED)]
    if keep:
        where = f" (serving batch {served})" if served is not None else ""
        lines += [f"stored with the session{where}: {e}" for e in keep]
    return votes, stored_label


def judge_regime(
    evidence: Mapping[str, Any] | None,
    batch_size: int,
    gamma: int = 0,
    verify_cost: Mapping[int, float] | None = None,
    override: str | None = None,
) -> RegimeReport:
    """The regime at a serving batch, from a regime record: the one judgement the worker, CLI and page share.

    `evidence` is a regime record as the worker stores it (raw batch sweep, roofline, serving batch,
    evidence lines, votes) or None. The batch sweep is re-judged at `batch_size`: a verify step with
    γ draft tokens processes batch·(γ+1) token rows, and that width is what is compared with the
    knee. v(k) (`verify_cost`, else the record's own) and the roofline (only when it was measured
    at this batch, and only when within its physical bounds) vote as in regime_report. With nothing
    to re-judge, the record's stored label and votes stand. `override` ("memory-bound" |
    "compute-bound") replaces the label; the evidence is kept for reference. The label is
    "unknown" when nothing decides — never silently memory-bound.
    """
    if batch_size < 1 or gamma < 0:
        raise ValueError("batch_size must be >= 1 and gamma >= 0")
    if override is not None and override not in REGIMES:
        raise ValueError(f"override must be one of {REGIMES}, got {override!r}")
    record: Mapping[str, Any] = evidence if isinstance(evidence, Mapping) else {}
    lines: list[str] = []
    if override:
        lines.append(f"regime set by hand to {override}; the measured evidence follows for reference")
    votes: dict[str, str] = {}
    sweep_cls, knee = _judge_sweep(record, batch_size, gamma, votes, lines)
    verify_cls = _judge_verify(record, verify_cost, votes, lines)
    roof = _judge_roofline(record, batch_size, votes, lines)
    flags = list(roof.flags) if roof is not None else []
    votes, stored_label = _stored_verdict(record, votes, lines)

    label, agree = (stored_label, True) if stored_label else _combine(votes, lines)
    if override:
        label = override
    return RegimeReport(
        label=label,
        evidence=lines,
        votes=votes,
        agree=agree,
        batch_size=batch_size,
        gamma=gamma,
        knee_batch=knee,
        source=_source_sentence(override, knee, batch_size, gamma, label, bool(record), votes),
        override=override,
        sweep=sweep_cls,
        verify=verify_cls,
        roof=roof,
        flags=flags,
    )
