"""The recommender's data: what was measured per draft, a γ curve's rows, the per-draft table and the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.analysis.feasibility import OBJECTIVES as OBJECTIVES
from engine.analysis.feasibility import TIE as TIE
from engine.analysis.prediction import DraftingLoop, Prediction
from engine.analysis.step_overhead import StepOverhead
from engine.drafts.refs import NGRAM_DEFAULT

DEFAULT_GAMMAS = range(1, 33)
SCHEDULE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
UNKNOWN = "unknown"  # a regime nothing decided: treated as memory-bound, and said so in the notes


@dataclass
class DraftMeasurement:
    """What the sessions measured for one draft (or n-gram proposer) against one target on one workload."""

    name: str
    method: str  # a draft kind's method (engine.drafts.kinds): "draft_model", "ngram", "suffix", "none", …
    model_ref: str | None
    alpha: float
    per_position_acceptance: list[float] = field(default_factory=list)  # conditional a_i at draft position i+1
    c: float = 0.0  # draft forward time / target forward time
    verify_cost: dict[int, float] = field(default_factory=dict)  # k -> v(k); empty = not measured (v ≡ 1 assumed)
    # per prompt, per output position t of the target's greedy output: how many consecutive draft tokens from t
    # match the target output (may be empty)
    agreement_runs: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    measured_speedup: dict[int, float] = field(default_factory=dict)  # γ -> measured speedup
    noisy_speedup: dict[int, str] = field(default_factory=dict)  # γ -> why that measurement is too noisy to fit
    session_ids: list[int] = field(default_factory=list)
    c_hat: float = 0.0  # draft arithmetic / target arithmetic (≈ parameter ratio); 0 reproduces the chapter
    ngram_max: int = NGRAM_DEFAULT[1]  # n-gram window the draft reference names (n-gram lookup only)
    ngram_min: int = NGRAM_DEFAULT[0]
    measured_tokens_per_call: dict[int, float] = field(default_factory=dict)  # γ -> the run's tokens per target call
    # γ -> the flag the run was stored with (engine.session.summarise.speedup_flag: decided once, when the sweep
    # summarised it, from the whole run and its own loop), None where it stands; absent: judged from the figures
    run_flags: dict[int, str | None] = field(default_factory=dict)
    c_hat_source: str = ""  # where ĉ came from ("parameter counts …", "measured c"), for the notes
    # share of target calls that verified a draft at all: below 1 where the proposer drafts only sometimes
    # (llama.cpp's n-gram lookup, when it finds a match); its per-position acceptance counts only those calls
    drafting_fraction: float = 1.0
    # per prompt, the draft's recorded pass (engine.measure.agreement.draft_trace): what the one predictor replays
    traces: list[dict[str, Any]] = field(default_factory=list)
    drafting_loop: DraftingLoop = DraftingLoop()  # the loop of the engine that measured it (the replay models it)
    c_values: list[float] = field(default_factory=list)  # c as each run measured it (its spread)
    step_overhead: StepOverhead = StepOverhead()  # the engine's cost per drafting step beyond its forwards
    c_in_loop: bool = False  # c and the step overhead were measured inside the engine's loop: not calibrated
    # requests in flight (> 1: an engine that batches) -> γ -> (measured speedup against the target alone at that
    # level, too noisy to tell); level 1 is measured_speedup / noisy_speedup
    level_speedups: dict[int, dict[int, tuple[float, bool]]] = field(default_factory=dict)
    # γ -> (lowest, highest) per-prompt speedup of the run measured at that γ: the noise band around its speedup
    measured_band: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass
class GammaPoint:
    """One row of a draft's γ curve: the one model's prediction at a fixed γ, the measurement beside it, and
    Theorem 3.8's single-α figure as a labelled reference (never a second prediction)."""

    gamma: int
    prediction: Prediction
    expected_tokens_one_alpha: float  # single-α model (Theorem 3.8's numerator), reference only
    speedup_one_alpha: float  # Theorem 3.8 with the measured α and c (v = 1), reference only
    measured_speedup: float | None
    verify_cost: float  # v(γ+1) used
    verify_extrapolated: bool = False  # γ+1 lies beyond the largest measured k: v(γ+1) is extrapolated
    measured_flag: str | None = None  # the measured speedup breaks a physical bound: shown, never calibrated to
    measured_noisy: str | None = None  # why the measured speedup is too noisy to tell: shown, never calibrated to
    flags: list[str] = field(default_factory=list)  # a prediction that broke a bound (a model bug, shown)
    kind = "fixed"

    @property
    def expected_tokens(self) -> float:
        """Tokens per target call (the bonus token included)."""
        return self.prediction.tokens_per_call

    @property
    def speedup_predicted(self) -> float:
        return self.prediction.predicted_speedup

    @property
    def speedup(self) -> float:
        return self.prediction.predicted_speedup

    @property
    def ops_multiplier(self) -> float:
        return self.prediction.ops_multiplier

    @property
    def most_drafted(self) -> int:
        return self.gamma

    @property
    def draft_calls_per_step(self) -> float:
        return self.prediction.draft_calls_per_step

    @property
    def expected_tokens_source(self) -> str:
        """How tokens per call were predicted: "exact" / "estimated" (a replayed pass) or "positional"."""
        return self.prediction.basis

    @property
    def extrapolated(self) -> bool:
        """Beyond the measured depth (acceptance or v(k))."""
        return self.prediction.extrapolated


