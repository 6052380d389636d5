"""RunSummary: what one run of a sweep measured, typed, with the store's columns named in one place.

Names follow vLLM's spec-decode metrics (engine.core.counters' glossary): tokens per call is tokens emitted ÷
every target call (what a speedup is bounded by); mean acceptance length is vLLM's, 1 + accepted ÷ drafts, over the
calls that drafted (the two differ where a proposer drafts on some calls only); draft acceptance rate is accepted ÷
drafted; per-position acceptance is the conditional rate at each draft position. α is the mean exact acceptance
probability β. v(k) (`verify_cost`) is a ratio of forward times, t(k)/t(1), never seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# RunSummary fields that are also columns of the runs table (the rest lives in the run's summary JSON)
RUN_COLUMNS = (
    "alpha", "tokens_per_call", "per_position_acceptance", "c", "verify_cost", "tokens_per_s",
    "speedup_measured", "speedup_predicted",
)  # fmt: skip


@dataclass
class RunSummary:
    """One run's results. A baseline (γ = 0) has no α, no acceptance and speedups of exactly 1."""

    tokens_per_s: float
    steps: int
    tokens: int
    tokens_per_call: float | None
    mean_acceptance_length: float | None = None  # vLLM's: over the drafting calls only (None: none drafted)
    alpha: float | None = None
    alpha_from_acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    per_position_acceptance: list[float] = field(default_factory=list)
    drafting_fraction: float | None = None  # share of target calls that verified a draft (llama.cpp's counters)
    c: float = 0.0
    # what a drafting step cost the engine beyond its forwards (engine.analysis.step_overhead, fitted over the
    # session's runs of this draft) and this run's verify as measured in the loop; None where not measured
    step_overhead: dict[str, float] | None = None
    verify_in_loop: dict[str, float] | None = None
    speedup_measured: float | None = 1.0  # the median of per-prompt ratios beside the baseline (the spread's)
    # tokens/s over every prompt ÷ the baseline's over the same prompts: what the prediction is and is checked by,
    # and the one speedup every page shows for the run (engine.session.summarise.run_speedup)
    speedup_whole_run: float | None = None
    speedup_predicted: float | None = 1.0
    verify_cost: dict[int, float] = field(default_factory=dict)
    speedup_spread: dict[str, Any] | None = None  # engine.measure.noise.Spread as a dict: median/min/max/n/verdict
    # the prompts whose ratio in the spread breaks that prompt's own bound (its tokens per call ÷ (v_min + the
    # draft's share)): prompt number, ratio, bound (engine.session.summarise.prompts_above_bound); [] when none does
    speedup_above_bound: list[dict[str, float]] | None = None
    # why the measured speedup is impossible (it breaks its bound, engine.analysis.bounds): decided once, here,
    # and read by every page, the CLI and the report; None: it stands (or nothing was measured)
    speedup_flag: str | None = None
    machine_load: dict[str, Any] | None = None  # other processes' CPU share while this run was measured
    engine: str = "spectune"  # the engine registry's name for where it was measured
    method: str | None = None
    wall_s: float | None = None
    # an engine that batches: requests in flight while measured, and their latencies (None where not measured)
    concurrency: int = 1
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    agreement_runs: list[list[int]] | None = None
    # speculation policies (engine.core.policy): every run's drafting, and a policy run's own figures
    mean_drafted_per_step: float | None = None  # draft tokens sent to verification per target call
    draft_calls: int | None = None  # draft forwards over the run
    # a policy run (its runs-table γ is 0, its α and speedup columns empty, so the fixed-γ recommender
    # never mistakes it for a γ): the policy's spec and what it measured (engine.session.summarise.policy_live)
    policy: str | None = None
    policy_live: dict[str, Any] | None = None
    # per prompt, the draft's trace every policy replays from (engine.measure.agreement.draft_trace); kept on
    # one run per draft
    policy_trace: list[dict[str, Any]] | None = None

    def columns(self) -> dict[str, Any]:
        """The values the runs table keeps in columns."""
        return {key: getattr(self, key) for key in RUN_COLUMNS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, v(k) keyed by str."""
        data = asdict(self)
        data["verify_cost"] = {str(k): v for k, v in self.verify_cost.items()}
        return data
