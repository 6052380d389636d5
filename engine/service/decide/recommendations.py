"""Recommend, export, save: the one chain `python -m engine recommend` and the Recommend page both run.

`recommend_and_export` picks the engine whose measurements count, recommends from the stored sessions
(engine.service.decide.evidence), exports the recommendation in each format asked for (engine.analysis.export) and,
with `save`, keeps the payload and its files in the store's history; `save_result` keeps a result computed
before (the page saves when the user downloads or presses "Save to history").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from engine.analysis.export import ExportFormat as ExportFormat  # the app's view of the formats: re-exported
from engine.analysis.export import export, format_names, payload_inputs, recommendation_payload
from engine.analysis.export import export_format as export_format
from engine.analysis.export import export_formats as export_formats
from engine.analysis.export import format_label as format_label
from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport
from engine.service.decide.decisions import DecisionQuery, decided
from engine.service.decide.evidence import Evidence, choose_engine, store_recommendation


@dataclass
class Recommended:
    """A recommendation with what it rests on, and its exports."""

    recommendation: Recommendation
    evidence: Evidence
    regime: RegimeReport  # judged at the recommended γ
    engine: str  # whose measurements it rests on
    inputs: dict[str, Any]  # engine.analysis.export.payload_inputs
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # format -> (filename, text), as registered
    failed: dict[str, Exception] = field(default_factory=dict)  # format -> why its export failed
    decision: Any = None  # the stored decision for the same query (engine.service.decide.decisions), where one was made
    policies: Any = None  # the policy report the decision was made from (engine.service.decide.policies.PolicyReport)

    @property
    def triple(self) -> tuple[Recommendation, Evidence, RegimeReport]:
        """(recommendation, evidence, regime report), as engine.service.decide.evidence.recommend_from_store gives
        them."""
        return self.recommendation, self.evidence, self.regime

    @cached_property
    def payload(self) -> dict[str, Any]:
        """What the store keeps (engine.analysis.export.recommendation_payload), from the spectune export if made."""
        spectune_text = self.files.get("spectune", ("", ""))[1] or None
        payload = recommendation_payload(self.recommendation, self.inputs, self.regime, spectune_text)
        if self.decision is not None:  # what every page shows: the stored decision, over the fixed γ's figures
            payload["decision"] = self.decision.to_dict()
        return payload


def recommend_and_export(
    store: Any,
    session_ids: Sequence[int],
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    price_per_hour: float | None = None,
    regime_override: str | None = None,
    engine: str | None = None,
    formats: Sequence[str] | None = None,
    save: bool = False,
    temperature: float | None = None,
    vllm_version: str | None = None,
) -> Recommended:
    """Recommend from the sessions, export in each of `formats`, and with `save` keep it and its files.

    `engine` None: evidence.choose_engine decides (llama.cpp's measurements for a llama.cpp-only export when
    the sessions include any). A format whose export raises is in `failed`, not in `files`; nothing is saved
    while any export failed. `vllm_version` is the vLLM the user deploys (None: the one spectune checked, VLLM_VERSION);
    a malformed or unknown one fails the vLLM export alone, with a SettingsError. SpectuneError when the sessions
    cannot give a recommendation."""
    ids = [int(i) for i in session_ids]
    formats = format_names() if formats is None else formats
    only = formats[0] if len(formats) == 1 else None
    engine = choose_engine(store, ids, engine, only)
    query = DecisionQuery(objective, batch_size, temperature, budget, price_per_hour, regime_override, engine)
    decision, analysis = decided(store, ids, query)
    inputs = payload_inputs(ids, objective, budget, batch_size, price_per_hour, regime_override, vllm_version)
    result = Recommended(*analysis.triple, engine, inputs, decision=decision, policies=analysis.policies)
    policy = analysis.policies if decision is not None and decision.policy else None
    for fmt in formats:
        try:
            result.files[fmt] = _export(result, fmt, policy, vllm_version)
        except Exception as exc:  # noqa: BLE001 - kept per format: the others still export
            result.failed[fmt] = exc
    if save and not result.failed:
        save_result(store, result, list(result.files))
    return result


def _export(result: Recommended, fmt: str, policy: Any, vllm_version: str | None) -> tuple[str, str]:
    """One format's file of the decision: its drafting policy's (the Policies page's export,
    engine.service.decide.policies
    .export_best) where the decision is a policy, else the fixed γ's (or off)."""
    if policy is not None:
        from engine.service.decide.policies import export_best

        made = export_best(policy, fmt, vllm_version)
        return made.filename, made.text
    rec, ev = result.recommendation, result.evidence
    return export(rec, fmt, regime=result.regime, target=ev.target, vllm_version=vllm_version)


def save_result(
    store: Any,
    result: Recommended,
    formats: Sequence[str],
    rec_id: int | None = None,
    already: list[str] | None = None,
) -> tuple[int, list[str]]:
    """Keep the result's payload and its files in `formats` (evidence.store_recommendation: `rec_id`, a
    recommendation stored before for the same result; `already`, its formats stored then). Returns the id and
    the formats stored now."""
    wanted = {fmt: result.files[fmt] for fmt in formats if fmt in result.files}
    return store_recommendation(store, result.payload, wanted, rec_id, already)
