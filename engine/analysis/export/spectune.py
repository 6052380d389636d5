"""spectune's own record: the decision plus every number it rests on (α, c, v(k), regime, γ curve, sessions)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from engine.analysis.export.deployment import Deployment, ngram_lookup
from engine.analysis.export.files import Fit, JsonFile
from engine.analysis.export.formats import ExportFormat
from engine.analysis.export.versions import SPECTUNE_FORMAT
from engine.analysis.recommend import DraftMeasurement, GammaPoint, Recommendation
from engine.analysis.regime import RegimeReport
from engine.core.policy import describe
from engine.drafts.kinds import kind_of_method


def config(dep: Deployment) -> JsonFile:
    """The record of the deployment (the γ it drafts as the recommendation's); a policy adds its own block."""
    rec = dep.rec if dep.gamma == dep.rec.gamma else replace(dep.rec, gamma=dep.gamma)
    doc = record(rec, dep.regime, dep.schedule)
    if not dep.as_policy:
        return JsonFile(doc)
    policy = dep.policy
    doc["policy"] = {
        "spec": policy.spec(),
        "setting": describe(policy),
        "kind": policy.kind,
        "predicted": dict(dep.predicted),
        "closest_fixed_gamma": dep.gamma,
    }
    return JsonFile(doc, Fit(True, policy.spec()))


def record(rec: Recommendation, regime: RegimeReport | None, schedule: dict[int, int] | None) -> dict[str, Any]:
    """The record as a JSON-ready document (files.clean makes it JSON-safe)."""
    if regime is not None:
        regime_block = {
            "label": regime.label,
            "evidence": regime.evidence,
            "votes": regime.votes,
            "agree": regime.agree,
        }
    else:
        regime_block = {"label": rec.regime, "evidence": [], "votes": {}, "agree": True}
    return {
        "format": SPECTUNE_FORMAT,
        "speculation": "off" if rec.off else rec.method,
        "recommendation": {
            "draft_name": rec.draft_name,
            "method": rec.method,
            "model_ref": rec.model_ref,
            "gamma": rec.gamma,
            "predicted_speedup": rec.predicted_speedup,
            "ops_multiplier": rec.ops_multiplier,
            "cost_change": rec.cost_change,
            "objective": rec.objective,
            "regime": rec.regime,
            "budget": rec.budget,
            "batch_size": rec.batch_size,
            "temperature": rec.temperature,
            "explanation": rec.explanation,
            "notes": rec.notes,
            "cost_per_million_baseline": rec.cost_per_million_baseline,
            "cost_per_million": rec.cost_per_million,
            "crossover": rec.crossover,
            "schedule": schedule if schedule is not None else rec.schedule,
        },
        "comparison": [_comparison_row(s) for s in rec.comparison],
        "evidence": {
            "measurement": _measurement(rec.measurement),
            "regime": regime_block,
            "gamma_curve": [curve_row(p) for p in rec.curve],
        },
    }


def _comparison_row(summary: Any) -> dict[str, Any]:
    """One draft of the comparison as the record keeps it (its curve is the evidence's, for the chosen draft)."""
    row = asdict(replace(summary, curve=[]))
    del row["curve"]
    return row


def curve_row(p: GammaPoint) -> dict[str, Any]:
    """One γ of the curve as the record keeps it: the one model's figures, the measurement, the reference line."""
    return {
        "gamma": p.gamma,
        "expected_tokens": p.expected_tokens,
        "speedup_predicted": p.speedup_predicted,
        "ops_multiplier": p.ops_multiplier,
        "draft_calls_per_step": p.draft_calls_per_step,
        "verify_cost": p.verify_cost,
        "basis": p.expected_tokens_source,
        "extrapolated": p.extrapolated,
        "verify_extrapolated": p.verify_extrapolated,
        "measured_speedup": p.measured_speedup,
        "measured_flag": p.measured_flag,
        "measured_noisy": p.measured_noisy,
        "speedup_one_alpha": p.speedup_one_alpha,
        "expected_tokens_one_alpha": p.expected_tokens_one_alpha,
        "flags": list(p.flags),
    }


def _measurement(m: DraftMeasurement | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "name": m.name,
        "method": m.method,
        "model_ref": m.model_ref,
        "alpha": m.alpha,
        "per_position_acceptance": list(m.per_position_acceptance),
        "c": m.c,
        "c_hat": m.c_hat,
        "verify_cost": {int(k): v for k, v in sorted(m.verify_cost.items())},
        "temperature": m.temperature,
        "measured_speedup": {int(k): v for k, v in sorted(m.measured_speedup.items())},
        "noisy_speedup": {int(k): v for k, v in sorted(m.noisy_speedup.items())},
        "session_ids": list(m.session_ids),
        "agreement_prompts": len(m.agreement_runs),
        "agreement_tokens": sum(len(r) for r in m.agreement_runs),
        "ngram_max": m.ngram_max,
        "ngram_min": m.ngram_min,
        **_ngram_looked_up(m),
    }


def _ngram_looked_up(m: DraftMeasurement) -> dict[str, Any]:
    """For n-gram lookup, the lengths the measurement looked up and where (its engine may look up fewer)."""
    as_lookup = kind_of_method(m.method).as_lookup
    if as_lookup is None or not as_lookup.exact:
        return {}
    lookup = ngram_lookup(m)
    shortest, longest = lookup.looked_up
    return {"ngram_looked_up": {"shortest": shortest, "longest": longest, "measured": lookup.said()}}


FORMAT = ExportFormat(
    name="spectune",
    label="spectune record",
    filename="spectune-recommendation.json",
    language="json",
    mime="application/json",
    policy_support="every policy",
    config=config,
)
