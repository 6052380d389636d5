"""Every speculation policy replayed from one recorded pass: tokens per target call, draft calls, speed, cost.

Why: a policy (engine.core.policy) decides each step how many tokens to draft; trying each one live costs a
decode per setting. The draft's trace (engine.measure.agreement.draft_trace: teacher-forced agreement runs,
the draft's confidence at each position, and its own continuation past each first mismatch) is enough to
replay what the decoding loop would do under any policy, with the very same policy methods the loop calls.

What is exact and what is estimated:

* temperature 0, a draft model or n-gram lookup: the tokens per target call are exact: the same drafts, the
  same acceptances, the same steps as the loop (in float32; in bf16 a near-tie may flip). Draft calls per step
  are exact too, unless a confidence stop would have drafted past the recorded continuation (`calls_exact`
  False; the replay then assumes the draft stays sure);
* temperature > 0: estimated. The expected tokens per call from β per position (Σ min(p, q), teacher-forced
  along the target's greedy output, which the sampled output leaves), with the confidence stop read along the
  same path; stateless policies by exact expectation, adaptive ones by averaging seeded simulations;
* speed and cost are always predictions: each step costs c·(draft forwards) + v(drafted + 1) target-step units
  (c measured, v(k) the measured verify cost through theory.fit_verify_cost), against 1 per token for the
  target alone; the arithmetic (ops multiplier) is Σ(ĉ·forwards + drafted + 1) per token (Theorem 3.11's
  count, step by step); cost per token is 1/speedup memory-bound, the ops multiplier compute-bound.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.analysis.feasibility import Judge
from engine.analysis.prediction import IN_PROCESS_LOOP, CostModel, DraftingLoop, Prediction, Tally, finish
from engine.core.policy import DROP, KEEP, ConfidenceStop, FixedGamma, GridAsk, SpeculationPolicy
from engine.core.policy import policy_grid as registered_grid
from engine.drafts.kinds import draft_kinds, kind_of_method

SIMULATIONS = 16  # seeded simulations per adaptive policy at temperature > 0
TRANSFORMERS_DEFAULT = ConfidenceStop(0.4, 20, 0, keep_last=True)  # num_assistant_tokens 20, threshold 0.4


def _confidence_keys(which: str) -> tuple[str, str]:
    if which == "top10":
        return "confidence_top10", "continuation_top10"
    if which != "full":
        raise ValueError(f"confidence must be 'full' or 'top10', got {which!r}")
    return "confidence", "continuation"


def trace_usable(trace: Mapping[str, Any]) -> bool:
    """Whether the trace has runs of a registered kind that speculates (not "unsupported")."""
    speculating = {kind.method for kind in draft_kinds() if kind.speculates}
    return trace.get("method") in speculating and bool(trace.get("runs"))


def has_confidence(trace: Mapping[str, Any]) -> bool:
    """Whether the trace's draft kind reports its confidence (a confidence stop can fire)."""
    return kind_of_method(trace.get("method")).reports_confidence


def _draft_length(
    policy: SpeculationPolicy,
    g: int,
    run: int,
    t: int,
    conf: Sequence[float] | None,
    cont: Mapping[str, Sequence[float]] | None,
    along_path: bool = False,
) -> tuple[int, int, bool]:
    """(drafted, forwards, truncated) for a step at position t that may draft g tokens, of which the first
    `run` match the target. With along_path, confidences are read along the target's path only (T > 0)."""
    if g <= 0:
        return 0, 0, False
    if not policy.uses_confidence or conf is None:
        return g, g, False
    drafted = forwards = 0
    truncated = False
    n_out = len(conf)
    for i in range(1, g + 1):
        forwards += 1
        pos = t + i - 1
        if along_path or i - 1 <= run:  # every earlier draft token matched: the draft saw the true context
            if pos < n_out:
                sure = conf[pos]
            else:  # past the end of the recorded output (it ended on EOS): assume sure
                sure, truncated = 1.0, True
        else:  # after the draft's own wrong token at t + run: its recorded continuation
            seq = (cont or {}).get(str(t + run)) or []
            k = i - run - 2
            if k < len(seq):
                sure = seq[k]
            else:  # not recorded: the continuation ended on a token below every grid p, or at its cap
                sure, truncated = 1.0, True
        decision = policy.stop(i, sure)
        if decision == DROP:
            break
        drafted = i
        if decision == KEEP:
            break
    return drafted, forwards, truncated


def _lookup(
    runs: Sequence[int], proposable: Sequence[int] | None, exceptions: Mapping[str, Any], g: int, t: int
) -> tuple[int, int | None]:
    """(matching run, tokens the lookup can propose) at position t for a step that may draft g: the recorded
    exception for that g where the draft differs (suffix decoding's γ is its max_spec_tokens), else the cap's."""
    exc = (exceptions.get(str(g)) or {}).get(str(t))
    if exc is not None:
        return int(exc[0]), int(exc[1])
    return int(runs[t]), None if proposable is None else int(proposable[t])


