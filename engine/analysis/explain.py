"""The words of a recommendation: one sentence on the decision, and notes on what it rests on and assumed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.analysis.calibrate import LOST_EVERYWHERE, calibration, measurement_flags
from engine.analysis.feasibility import TIE
from engine.analysis.recommend_types import UNKNOWN, DraftMeasurement, DraftSummary, GammaPoint
from engine.analysis.regime import evidence_said
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND, largest_measured_k
from engine.drafts.kinds import kind_of_method


def _pct(x: float) -> str:
    """A fractional change as a signed whole percentage (+0.4 -> "+40%")."""
    return f"{x * 100:+.0f}%"


def explain_on(winner: DraftSummary, others: list[DraftSummary]) -> str:
    """One sentence on why this draft: the balance of α and c, named against the best-α alternative."""
    calib = ""
    usable = {g: v for g, v in winner.measured_speedup.items() if int(g) not in winner.measured_flags}
    if winner.c_effective is not None and usable:
        g_meas = min(usable, key=lambda g: abs(int(g) - winner.best_gamma))
        calib = f" (calibrated to the measured {usable[g_meas]:.2f}× at γ={g_meas})"
    head = f"α {winner.alpha:.2f} at c {winner.c:.2f} gives {winner.best_speedup:.2f}× at γ={winner.best_gamma}{calib}"
    drafts_not_paying = [o for o in others if kind_of_method(o.method).costs_forwards and not o.pays]
    kind = kind_of_method(winner.method)
    if kind.speculates and not kind.needs_model and drafts_not_paying:
        d = max(drafts_not_paying, key=lambda o: o.best_speedup)
        label = kind.label
        return (
            f"{label} ({winner.name}) wins: {winner.best_speedup:.2f}× at γ={winner.best_gamma} with no second "
            f"model (no added load at peak), while the draft model {d.name} (α {d.alpha:.2f} at c {d.c:.2f}) "
            f"predicts only {d.best_speedup:.2f}×."
        )
    higher_alpha = [o for o in others if o.alpha > winner.alpha + TIE]
    if higher_alpha:
        b = max(higher_alpha, key=lambda o: o.alpha)
        return (
            f"{winner.name} wins: {head}; {b.name} has the best α ({b.alpha:.2f}) but c {b.c:.2f} cuts it to "
            f"{b.best_speedup:.2f}×."
        )
    if others:
        r = max(others, key=lambda o: o.best_speedup)
        return (
            f"{winner.name} wins: {head}; it also has the best α, and the runner-up {r.name} reaches "
            f"{r.best_speedup:.2f}×."
        )
    return f"{winner.name}: {head}."


def explain_off(summaries: list[DraftSummary], objective: str, budget: float | None) -> str:
    """One sentence on why speculation is off: no candidate, or why the best one may not be recommended (the very
    rule that refused it, in the regime of its own verify width). For the cost objective it speaks of cost: the
    cheapest candidate, what it does to the cost per token and the rule of its regime that says so."""
    if not summaries:
        return "Speculation off: there is no draft or n-gram measurement to base a recommendation on."
    if objective == "cost":
        cheapest = min(summaries, key=lambda s: (s.cost_change, -s.best_speedup))
        rule = (
            f"cost per token is 1/speedup and it runs at {cheapest.best_speedup:.2f}× the target's speed"
            if cheapest.regime == MEMORY_BOUND
            else f"cost per token is the ops multiplier, {cheapest.ops_multiplier:.2f}×"
        )
        why = cheapest.why_not
        refused = "" if not why or "cost" in why else f"; it is refused anyway: {why}"
        change = "raises it by" if cheapest.cost_change > TIE else "changes it by"
        return (
            f"Speculation off: no candidate lowers the cost per token — the cheapest, {cheapest.name} at "
            f"γ={cheapest.best_gamma}, {change} {_pct(cheapest.cost_change)} ({cheapest.regime} at its verify width: "
            f"{rule}){refused}."
        )
    best = max(summaries, key=lambda s: (s.best_speedup, -s.ops_multiplier))
    figures = f"{best.best_speedup:.2f}× at γ={best.best_gamma}, cost per token {_pct(best.cost_change)}"
    why = best.why_not or "it does not pay"
    if objective == "latency_within_budget" and "budget" in why:
        return (
            f"Speculation off: nothing fits the {_pct(budget or 0.0)} cost-per-token budget — {best.name}: {figures}."
        )
    if why.startswith(LOST_EVERYWHERE):
        g = best.best_gamma
        check = "" if g in best.measured_speedup else f"; measure γ={g} to know"
        return (
            f"Speculation off: {best.name} {why}. The one model predicts {best.best_speedup:.2f}× at γ={g}, but a "
            f"prediction never overrules a clear measured loss{check}."
        )
    if "crossover" in why:
        return (
            f"Speculation off: even the best candidate ({best.name}: {figures}) is past the crossover — compute-bound "
            f"at its verify width, its arithmetic grows faster than its speed."
        )
    return (
        f"Speculation off: the best candidate ({best.name}: α {best.alpha:.2f} at c {best.c:.2f}) predicts only "
        f"{figures}: {why}."
    )


def _unknown_note(votes: Mapping[str, str] | None) -> str:
    """The regime was not decided: what the evidence said (decided, took no side, not measured) and what is assumed."""
    said = "no batch sweep, v(k) or roofline decided it" if votes is None else evidence_said(votes)
    return (
        f"Regime unknown — {said}; assumed memory-bound, i.e. the extra arithmetic is treated as free — if the "
        "server is compute-bound the cost per token is understated. Run a batch sweep at the serving batch."
    )


def _memory_bound_note(row: GammaPoint | None, objective: str, best: DraftSummary | None) -> str:
    """Memory-bound, cost per token is 1/speedup: it falls only where the speedup is above 1, and the note says
    which side the chosen row (or, with speculation off, the best candidate) is on."""
    if row is not None:
        s = row.speedup_predicted
        return (
            "Memory-bound: the extra arithmetic runs in idle capacity, so cost per token is 1/speedup — "
            f"{_pct(1.0 / s - 1.0)} at the chosen {s:.2f}× (γ={row.gamma}); a draft or γ slower than the target "
            "(below 1×) raises it."
        )
    if best is None:
        return "Memory-bound: the extra arithmetic would be free, but there is no candidate to speculate with."
    s = best.best_speedup
    at = f"{best.name}, {s:.2f}× at γ={best.best_gamma}"
    if s > 1.0 + TIE:
        return (
            f"Memory-bound: the extra arithmetic would be free (cost per token is 1/speedup), but the best candidate "
            f"({at}) may not be recommended: {best.why_not or 'it does not pay'}."
        )
    if objective == "cost":
        return (
            "Memory-bound: the extra arithmetic would be free, so cost per token is 1/speedup — but no candidate is "
            f"faster than the target, so none lowers it: the best ({at}) raises it by {_pct(1.0 / s - 1.0)}."
        )
    return (
        "Memory-bound: the extra arithmetic would be free, but no candidate is faster than the target (the best: "
        f"{at}); below 1× the cost per token rises too ({_pct(1.0 / s - 1.0)}), since it is 1/speedup."
    )


def _regime_notes(
    row: GammaPoint | None,
    regime: str,
    given: str,
    batch_size: int,
    knee_batch: int | None,
    objective: str = "latency",
    votes: Mapping[str, str] | None = None,
    best: DraftSummary | None = None,
) -> list[str]:
    """What the regime was taken to be and why: unknown, memory- or compute-bound, the verify width at the knee."""
    notes: list[str] = []
    if given == UNKNOWN:
        notes.append(_unknown_note(votes))
    if regime == MEMORY_BOUND:  # taken on assumption, it reads as one (the unknown note above says why)
        note = _memory_bound_note(row, objective, best)
        notes.append(note.replace("Memory-bound:", "Memory-bound (assumed):", 1) if given == UNKNOWN else note)
    else:
        notes.append(
            "Compute-bound: the extra arithmetic displaces real work, so cost per token rises by the ops "
            "multiplier; keep γ below the crossover."
        )
    if knee_batch is not None:
        gamma = 0 if row is None else row.gamma
        width = batch_size * (gamma + 1)
        side = "at or past" if width >= knee_batch else "below"
        notes.append(
            f"A verify step at batch {batch_size} with γ = {gamma} processes {batch_size} × {gamma + 1} = {width} "
            f"token rows, {side} the knee at batch {knee_batch}: {regime}."
        )
    return notes


def _verify_and_arithmetic_notes(m: DraftMeasurement, row: GammaPoint, regime: str) -> list[str]:
    """What the chosen row assumed about sampling, v(k) and the draft's arithmetic ĉ."""
    notes: list[str] = []
    if m.temperature > 0:
        notes.append(f"Sampling at temperature {m.temperature:g}: acceptance is lower than under greedy decoding.")
    top_k = largest_measured_k(m.verify_cost)
    if top_k is None and m.step_overhead:
        notes.append(
            "No v(k) measured: what a drafting step costs beyond one target step is the step overhead "
            "measured in the engine's own loop (below), not a separate verify benchmark."
        )
    elif top_k is None:
        notes.append(
            "No v(k) measured: verification is assumed free (v ≡ 1)"
            + (
                "; at a compute-bound batch a (γ+1)-token verify costs more, so measure v(k) at the serving batch."
                if regime == COMPUTE_BOUND
                else "."
            )
        )
    elif row.verify_extrapolated:
        notes.append(
            f"v(γ+1) = v({row.gamma + 1}) = {row.verify_cost:.2f} is extrapolated beyond the largest measured "
            f"k = {top_k} (monotone fit, 0 ≤ slope ≤ 1, v(k) ≤ k): measure v(k) up to k = {row.gamma + 1} to confirm."
        )
    if regime == COMPUTE_BOUND and kind_of_method(m.method).costs_forwards:
        if m.c_hat > 0:
            source = f" ({m.c_hat_source})" if m.c_hat_source else ""
            notes.append(
                f"ĉ (draft arithmetic ÷ target arithmetic) = {m.c_hat:.3f}{source}, charged in the ops multiplier "
                "(Theorem 3.11)."
            )
        else:
            notes.append(
                "ĉ (draft arithmetic ÷ target arithmetic) is unknown and taken as 0, so the ops multiplier "
                "understates the draft's own arithmetic."
            )
    return notes


