"""What a quick session chose to confirm and why, beside the stored decision, in words."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.service.api import StoredSession


def confirmation_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]] = (), decisions: Mapping[float, Any] | None = None
) -> list[str]:
    """A full session's confirmation in words: what the grid's recommendation was and how it measured (each
    configuration's figures as stored, the Sessions page's; the recommendation as the Recommend page gives it)."""
    done = StoredSession.of(session).confirmation
    if not done:
        return []
    if not done.get("ran"):
        rows = done.get("confirmed") or []
        named = ", ".join(c["configuration"] for c in rows) or "nothing to confirm"
        return [
            f"Recommendation checked against the grid: {named} — measured by the grid itself.",
            *headline_lines(decisions),
        ]
    took, grid = done.get("confirm_s", 0.0) / 60.0, done.get("grid_s", 0.0) / 60.0
    lines = [
        f"The grid's recommendation was not in the grid: ran {', '.join(done['ran'])} live "
        f"({took:.1f} min after the grid's {grid:.1f} min)."
    ]
    return lines + _choice_lines(done, runs, decisions)


def quick_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]] = (), decisions: Mapping[float, Any] | None = None
) -> list[str]:
    """A finished quick session in words: how long to a confirmed recommendation, the recommendation as the
    stored decision (`decisions`: per temperature, engine.service.decide.decisions.Decision or None), and each
    choice as its stored run measured it (`runs`: the session's runs)."""
    quick = StoredSession.of(session).quick
    if not quick:
        return []
    minutes = quick.get("time_to_confirmed_s", 0.0) / 60.0
    lines = [f"Quick session: confirmed in {minutes:.1f} min (probe {quick.get('probe_s', 0.0) / 60.0:.1f} min)."]
    return lines + _choice_lines(quick, runs, decisions) + unchosen_gamma_lines(session, quick)


def unchosen_gamma_lines(session: Mapping[str, Any], done: Mapping[str, Any]) -> list[str]:
    """Why a confirmed fixed γ the form did not list ran at all: the one model predicts every γ from the probe,
    and what it recommends is confirmed live whether or not it was among the γs chosen."""
    chosen = {int(g) for g in session.get("gammas") or []}
    lines = []
    for c in done.get("confirmed") or []:
        gamma = int(c.get("gamma") or 0)
        if chosen and not c.get("policy") and gamma >= 1 and gamma not in chosen:
            listed = ", ".join(map(str, sorted(chosen)))
            lines.append(
                f"Why γ={gamma}: it was not among the γs chosen ({listed}); a quick session predicts every γ "
                f"from its probe and runs the one it recommends live, so γ={gamma} was measured to confirm "
                "it."
            )
    return lines


def choice_lines(
    session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decisions: Mapping[float, Any] | None
) -> list[str]:
    """A finished session's confirmed choices in words: a quick session's (quick_lines), else a full session's
    confirmation (confirmation_lines)."""
    return quick_lines(session, runs, decisions) or confirmation_lines(session, runs, decisions)


def has_choices(session: Mapping[str, Any]) -> bool:
    """Whether a session's summary says what it confirmed (a quick session, or a full one that checked its
    recommendation against the grid)."""
    stored = StoredSession.of(session)
    return bool(stored.quick or stored.confirmation)


def headline_lines(decisions: Mapping[float, Any] | None) -> list[str]:
    """The session's decision per temperature (engine.service.decide.decisions.Decision, stored when it ended): the one
    answer the Recommend page, the CLI, the report and the exports give."""
    return [f"Decision: {d.headline()}" for _, d in sorted((decisions or {}).items()) if d is not None]


def _choice_lines(
    done: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decisions: Mapping[float, Any] | None
) -> list[str]:
    """The decision, then each configuration the session confirmed as its stored run measured it (the figures the
    Sessions page shows: the stored prediction, the whole run's speedup and the per-prompt spread, its flag): the
    decision's own configuration called recommended, the others what they are; then the notes."""
    lines = headline_lines(decisions)
    stored_off = {float(t) for t, is_off in (done.get("off") or {}).items() if is_off}
    for c in done.get("confirmed") or []:
        temperature = float(c["temperature"])
        decision = (decisions or {}).get(temperature)
        off = decision.off if decision is not None else temperature in stored_off
        predicted = None
        if off:
            role = "Speculation OFF; best candidate, not recommended"
        elif decision is None:  # nothing to decide from stored (its runs are gone): the role it was chosen in
            role = str(c["role"]).capitalize()
        elif _is_decided(c, decision):
            role, predicted = "Recommended (the decision)", decision.predicted_speedup  # one figure: the decision's
        else:
            role = "Also confirmed, not the decision"
        lines.append(f"{role}: {c['configuration']} — {_choice_figures(c, runs, predicted)}.")
    lines += [f"Note: {n}" for n in done.get("notes") or []]
    return lines


def _is_decided(choice: Mapping[str, Any], decision: Any) -> bool:
    """Whether a confirmed choice is the decision's configuration (its draft and policy, or its draft and γ)."""
    if choice.get("draft") != decision.draft:
        return False
    if decision.policy:
        return choice.get("policy") == decision.policy
    return not choice.get("policy") and int(choice.get("gamma") or 0) == int(decision.gamma)


def _choice_figures(choice: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], decided: float | None = None) -> str:
    """'predicted 1.01×, measured 0.90× over the whole run (0.85–0.95× (median 0.91×))' from the choice's stored
    run; a session stored without its runs says what the choice itself kept (the prediction when chosen)."""
    from engine.service.api import (
        configuration_run,
        run_speedups,
        run_spread,
        spread_text,
        stored_noisy,
        stored_speedup_flag,
    )

    run = configuration_run(
        runs, str(choice["draft"]), int(choice.get("gamma") or 0), float(choice["temperature"]), choice.get("policy")
    )
    if run is not None:
        measured, predicted = run_speedups(run)
        spread, flag, noisy = spread_text(run), stored_speedup_flag(run), stored_noisy(run_spread(run))
        when = ""
    else:
        measured = choice.get("measured_whole_run") or choice.get("measured_speedup")
        median, predicted, when = choice.get("measured_speedup"), choice.get("predicted_speedup"), " (when chosen)"
        spread = f"per-prompt median {median:.2f}×" if median else None
        flag, noisy = choice.get("flag"), choice.get("noisy")
    if decided is not None:  # the decision's own prediction, the figure every other place shows for it
        predicted, when = decided, ""
    said = f"predicted {predicted:.2f}×{when}" if predicted else "no prediction stored"
    got = (
        f"measured {measured:.2f}× over the whole run" + (f" ({spread})" if spread else "")
        if measured
        else ("not measured")
    )
    mark = " — impossible (a measurement error)" if flag else " — too noisy to tell" if noisy else ""
    return f"{said}, {got}{mark}"
