"""The engine as the dashboard sees it: every name a page or view takes from the engine.

The app imports from the engine only this module and `engine.errors` (tests/test_architecture.py): the service's
own jobs (submit, decide, recommend, report, the worker's state) and what the app needs of the layers below (the
theory's formulas, the bounds, the stored-figure helpers, the engine registry, the prompt parser, the bundled
models) come through here, so the service and those layers can move without the app noticing.
"""

from __future__ import annotations

from engine.analysis.bounds import check_predicted_speedup
from engine.analysis.export import VLLM_SCHEDULE_SINCE, VLLM_VERSION
from engine.analysis.recommend import (
    DraftMeasurement,
    DraftSummary,
    GammaPoint,
    Recommendation,
    crossover_from_curve,
    gamma_curve,
    regime_of,
)
from engine.analysis.theory import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    cost_per_token_multiplier,
    crossover_gamma,
    expected_tokens_per_call,
    operations_multiplier,
    walltime_improvement,
)
from engine.core.counters import draft_acceptance_rate, tokens_per_call
from engine.core.policy import parse_policy, policy_kinds
from engine.drafts.kinds import draft_kinds, kind_of_method
from engine.engines import registry
from engine.engines.endpoint.report import compare, request_stats
from engine.engines.endpoint.settings import APIS, ENGINE_KINDS, MAX_CONCURRENCY, parse_levels
from engine.engines.spectune.options import LOOPS
from engine.measure.hardware import describe_hardware
from engine.measure.noise import BUSY_OTHER_CPU_PCT, stored_noisy
from engine.models.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET, parameter_count
from engine.prompts import MAX_UPLOAD_BYTES, ParseResult, display_name, parse_prompt_bytes, summarise
from engine.service.decide.decisions import Decision, DecisionQuery, decided, decision_for, queue_confirmation
from engine.service.decide.evidence import RECOMMEND_ENGINES, choose_engine, engine_comparison, measured_temperatures
from engine.service.decide.policies import DraftPolicies, PolicyReport, export_best, policy_verdict, prove
from engine.service.decide.recommendations import (
    Recommended,
    export_format,
    export_formats,
    format_label,
    recommend_and_export,
    save_result,
)
from engine.service.decide.surface import Surface, SurfaceCell, stops_paying, surface_cells, surfaces
from engine.service.endpoint_sessions import EndpointCheck, check_endpoint, submit_endpoint_session
from engine.service.jobs import open_app_store, submit_session, token_strings
from engine.service.report.document import report_filename, report_or_error
from engine.service.report.measurement_notes import floor_note, loop_note, overhead_note
from engine.service.report.runs import (
    baseline_tps,
    compared_baseline,
    configuration_run,
    run_concurrency,
    run_label,
    run_policy,
    run_speedups,
    run_spread,
    run_verdict,
    spread_text,
)
from engine.service.report.session_status import UNFINISHED_RUNS, cancelled_text, session_error
from engine.service.sizing.budget import (
    Cut,
    Pace,
    SizedPlan,
    budget_facts,
    budget_outcome,
    default_budget,
    minutes,
    parse_budget,
    size_to_budget,
    sized_for,
)
from engine.service.sizing.default_engine import EngineDefault, default_engine
from engine.service.sizing.estimate import estimate_for, estimate_with_probe
from engine.service.sizing.pace_probe import DECODE_BOUND_S, PROBE_TOKENS, first_prompt
from engine.service.stored_session import StoredSession
from engine.service.watch_actions import ActionFile
from engine.service.watch_actions import action_file as watch_action_file
from engine.service.worker.control import ensure_worker, worker_alive
from engine.session.estimates import batch_sweep_eta_s, verify_cost_eta_s
from engine.session.sampling import session_prompts
from engine.session.spec import SessionSpec
from engine.session.summarise import BestSpeedup, best_speedup, speedup_flag, stored_speedup_flag, whole_run_speedup
from engine.watch.verdict import VERDICTS as WATCH_VERDICTS
from engine.watch.window import STATES as WATCH_STATES

__all__ = [
    "APIS", "BUNDLED", "BUSY_OTHER_CPU_PCT", "COMPUTE_BOUND", "DECODE_BOUND_S", "DEFAULT_DRAFT", "DEFAULT_TARGET",
    "ENGINE_KINDS", "LOOPS", "MAX_CONCURRENCY", "MAX_UPLOAD_BYTES", "MEMORY_BOUND", "PROBE_TOKENS",
    "RECOMMEND_ENGINES", "UNFINISHED_RUNS", "VLLM_SCHEDULE_SINCE", "VLLM_VERSION", "WATCH_STATES", "WATCH_VERDICTS",
    "ActionFile", "BestSpeedup", "Cut", "Decision", "DecisionQuery", "DraftMeasurement", "DraftPolicies",
    "DraftSummary", "EndpointCheck", "EngineDefault", "GammaPoint", "Pace", "ParseResult", "PolicyReport",
    "Recommendation", "Recommended", "SessionSpec", "SizedPlan", "StoredSession", "Surface", "SurfaceCell",
    "baseline_tps", "batch_sweep_eta_s", "best_speedup", "budget_facts", "budget_outcome", "cancelled_text",
    "check_endpoint", "check_predicted_speedup", "choose_engine", "compare", "compared_baseline", "configuration_run",
    "cost_per_token_multiplier", "crossover_from_curve", "crossover_gamma", "decided", "decision_for",
    "default_budget", "default_engine", "describe_hardware", "display_name", "draft_acceptance_rate", "draft_kinds",
    "engine_comparison", "ensure_worker", "estimate_for", "estimate_with_probe", "expected_tokens_per_call",
    "export_best", "export_format", "export_formats", "first_prompt", "floor_note", "format_label", "gamma_curve",
    "kind_of_method", "loop_note", "measured_temperatures", "minutes", "open_app_store", "operations_multiplier",
    "overhead_note",
    "parameter_count", "parse_budget", "parse_levels", "parse_policy", "parse_prompt_bytes", "policy_kinds",
    "policy_verdict", "prove", "queue_confirmation", "recommend_and_export", "regime_of", "registry", "report_filename",
    "report_or_error", "request_stats", "run_concurrency", "run_label", "run_policy", "run_speedups", "run_spread",
    "run_verdict", "save_result", "session_error", "session_prompts", "size_to_budget", "sized_for",
    "speedup_flag", "spread_text", "stops_paying", "stored_noisy", "stored_speedup_flag", "submit_endpoint_session",
    "submit_session", "summarise", "surface_cells", "surfaces", "token_strings", "tokens_per_call",
    "verify_cost_eta_s", "walltime_improvement", "watch_action_file", "whole_run_speedup", "worker_alive",
]  # fmt: skip
