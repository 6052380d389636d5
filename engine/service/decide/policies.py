"""Speculation policies from stored sessions: the replay table, live figures beside it, the best policy, exports.

`session_policies` replays every policy of the grid from the sessions' recorded draft traces
(engine.analysis.policy_replay) with the sessions' measured c and v(k), and puts what the sessions ran live
(their fixed γs and any policies) beside the replayed figures; `export_best` writes the best policy for an
engine (engine.analysis.export.export_policy); `prove` queues a session running the best policies live.
`python -m engine policies`, `python -m engine recommend` and the dashboard all read these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.analysis.calibrate import cost_of
from engine.analysis.export import PolicyExport, export_policy
from engine.analysis.policy_replay import PolicyComparison, compare_policies, judged, replay
from engine.analysis.prediction import CostModel, Prediction
from engine.analysis.predictor import traces_of
from engine.analysis.recommend import DraftMeasurement, Recommendation, judge_for
from engine.analysis.theory import MEMORY_BOUND, REGIMES
from engine.core.policy import FixedGamma, parse_policy
from engine.drafts.kinds import kind_of_method
from engine.engines.entry import EngineEntry
from engine.engines.registry import get as get_engine
from engine.errors import SpectuneError
from engine.measure import noise
from engine.service.decide.evidence import choose_engine, recommend_from_store
from engine.service.jobs import submit_session
from engine.session.spec import SessionSpec
from engine.session.summarise import run_speedup, speedup_flag, stored_speedup_flag


@dataclass
class DraftPolicies:
    """One draft × temperature of a session: the replayed grid, and what ran live."""

    draft: str
    temperature: float
    comparison: PolicyComparison
    cost: CostModel
    live: dict[str, dict[str, Any]]  # policy spec -> live figures (fixed γs included, as fixed:G)
    measurement: DraftMeasurement | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per replayed policy (best first), the live figures beside it where it ran."""
        out = []
        for rank, r in enumerate(self.comparison.results, 1):
            live = self.live.get(r.policy) or {}
            out.append(
                {
                    "rank": rank,
                    "draft": self.draft,
                    "temperature": self.temperature,
                    "policy": r.policy,
                    "kind": r.kind,
                    "setting": r.setting,
                    "tokens_per_call": r.tokens_per_call,
                    "draft_calls_per_step": r.draft_calls_per_step,
                    "drafted_per_step": r.drafted_per_step,
                    "predicted_speedup": r.predicted_speedup,
                    "cost_multiplier": r.cost_multiplier,
                    "ops_multiplier": r.ops_multiplier,
                    "calls_exact": r.calls_exact,
                    "basis": shown_basis(r.basis, r.tokens_per_call, live.get("tokens_per_call")),
                    "live_tokens_per_call": live.get("tokens_per_call"),
                    "live_draft_calls_per_step": live.get("draft_calls_per_step"),
                    "live_speedup": live.get("speedup"),
                    "live_tokens_per_s": live.get("tokens_per_s"),
                    "live": bool(live),
                    "best_fixed": r is self.comparison.best_fixed,
                    "live_flag": live.get("flag"),
                    "feasible": r.feasible,
                    "why_not": r.infeasible_why,
                }
            )
        return out


EXACT_TOLERANCE = 1e-3  # replayed and live tokens per call this close agree (rounding of the stored figures)


def shown_basis(basis: str, replayed: float, live: float | None) -> str:
    """A replayed row's basis as the tables show it: "exact" only where a live run of the same policy, if any,
    delivered the replayed tokens per call. Where it did not, the live decode left the recorded pass (a near-tie
    that flipped in bf16, or drafting state the pass does not hold), so the row says by how much instead."""
    if basis != "exact" or not live or abs(replayed / float(live) - 1.0) <= EXACT_TOLERANCE:
        return basis
    return f"not exact here: replayed {(replayed / float(live) - 1.0) * 100:+.1f}% vs live"