@dataclass
class DraftSummary:
    """One row of the per-draft comparison (the chapter's T5 table, plus what we decided)."""

    name: str
    method: str
    model_ref: str | None
    alpha: float
    c: float
    c_effective: float | None  # the c the model uses when measured speedups exist (fitted, or profiled with a flag)
    best_gamma: int
    best_speedup: float
    ops_multiplier: float
    cost_change: float
    crossover_gamma: int | None
    measured_speedup: dict[int, float]
    pays: bool
    measured_flags: dict[int, str] = field(default_factory=dict)  # γ -> why that measured speedup is impossible
    measured_noisy: dict[int, str] = field(default_factory=dict)  # γ -> why that measured speedup is too noisy
    why_not: str = ""  # why its best γ may not be recommended ('' when it pays)
    regime: str = ""  # the regime its best γ's verify step runs in
    calibration_flag: str | None = None  # why its measured speedups were not calibrated to
    curve: list[GammaPoint] = field(default_factory=list)  # its γ curve, as the recommender judged it


BAND_SLACK = 0.05  # a prediction this far outside the measured band still agrees with it (timing noise)


@dataclass(frozen=True)
class MeasuredCheck:
    """A measured run of the recommended configuration beside its prediction: the measurement bounds the headline.

    `low`–`high` is the measurement's noise band: the lowest and highest per-prompt speedup of the run, widened to
    take in the whole-run speedup (the figure judged), which can lie outside its prompts' ratios where prompts
    decode different numbers of tokens (each weighs by its time in the whole run); the speedup alone where the run
    kept no per-prompt ratios. The prediction disagrees with the measurement when it lies outside the band by more
    than BAND_SLACK, and then the headline shows the measurement, not the prediction."""

    gamma: int
    measured: float  # the run's speedup over the whole run (the figure its bound check judges)
    low: float
    high: float
    predicted: float
    noisy: bool = False  # the measurement is too noisy to tell (it straddles 1× or spreads widely)

    @property
    def disagrees(self) -> bool:
        """The prediction lies outside the measurement's noise band (by more than BAND_SLACK)."""
        return not self.low * (1.0 - BAND_SLACK) <= self.predicted <= self.high * (1.0 + BAND_SLACK)

    @property
    def headline(self) -> float:
        """The speedup the headline shows: the measurement where the prediction disagrees with it, else the
        prediction (inside the band, so bounded by the measurement)."""
        return self.measured if self.disagrees else self.predicted

    def band_text(self) -> str:
        band = f"prompts {self.low:.2f}–{self.high:.2f}×" if self.high > self.low else "one figure"
        return band + ("; too noisy to tell" if self.noisy else "")

    def words(self) -> str:
        """The measurement beside the headline, and what it does to it, in one sentence."""
        seen = f"measured {self.measured:.2f}× on this very configuration over the whole run ({self.band_text()})"
        if not self.disagrees:
            return f"{seen}: the prediction {self.predicted:.2f}× lies within its noise"
        side = "above" if self.predicted > self.high else "below"
        out = (
            f"{seen}: the prediction {self.predicted:.2f}× lies {side} it beyond the noise, so the headline shows "
            "the measurement"
        )
        if self.measured <= 1.0:
            out += "; measured, it does not pay"
        return out + ("; confirm it with another run before deploying" if self.noisy or self.measured <= 1.0 else "")


