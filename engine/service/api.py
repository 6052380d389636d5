"""The engine as the dashboard sees it: every name a page or view takes from below the service layer.

The app imports from the engine only `engine.service` and `engine.errors` (tests/test_architecture.py); what it needs
of the layers below (the theory's formulas, the bounds, the stored-figure helpers, the engine registry, the prompt
parser, the bundled models) comes through this module, so those layers can move without the app noticing.
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
from engine.core.policy import parse_policy
from engine.endpoint.report import compare, request_stats
from engine.endpoint.settings import APIS, ENGINE_KINDS, MAX_CONCURRENCY, parse_levels
from engine.engines import registry
from engine.measure.hardware import describe_hardware
from engine.measure.noise import BUSY_OTHER_CPU_PCT, stored_noisy
from engine.models.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET, parameter_count
from engine.prompts import MAX_UPLOAD_BYTES, ParseResult, display_name, parse_prompt_bytes, summarise
from engine.service.budget import (
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
from engine.service.default_engine import EngineDefault, default_engine
from engine.service.watch_actions import ActionFile
from engine.service.watch_actions import action_file as watch_action_file
from engine.session.estimates import batch_sweep_eta_s, verify_cost_eta_s
from engine.session.sampling import session_prompts
from engine.session.spec import LOOPS, LoopOptions, SessionSpec, session_engine
from engine.session.summarise import BestSpeedup, best_speedup, speedup_flag, stored_speedup_flag
from engine.watch.verdict import VERDICTS as WATCH_VERDICTS
from engine.watch.window import STATES as WATCH_STATES

__all__ = [
    "APIS", "BUNDLED", "BUSY_OTHER_CPU_PCT", "COMPUTE_BOUND", "DEFAULT_DRAFT", "DEFAULT_TARGET", "ENGINE_KINDS",
    "LOOPS", "MAX_CONCURRENCY", "MAX_UPLOAD_BYTES", "MEMORY_BOUND", "VLLM_SCHEDULE_SINCE", "VLLM_VERSION",
    "WATCH_STATES", "WATCH_VERDICTS", "ActionFile",
    "BestSpeedup", "Cut", "DraftMeasurement", "DraftSummary", "EngineDefault", "GammaPoint", "LoopOptions", "Pace",
    "ParseResult", "Recommendation", "SessionSpec", "SizedPlan", "batch_sweep_eta_s", "best_speedup", "budget_facts",
    "budget_outcome",
    "check_predicted_speedup", "compare", "cost_per_token_multiplier", "crossover_from_curve", "crossover_gamma",
    "default_budget", "default_engine", "describe_hardware", "display_name", "draft_acceptance_rate",
    "expected_tokens_per_call", "gamma_curve", "minutes", "operations_multiplier", "parameter_count", "parse_budget",
    "parse_levels", "parse_policy", "parse_prompt_bytes", "regime_of", "registry", "request_stats", "session_engine",
    "session_prompts", "size_to_budget", "sized_for", "speedup_flag", "stored_noisy", "stored_speedup_flag",
    "summarise", "tokens_per_call", "verify_cost_eta_s", "walltime_improvement", "watch_action_file",
]  # fmt: skip
