"""A recommendation, or a speculation policy, as the file each engine runs from, and spectune's own record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from engine.analysis.export import vllm
from engine.analysis.export.deployment import Deployment, for_policy, not_run_by, recommended
from engine.analysis.export.files import FlagsFile, JsonFile, PolicyExport
from engine.analysis.export.formats import ExportFormat
from engine.analysis.export.payload import payload_inputs, recommendation_payload
from engine.analysis.export.refs import HF_ORIGIN, EngineRef, bundled_gguf_path, engine_ref, other_tokenizer
from engine.analysis.export.registry import (
    export_format,
    export_formats,
    format_label,
    format_names,
    register,
    unregister,
)
from engine.analysis.export.versions import (
    LLAMACPP_BUILD,
    LLAMACPP_SPEC_PARAMS_BUILD,
    SGLANG_VERSION,
    SPECTUNE_FORMAT,
    TRANSFORMERS_VERSION,
    VLLM_OLDEST,
    VLLM_SCHEDULE_SINCE,
    VLLM_VERSION,
)
from engine.analysis.export.vllm import check_vllm_version, vllm_schedule
from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport
from engine.core.policy import SpeculationPolicy, parse_policy

__all__ = [
    "HF_ORIGIN", "LLAMACPP_BUILD", "LLAMACPP_SPEC_PARAMS_BUILD", "SGLANG_VERSION", "SPECTUNE_FORMAT",
    "TRANSFORMERS_VERSION", "VLLM_OLDEST", "VLLM_SCHEDULE_SINCE", "VLLM_VERSION", "Deployment", "EngineRef",
    "ExportFormat", "PolicyExport", "bundled_gguf_path", "check_vllm_version", "engine_file", "engine_ref", "export",
    "export_format", "export_formats", "export_policy", "export_policy_all", "export_vllm", "for_policy",
    "format_label", "format_names", "other_tokenizer", "payload_inputs", "recommendation_payload", "recommended",
    "register", "unregister", "vllm_schedule",
]  # fmt: skip


def engine_file(dep: Deployment, fmt: str) -> JsonFile | FlagsFile:
    """The file `fmt`'s engine runs `dep` from; .render() is its text, .fit how closely it runs the policy. An
    engine with no draft of the deployment's kind gets speculation off, saying why."""
    record = export_format(fmt)
    if not dep.off and not record.runs_draft(dep.rec.method):
        dep = not_run_by(dep, record.label)
    return record.config(dep)


def export(
    rec: Recommendation,
    fmt: str,
    regime: RegimeReport | None = None,
    schedule: dict[int, int] | None = None,
    *,
    target: str | None = None,
    llamacpp_build: int | None = None,
    vllm_version: str | None = None,
) -> tuple[str, str]:
    """(filename, text) for one format. `schedule` defaults to rec.schedule; an "off" recommendation wins over it.

    A schedule equal to the headline γ at every batch is not repeated as per-batch flags. The
    recommendation's notes (assumptions such as an unknown regime, measurement errors) travel with
    every export: the spectune record, comments in flag files, and a "notes" list beside the
    configuration in the JSON files (never inside vLLM's speculative_config, which vLLM parses).

    `target` (the sessions' target model) names the model to serve and decides whether the draft
    tokenizes differently; `llamacpp_build` picks the llama.cpp flag names (default LLAMACPP_BUILD),
    `vllm_version` the vLLM the vLLM file is written for (default VLLM_VERSION; SettingsError for a malformed or
    unknown one, raised by the vLLM format only).
    """
    filename = export_format(fmt).filename
    dep = recommended(rec, schedule, regime, target=target, llamacpp_build=llamacpp_build, vllm_version=vllm_version)
    return filename, engine_file(dep, fmt).render()


def export_policy(
    rec: Recommendation,
    policy: SpeculationPolicy | str,
    fmt: str,
    *,
    closest_gamma: int | None = None,
    predicted: Mapping[str, Any] | None = None,
    target: str | None = None,
    llamacpp_build: int | None = None,
    vllm_version: str | None = None,
) -> PolicyExport:
    """A speculation policy (engine.core.policy) for one engine, for the draft `rec` recommends.

    Where the engine can express the policy it gets the policy's own flags or fields (llama.cpp: p-min, n-min
    and n-max; transformers: the assistant's num_assistant_tokens, its schedule and confidence threshold; vLLM:
    γ by batch size); where it cannot, it gets the closest thing it runs, a fixed γ = `closest_gamma` (the best
    fixed γ of the replay; default rec.gamma), and `lost` says what that gives up. `predicted` (tokens_per_call,
    speedup, gain, best_fixed_gamma, basis) goes into the headline. Each engine's file is made as for a fixed γ,
    from the same Deployment, so what the files were checked against still holds."""
    filename = export_format(fmt).filename
    if isinstance(policy, str):
        policy = parse_policy(policy)
    if rec.off:
        filename, text = export(rec, fmt, target=target, llamacpp_build=llamacpp_build, vllm_version=vllm_version)
        return PolicyExport(fmt, filename, text, True, "speculation off", [])
    dep = for_policy(
        rec,
        policy,
        closest_gamma=closest_gamma,
        predicted=predicted,
        target=target,
        llamacpp_build=llamacpp_build,
        vllm_version=vllm_version,
    )
    file = engine_file(dep, fmt)
    return PolicyExport(fmt, filename, file.render(), file.fit.exact, file.fit.runs, list(file.fit.lost))


def export_policy_all(rec: Recommendation, policy: SpeculationPolicy | str, **kwargs: Any) -> dict[str, PolicyExport]:
    """export_policy for every format."""
    return {fmt: export_policy(rec, policy, fmt, **kwargs) for fmt in format_names()}


def export_vllm(
    rec: Recommendation,
    schedule: dict[int, int] | None = None,
    target: str | None = None,
    vllm_version: str | None = None,
) -> str:
    """vLLM's file alone, without the recommendation's notes; `schedule` (default none) is the γ by batch size."""
    dep = recommended(replace(rec, notes=[]), {}, target=target, vllm_version=vllm_version)
    return vllm.config(replace(dep, per_batch=schedule or None)).render()