@dataclass
class Recommendation:
    """The decision: a draft and γ (or off), what it predicts, and why."""

    objective: str
    regime: str
    budget: float | None
    batch_size: int
    draft_name: str | None
    method: str  # a draft kind's method (engine.drafts.kinds); "none" when off
    model_ref: str | None
    gamma: int  # 0 = speculation off
    predicted_speedup: float
    ops_multiplier: float
    cost_change: float  # fractional change in cost per token under the regime (+0.4 = +40%)
    crossover: dict[str, int | None]
    comparison: list[DraftSummary]
    explanation: str
    temperature: float = 0.0
    measurement: DraftMeasurement | None = None
    curve: list[GammaPoint] = field(default_factory=list)
    cost_per_million_baseline: float | None = None
    cost_per_million: float | None = None
    schedule: dict[int, int] | None = None  # batch size -> γ from gamma_schedule(); schedule[batch_size] == gamma
    notes: list[str] = field(default_factory=list)
    schedule_measured: list[int] = field(default_factory=list)  # the schedule's batches read from a measured surface
    # measured batch where the schedule turns speculation off -> the draft's best speedup measured there: what an
    # engine that keeps its speculative path running at K 0 (vLLM's ranges) still pays (engine.analysis.schedule)
    off_range_speedups: dict[int, float] = field(default_factory=dict)
    knee_batch: int | None = None  # the batch sweep's knee the regime per γ was judged against, if any
    regime_given: str = "unknown"  # the regime as given (before judging per width): the policy table's too
    # a measured run of the recommended draft and γ at the serving batch beside its prediction (None: none measured)
    measured_check: MeasuredCheck | None = None

    @property
    def off(self) -> bool:
        """Is speculation off (γ = 0)?"""
        return self.gamma == 0

    @property
    def headline_speedup(self) -> float:
        """The speedup the headline shows: the prediction, unless a measured run of the same configuration
        disagrees with it beyond the noise (then the measurement: MeasuredCheck.headline)."""
        if self.off or self.measured_check is None:
            return self.predicted_speedup
        return self.measured_check.headline

    @property
    def prefers_measurement(self) -> bool:
        """A measured run of the recommended configuration disagrees with its prediction beyond the noise."""
        return not self.off and self.measured_check is not None and self.measured_check.disagrees

    def speedup_phrase(self, bold: str = "") -> str:
        """The headline's speedup in words: 'predicted 1.15× faster', or where a measured run of the configuration
        disagrees beyond the noise 'measured 0.80× (predicted 1.15×: they disagree beyond the noise)'. `bold`
        wraps the figure (markdown's '**')."""
        if not self.prefers_measurement:
            return f"predicted {bold}{self.predicted_speedup:.2f}×{bold} faster"
        return (
            f"measured {bold}{self.headline_speedup:.2f}×{bold} (predicted {self.predicted_speedup:.2f}×: they "
            "disagree beyond the noise)"
        )

    def measured_sentence(self) -> str | None:
        """The measured run of the recommended configuration beside the headline, as a sentence; None when off or
        when none was measured."""
        if self.off or self.measured_check is None:
            return None
        words = self.measured_check.words()
        return f"{self.draft_name} γ={self.gamma}: {words}."