@dataclass
class PolicyReport:
    """Every draft's policy comparison in the sessions, and the policy recommended for the objective."""

    session_ids: list[int]
    objective: str
    budget: float | None
    regime: str
    drafts: list[DraftPolicies]
    recommendation: Recommendation | None
    chosen: DraftPolicies | None  # the draft the recommendation is for (None: nothing replayable)
    target: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Prediction | None:
        return self.chosen.comparison.best if self.chosen else None

    @property
    def best_fixed(self) -> Prediction | None:
        return self.chosen.comparison.best_fixed if self.chosen else None

    def to_dict(self) -> dict[str, Any]:
        best, fixed = self.best, self.best_fixed
        return {
            "session_ids": self.session_ids,
            "objective": self.objective,
            "budget": self.budget,
            "regime": self.regime,
            "best": None if best is None else best.to_dict() | {"draft": self.chosen.draft},
            "best_fixed": None if fixed is None else fixed.to_dict(),
            "gain_over_best_fixed": None if self.chosen is None else self.chosen.comparison.gain,
            "rows": [row for d in self.drafts for row in d.rows()],
            "cost_model": [
                {
                    "draft": d.draft,
                    "temperature": d.temperature,
                    "c": d.cost.c,
                    "c_hat": d.cost.c_hat,
                    "verify_cost": {str(k): v for k, v in sorted((d.cost.verify_cost or {}).items())},
                }
                for d in self.drafts
            ],
            "notes": self.notes + [n for d in self.drafts for n in d.notes],
            "exact": "tokens per call and draft calls are exact at temperature 0 (the loop's own steps, replayed); "
            "speed and cost are predicted from c and v(k); at temperature > 0 everything is estimated",
        }


def policy_verdict(report: PolicyReport, escape: Callable[[Any], str] = str) -> tuple[str, bool]:
    """The policy section's one answer, as markdown (`escape` for the names in it: the pages' md_escape; the CLI
    prints it without the bold marks), and whether a policy other than a fixed γ wins. When the replayable draft
    has no policy that pays but the headline recommends another draft, the answer is the headline's."""
    best, fixed = report.best, report.best_fixed
    if best is None or fixed is None:
        return "No replayable draft trace in these sessions.", False
    gain = report.chosen.comparison.gain
    if not best.feasible:
        head = (
            f"**No policy pays** for {escape(report.chosen.draft)}: the best, {escape(best.policy)}, predicts "
            f"{best.predicted_speedup:.2f}× at cost ×{best.cost_multiplier:.2f} ({escape(best.infeasible_why)})"
        )
        rec = report.recommendation
        if rec is not None and not rec.off and rec.draft_name != report.chosen.draft:  # one answer: the headline's
            return (
                f"{head}. The recommendation is {escape(rec.draft_name)} at a fixed γ={rec.gamma} "
                f"({rec.predicted_speedup:.2f}× predicted), which has no policy to replay here: its exports are "
                "the Recommend page's.",
                False,
            )
        return f"{head} — serve the target alone (its exports turn speculation off).", False
    if best.kind == "fixed":
        return (
            f"**A fixed γ is already as good** for {escape(report.chosen.draft)}: {escape(best.policy)} predicts "
            f"{best.predicted_speedup:.2f}×; no policy beats it by more than 1%.",
            False,
        )
    return (
        f"**{escape(best.policy)}** ({escape(best.setting)}) for {escape(report.chosen.draft)}: "
        f"{best.tokens_per_call:.2f} tokens per call, {best.predicted_speedup:.2f}× predicted, "
        f"**{gain * 100:+.1f}%** over the best fixed {escape(fixed.policy)} ({fixed.predicted_speedup:.2f}×).",
        True,
    )


def _runs(store: Any, session_ids: list[int]) -> list[dict[str, Any]]:
    out = []
    for sid in session_ids:
        for run in store.list_runs(sid):
            if run.get("status") == "done" and run.get("kind") == "speculative":
                out.append(run)
    return out