def _greedy(
    traces: Sequence[Mapping[str, Any]], policy: SpeculationPolicy, which: str, cost: CostModel, prefill: bool = False
) -> Tally:
    conf_key, cont_key = _confidence_keys(which)
    fit = cost.fit()
    tally = Tally()
    state = policy.start()
    for trace in traces:
        runs = trace["runs"]
        n_out = len(runs)
        max_new = int(trace.get("max_new_tokens") or n_out)
        proposable = trace.get("proposable")
        model = has_confidence(trace)
        conf, cont = (trace.get(conf_key), trace.get(cont_key)) if model else (None, None)
        t = 0
        if prefill and n_out:  # llama-server samples the first token from the prompt's own forward (a call)
            t, tally.steps = 1, tally.steps + 1
        exceptions = trace.get("gamma_exceptions") or {}  # suffix: where a γ-token draft is not the cap's cut
        while t < n_out:
            g = max(0, min(policy.length(state), max_new - t - 1))
            run, cap = _lookup(runs, proposable, exceptions, g, t)
            if cap is not None:
                g = min(g, cap)
            drafted, forwards, truncated = _draft_length(policy, g, run, t, conf, cont)
            tally.truncated |= truncated
            if not model:
                forwards = 0  # n-gram lookup costs no draft forward
            if 0 < drafted < policy.min_draft:
                drafted = 0
            accepted = min(run, drafted)
            tally.step(1.0, drafted, forwards, cost, fit)
            end = n_out - t  # the loop counts a step that ends the output only up to its end
            state = policy.update(state, min(drafted, end), min(accepted, end))
            t += min(accepted + 1, end)
        tally.tokens += n_out
    return tally


def _stateless(policy: SpeculationPolicy) -> bool:
    return not policy.carries_state


def _sampled(
    traces: Sequence[Mapping[str, Any]],
    policy: SpeculationPolicy,
    which: str,
    cost: CostModel,
    temperature: float,
    simulations: int,
    seed: int,
) -> Tally:
    """Expected tallies at temperature > 0 from β per position: exact expectation for stateless policies
    (probability mass over step starts), the mean of seeded simulations for adaptive ones."""
    conf_key, _ = _confidence_keys(which)
    key = f"{temperature:g}"
    fit = cost.fit()
    tally = Tally()
    if _stateless(policy):
        state = policy.start()
        for trace in traces:
            beta = trace["beta"][key]
            n_out = len(beta)
            max_new = int(trace.get("max_new_tokens") or n_out)
            conf = trace.get(conf_key)
            mass = [0.0] * (n_out + 1)
            mass[0] = 1.0
            for t in range(n_out):
                if mass[t] <= 0:
                    continue
                g = max(0, min(policy.length(state), max_new - t - 1))
                drafted, forwards, truncated = _draft_length(policy, g, 0, t, conf, None, along_path=True)
                tally.truncated |= truncated
                if 0 < drafted < policy.min_draft:
                    drafted = 0
                tally.step(mass[t], drafted, forwards, cost, fit)
                reach = 1.0  # P(the first a drafted tokens are all accepted)
                for a in range(drafted + 1):
                    if a == drafted or t + a >= n_out:  # every drafted token accepted (or the output ends)
                        mass[min(t + a + 1, n_out)] += mass[t] * reach
                        break
                    mass[t + a + 1] += mass[t] * reach * (1.0 - beta[t + a])  # rejected at a: a + 1 tokens
                    reach *= beta[t + a]
            tally.tokens += n_out
        return tally
    rng = random.Random(seed)
    for _ in range(simulations):
        state = policy.start()
        for trace in traces:
            beta = trace["beta"][key]
            n_out = len(beta)
            max_new = int(trace.get("max_new_tokens") or n_out)
            conf = trace.get(conf_key)
            t = 0
            while t < n_out:
                g = max(0, min(policy.length(state), max_new - t - 1))
                drafted, forwards, truncated = _draft_length(policy, g, 0, t, conf, None, along_path=True)
                tally.truncated |= truncated
                if 0 < drafted < policy.min_draft:
                    drafted = 0
                accepted = 0
                while accepted < drafted and t + accepted < n_out and rng.random() < beta[t + accepted]:
                    accepted += 1
                tally.step(1.0 / simulations, drafted, forwards, cost, fit)
                end = n_out - t
                state = policy.update(state, min(drafted, end), min(accepted, end))
                t += min(accepted + 1, end)
            tally.tokens += n_out / simulations
    return tally