def _calibration_notes(m: DraftMeasurement, row: GammaPoint) -> list[str]:
    """The chosen row's capped predictions, and how the draft was calibrated to its measured speedups."""
    notes = [f"{m.name}: {flag}" for flag in row.flags]
    if row.extrapolated:
        notes.append(f"{m.name}: γ={row.gamma} lies beyond the measured depth: extrapolated, confirm it live.")
    cal = calibration(m)
    if cal is not None and cal.flag is None:
        notes.append(f"{m.name}: c fitted to the measured speedups is {cal.c:.3f} (profiled {m.c:.3f}).")
    elif cal is not None:
        notes.append(f"{m.name}: {cal.flag}.")
    if len(m.c_values) > 1 and min(m.c_values) > 0 and max(m.c_values) / min(m.c_values) > 1.5:
        notes.append(
            f"{m.name}: c was measured between {min(m.c_values):.3f} and {max(m.c_values):.3f} across runs "
            f"(median {m.c:.3f}): the draft's cost is noisy on this machine."
        )
    if m.step_overhead:
        o = m.step_overhead
        notes.append(
            f"{m.name}: the engine's loop costs a drafting step {o.per_step:.2f} + {o.per_token:.2f} × its draft "
            "tokens target steps beyond its forward passes, and c is the draft's own time in that loop (both measured "
            "in its runs, so c is not fitted to the measured speedups); every prediction charges them."
        )
    return notes