def live_flag(
    figures: dict[str, Any],
    most_drafted: int,
    c: float,
    verify_cost: Mapping[Any, float] | None = None,
    loop_v: float | None = None,
) -> str | None:
    """Why a live speedup cannot be taken at face value: it breaks its bound (tokens per call ÷ (v_min + the
    draft's share)), or its per-prompt ratios are too noisy; None when it stands."""
    speedup, per_call = figures.get("speedup") or figures.get("speedup_measured"), figures.get("tokens_per_call")
    if not speedup:
        return None
    broken = figures.get("speedup_flag") or speedup_flag(
        speedup,
        most_drafted,
        per_call,
        c,
        figures.get("draft_calls_per_step"),
        verify_cost,
        figures.get("speedup_whole_run"),
        loop_v,
    )
    if broken:
        return str(broken)
    spread = figures.get("speedup_spread") or {}
    if noise.stored_noisy(spread):
        return f"too noisy to tell ({noise_why(spread)}): not calibrated to"
    return None


def noise_why(spread: Mapping[str, Any]) -> str:
    """Why a stored spread is too noisy to tell, without repeating the verdict: 'one prompt', or the per-prompt
    ratios (and a verdict other than 'too noisy to tell', e.g. 'faster, but spread wider than 1.5×')."""
    if int(spread.get("n") or 0) < 2 or not isinstance(spread.get("min"), int | float):
        return "one prompt"
    ratios = f"per-prompt ratios {float(spread['min']):.2f}–{float(spread['max']):.2f}×"
    verdict = str(spread.get("verdict") or "")
    return ratios if verdict in ("", "too noisy to tell") else f"{ratios}, {verdict}"


def live_figures(store: Any, session_ids: list[int], draft: str, temperature: float) -> dict[str, dict[str, Any]]:
    """What the sessions ran live for this draft and temperature: policy spec -> figures (fixed γ as fixed:G)."""
    live: dict[str, dict[str, Any]] = {}
    for run in _runs(store, session_ids):
        if run["draft"] != draft or abs(float(run["temperature"]) - temperature) > 1e-9:
            continue
        summary = run.get("summary") or {}
        if summary.get("policy_live"):
            figures = dict(summary["policy_live"])
            spec = figures["policy"]
        else:
            steps = summary.get("steps") or 0
            spec = FixedGamma(int(run["gamma"])).spec()
            figures = {
                "policy": spec,
                "tokens_per_call": run.get("tokens_per_call"),
                "tokens_per_s": run.get("tokens_per_s"),
                "speedup_measured": run.get("speedup_measured"),
                "speedup_spread": summary.get("speedup_spread"),
                "speedup_flag": stored_speedup_flag(run),
                "mean_drafted_per_step": summary.get("mean_drafted_per_step"),
                "draft_calls_per_step": (summary["draft_calls"] / steps)
                if summary.get("draft_calls") and steps
                else None,
            }
        figures["session_id"] = run["session_id"]
        figures["speedup"] = run_speedup(run)  # the run's one speedup, as every page shows it
        most = parse_policy(spec).max_draft()
        loop_v = ((run.get("summary") or {}).get("verify_in_loop") or {}).get("v")
        figures["flag"] = live_flag(figures, most, run.get("c") or 0.0, run.get("verify_cost"), loop_v)
        live[spec] = figures
    return live