def replay(
    traces: Sequence[Mapping[str, Any]],
    policy: SpeculationPolicy,
    cost: CostModel | None = None,
    temperature: float = 0.0,
    loop: DraftingLoop = IN_PROCESS_LOOP,
    simulations: int = SIMULATIONS,
    seed: int = 0,
) -> Prediction:
    """What the loop would do under `policy` over these prompts, in order (adaptive state carried over them).

    `traces`: one engine.measure.agreement.draft_trace per prompt (unusable ones are skipped); at
    temperature > 0 each needs β at that temperature. `loop`: the engine's drafting loop, whose draft confidence
    a confidence stop reads, and whose first token of each output may come from the prompt's forward (counted as
    a target call: temperature 0)."""
    confidence = loop.confidence
    cost = cost or CostModel()
    usable = [t for t in traces if trace_usable(t)]
    if not usable:
        raise ValueError("no usable trace: record one with a draft model or n-gram lookup")
    notes: list[str] = []
    if temperature > 0:
        key = f"{temperature:g}"
        usable = [t for t in usable if key in (t.get("beta") or {})]
        if not usable:
            raise ValueError(f"no β recorded at temperature {key}: the replay at temperature > 0 needs it")
        tally = _sampled(usable, policy, confidence, cost, temperature, simulations, seed)
        exact = calls_exact = False
        notes.append(
            f"temperature {key}: expected values from β per position along the target's greedy output (estimated)"
        )
    else:
        tally = _greedy(usable, policy, confidence, cost, prefill=loop.prompt_call)
        exact, calls_exact = True, not tally.truncated
        if tally.truncated:
            notes.append("some drafts ran past the recorded continuation: draft calls assume the draft stayed sure")
    if policy.uses_confidence and not any(has_confidence(t) for t in usable):
        notes.append(
            "no draft here reports its confidence (n-gram lookup, suffix decoding): the confidence stop never fires"
        )
    return finish(tally, policy, cost, temperature, exact, calls_exact, confidence, notes)


def policy_grid(
    max_gamma: int = 32,
    confidence: bool = True,
    schedule: Mapping[int, int] | None = None,
    serving_batch: int = 1,
) -> list[SpeculationPolicy]:
    """Every policy and setting the comparison tries: each registered kind's grid (engine.core.policy_kinds for
    the built-ins: fixed γ 1..max_gamma, the confidence stop, the heuristic schedule, SGLang's adaptive EMA, γ by
    batch size when a schedule is given)."""
    return registered_grid(GridAsk(max_gamma, confidence, schedule, serving_batch))


@dataclass
class PolicyComparison:
    """The replayed grid ranked by the one set of rules (engine.analysis.feasibility), the best policy, the best
    fixed γ, and the gain between them."""

    objective: str
    temperature: float
    results: list[Prediction]  # feasible first, each group best first
    best: Prediction  # the top of the ranking: speculation off when it is not feasible (`pays` False)
    best_fixed: Prediction  # the best fixed γ (the recommender's headline γ when it pays)
    gain: float  # best vs best fixed γ: speedup ratio − 1 (latency objectives) or cost saved (cost)
    notes: list[str] = field(default_factory=list)

    @property
    def pays(self) -> bool:
        return self.best.feasible

    def top(self, n: int = 3) -> list[Prediction]:
        """The best n feasible policies of different kinds (the ones worth proving live)."""
        seen: set[str] = set()
        picks: list[Prediction] = []
        for r in self.results:
            if r.feasible and r.kind not in seen:
                seen.add(r.kind)
                picks.append(r)
            if len(picks) == n:
                break
        return picks


def gain_over(best: Prediction, reference: Prediction, objective: str) -> float:
    if objective == "cost":
        return 1.0 - best.cost_multiplier / reference.cost_multiplier if reference.cost_multiplier else 0.0
    return best.predicted_speedup / reference.predicted_speedup - 1.0 if reference.predicted_speedup else 0.0


def judged(results: Iterable[Prediction], judge: Judge) -> list[Prediction]:
    """Each prediction quoted in the regime of its own verify width, marked feasible or why not, ranked."""
    rows = list(results)
    for r in rows:
        r.judged_in(judge.regime(r))
        r.infeasible_why = judge.why_not(r)
        r.feasible = not r.infeasible_why
    return judge.ranked(rows)  # type: ignore[return-value]


def compare_policies(
    traces: Sequence[Mapping[str, Any]],
    cost: CostModel | None = None,
    temperature: float = 0.0,
    judge: Judge | None = None,
    policies: Sequence[SpeculationPolicy] | None = None,
    max_gamma: int = 32,
    loop: DraftingLoop = IN_PROCESS_LOOP,
) -> PolicyComparison:
    """Replay every policy of the grid (or `policies`) and rank them by `judge` (default: latency, memory-bound, any
    depth), in the engine's drafting `loop` (see replay)."""
    judge = judge or Judge()
    usable = [t for t in traces if trace_usable(t)]
    if not usable:
        raise ValueError("no usable trace: record one with a draft model or n-gram lookup")
    confident = any(has_confidence(t) for t in usable)
    grid = list(policies) if policies is not None else policy_grid(max_gamma, confidence=confident)
    if not any(p.fixed_gamma() is not None for p in grid):
        grid = [FixedGamma(g) for g in range(1, max_gamma + 1)] + grid
    results = judged((replay(usable, p, cost, temperature, loop) for p in grid), judge)
    best = results[0]
    best_fixed = next(r for r in results if r.kind == "fixed")
    notes = []
    if best.kind == "fixed" and best.feasible:
        notes.append(f"a fixed γ is already as good: no policy beats γ={best.policy.split(':')[1]} by more than 1%")
    return PolicyComparison(
        objective=judge.objective,
        temperature=float(temperature),
        results=results,
        best=best,
        best_fixed=best_fixed,
        gain=gain_over(best, best_fixed, judge.objective),
        notes=notes,
    )