def notes(
    m: DraftMeasurement | None,
    row: GammaPoint | None,
    regime: str,
    given: str,
    batch_size: int,
    knee_batch: int | None,
    candidates: Sequence[DraftMeasurement],
    objective: str = "latency",
    votes: Mapping[str, str] | None = None,
    summaries: Sequence[DraftSummary] = (),
) -> list[str]:
    """What the decision rests on and what it assumed, one sentence each (every export carries them).

    `votes` are what each regime source said (engine.analysis.regime), so an unknown regime names the evidence that
    took no side; `summaries` give the best candidate a speculation-off note speaks of."""
    best = _best_for(summaries, objective)
    out = _regime_notes(row, regime, given, batch_size, knee_batch, objective, votes, best)
    for cand in candidates:
        for _gamma, flag in sorted(measurement_flags(cand).items()):
            out.append(f"{cand.name}: {flag.message}")
    if m is None or row is None:
        return out
    free = [note] if (note := kind_of_method(m.method).note) else []
    return out + _verify_and_arithmetic_notes(m, row, regime) + _calibration_notes(m, row) + free


def _best_for(summaries: Sequence[DraftSummary], objective: str) -> DraftSummary | None:
    """The candidate a speculation-off sentence names: the cheapest for the cost objective, else the fastest."""
    if not summaries:
        return None
    if objective == "cost":
        return min(summaries, key=lambda s: (s.cost_change, -s.best_speedup))
    return max(summaries, key=lambda s: (s.best_speedup, -s.ops_multiplier))