def session_policies(
    store: Any,
    session_ids: list[int] | int,
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    regime_override: str | None = None,
    max_gamma: int = 32,
    engine: str | None = None,
    recommended: tuple[Recommendation, Any, Any] | None = None,
    temperature: float | None = None,
    in_progress: int | None = None,
) -> PolicyReport:
    """Replay every policy for every draft × temperature of the sessions; recommend one for the objective.

    The one model and the one set of rules: c is the draft cost the recommender calibrated to the measured
    speedups (its profiled c when none were measured), v(k) the sessions' measured verify cost, and every policy
    is judged as the recommender judges a γ — the objective, the budget, the depth measured, and the regime at its
    own verify width batch·(most drafted + 1). The policy recommended is the best for the draft and temperature
    the fixed-γ recommendation chose
    (every draft when that is off). `engine` is whose measurements to use (default: evidence.choose_engine);
    `recommended`, the (recommendation, evidence, regime report) a caller already computed from the same inputs
    and engine, is used as it is instead of computing it again; `in_progress`, a running session whose finished
    runs count (a quick session deciding what to confirm)."""
    ids = [session_ids] if isinstance(session_ids, int) else list(session_ids)
    engine = choose_engine(store, ids, engine)
    entry = get_engine(engine)  # a session's policies are replayed in its engine's own loop, as it ran
    rec, ev, report = recommended or recommend_from_store(
        store,
        ids,
        objective,
        budget,
        batch_size,
        None,
        regime_override,
        engine=engine,
        temperature=temperature,
        in_progress=in_progress,
    )
    regime = report.label if report.label in REGIMES else MEMORY_BOUND
    drafts: list[DraftPolicies] = []
    notes: list[str] = []
    for m in ev.measurements:
        traces = [t for t in m.traces if t.get("runs")]
        if not traces:
            notes.append(f"{m.name}: {_why_no_trace(m, entry)}")
            continue
        if not traces_of(m):
            notes.append(f"{m.name} at T={m.temperature:g}: no β recorded at that temperature")
            continue
        judge = judge_for(m, objective, budget, rec.regime_given, rec.batch_size, rec.knee_batch)
        cost = cost_of(m, regime=regime)
        comparison = compare_policies(
            traces_of(m), cost, m.temperature, judge, max_gamma=max_gamma, loop=m.drafting_loop
        )
        live = live_figures(store, ids, m.name, m.temperature)
        replayed = {r.policy for r in comparison.results}
        extra = [
            replay(traces_of(m), parse_policy(spec), cost, m.temperature, m.drafting_loop)
            for spec in live
            if spec not in replayed
        ]
        if extra:  # live policies outside the grid get replayed too, so every live point has its prediction
            comparison.results = judged([*comparison.results, *extra], judge)
        drafts.append(DraftPolicies(m.name, m.temperature, comparison, cost, live, m, list(comparison.notes)))
    chosen = None
    if drafts:
        if rec.measurement is not None:
            chosen = next((d for d in drafts if d.measurement is rec.measurement), None)
        if chosen is None:
            chosen = ranked_drafts(drafts, objective)[0]
    return PolicyReport(ids, objective, budget, regime, drafts, rec, chosen, ev.target, notes)


def _why_no_trace(m: DraftMeasurement, entry: EngineEntry) -> str:
    kind = kind_of_method(m.method)
    if entry.in_process or not entry.runs_policies:  # its traces come from the loop that measured it
        return "no trace recorded (a session from before policies, or another tokenizer)"
    if not kind.reports_confidence:
        return f"no policy to replay ({entry.label}'s {kind.label} drafts up to a fixed n-max, without a confidence)"
    return "no trace recorded (a session from before policies, or the draft did not load in PyTorch: see its notes)"


def ranked_drafts(drafts: list[DraftPolicies], objective: str) -> list[DraftPolicies]:
    """Drafts whose best policy may be recommended first, then by that policy's score under the objective."""

    def score(d: DraftPolicies) -> tuple[bool, float]:
        best = d.comparison.best
        return best.feasible, -best.cost_multiplier if objective == "cost" else best.predicted_speedup

    return sorted(drafts, key=score, reverse=True)


def recommendation_for(report: PolicyReport) -> Recommendation | None:
    """The fixed-γ recommendation of the chosen draft (rebuilt for it when the recommendation is off or for
    another draft), for the exporters' model references and notes."""
    rec, chosen = report.recommendation, report.chosen
    if rec is None or chosen is None:
        return rec
    m = chosen.measurement
    if m is not None and (rec.off or rec.draft_name != m.name):
        gamma = int(chosen.comparison.best_fixed.policy.split(":")[1])
        best = chosen.comparison.best_fixed
        rec = replace(
            rec,
            draft_name=m.name,
            method=m.method,
            model_ref=m.model_ref,
            gamma=gamma,
            measurement=m,
            predicted_speedup=best.predicted_speedup,
            schedule=None,
            temperature=m.temperature,
        )
    return rec


def export_best(report: PolicyReport, fmt: str, vllm_version: str | None = None) -> PolicyExport:
    """The recommended policy for one engine (the closest fixed γ where the engine cannot express it): the
    headline's fixed γ when no replayed policy may be recommended (the recommender's rules: objective, budget,
    crossover, width, depth) but the headline recommends another draft; off when nothing pays.
    `vllm_version`: the vLLM the vLLM file is written for (None: the one spectune checked)."""
    rec = recommendation_for(report)
    best, fixed = report.best, report.best_fixed
    if rec is None or best is None or fixed is None:
        raise SpectuneError("no policy to export: the sessions recorded no replayable trace")
    closest = int(fixed.policy.split(":")[1])
    headline = report.recommendation
    if not best.feasible and headline is not None and not headline.off and headline.draft_name != rec.draft_name:
        # the replayable draft has no policy that pays, but the headline's draft (no trace: llama.cpp's n-gram
        # lookup) does: its fixed γ is the recommended policy, the file `recommend --export` writes
        return export_policy(headline, f"fixed:{headline.gamma}", fmt, target=report.target, vllm_version=vllm_version)
    if not best.feasible:
        why = (
            f"Speculation off: no policy may be recommended for {report.objective} (best {best.policy}: "
            f"{best.predicted_speedup:.2f}×, cost ×{best.cost_multiplier:.2f}: {best.infeasible_why})."
        )
        return export_policy(
            replace(rec, gamma=0, explanation=why), best.policy, fmt, target=report.target, vllm_version=vllm_version
        )
    predicted = {
        "tokens_per_call": best.tokens_per_call,
        "speedup": best.predicted_speedup,
        "gain": report.chosen.comparison.gain,
        "best_fixed_gamma": closest,
        "basis": best.basis,
    }
    return export_policy(
        rec,
        best.policy,
        fmt,
        closest_gamma=closest,
        predicted=predicted,
        target=report.target,
        vllm_version=vllm_version,
    )


def prove(store: Any, report: PolicyReport, n: int) -> tuple[int, list[str]]:
    """Queue a session that runs the best `n` policies of different kinds and the best fixed γ, live, for the
    chosen draft on the first session's prompts; its own trace lets replay and live be compared side by side."""
    if n < 1:
        raise SpectuneError(f"--prove {n}: must be at least 1")
    if report.chosen is None:
        raise SpectuneError("nothing to prove: no replayable trace")
    session = store.get_session(report.session_ids[0])
    spec = SessionSpec.from_row(session)
    comparison = report.chosen.comparison
    candidates = comparison.top(n + 1)
    runs = get_engine(spec.engine).runs_policy
    if runs is not None:  # only what the engine runs as is (llama-server: the best confidence stops)
        candidates = [r for r in comparison.results if runs(r.policy)]
    picks = [r.policy for r in candidates if r.kind != "fixed"][:n]
    spec.drafts = [report.chosen.draft]
    spec.gammas = [int(comparison.best_fixed.policy.split(":")[1])]
    spec.temperatures = [report.chosen.temperature]
    spec.policies = picks
    new_id = submit_session(
        store,
        spec,
        session["prompt_set_id"],
        session.get("n_prompts"),
        f"prove policies of session {report.session_ids[0]}",
    )
    return new_id, [*picks, comparison.best_fixed.policy]
