"""What a session will cost before it starts: the estimate's lines, the pace probe's progress, the optional
measurements' costs on this machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app import data
from app.run_view.form import RunForm, session_spec
from app.run_view.progress import fmt_eta
from engine.errors import SettingsError

ESTIMATE_HELP = (
    "The form's session, not queued: its live configurations, the time at the pace of the newest "
    "comparable session on this machine (else of a probe: see the button below), and the memory its "
    "models' weights or servers hold."
)

PROBE_HELP = (
    "Time the target alone in the chosen engine and dtype (its load, then up to 16 tokens of the set's "
    "first prompt, at most 60 s of decoding, in a child process), so the estimate has a pace before any "
    "such session has run here. Its stage, the tokens timed and the seconds gone show while it runs."
)


def estimate_lines(
    store: Any, state: Mapping[str, Any], probe: bool = False, on_progress: Callable[[Any], None] | None = None
) -> list[str]:
    """What the form's session would take (engine.service.sizing.estimate), one sentence each, after timing the target
    alone when `probe` (engine.service.sizing.pace_probe; `on_progress` is told where the probe is while it runs);
    SpectuneError when the form is invalid (the same message Start would give) or the probe fails."""
    from engine.service.api import estimate_for, estimate_with_probe, first_prompt

    spec, set_id, count = session_spec(RunForm.from_state(state))
    if not probe:
        return estimate_for(store, spec, count).sentences()
    done = estimate_with_probe(store, spec, count, first_prompt(store, set_id), on_progress)
    if done.probe_s is None:
        return ["Not probed: a finished session on this machine gives the pace.", *done.estimate.sentences()]
    timed = f": {done.probe.timed()}" if done.probe is not None else ""
    return [f"Probed the target alone in {done.probe_s:.0f} s{timed}.", *done.estimate.sentences()]


def probe_progress_text(progress: Any) -> str:
    """A running pace probe (engine.service.sizing.pace_probe.ProbeProgress) in words: loading and for how long, then
    its untimed first pass, then the tokens timed so far beside the bound on its decoding."""
    from engine.service.api import DECODE_BOUND_S, PROBE_TOKENS

    if progress.load_s is None:
        return f"Probing the pace: loading the target… {progress.elapsed_s:.0f} s so far."
    loaded = f"Probing the pace: loaded in {progress.load_s:.0f} s"
    if progress.stage == "priming":
        return f"{loaded}; a first, untimed pass over the prompt… {progress.stage_s:.0f} s."
    return (
        f"{loaded}; decoding: {progress.tokens} of {PROBE_TOKENS} tokens timed in {progress.stage_s:.0f} s "
        f"(decoding stops after {DECODE_BOUND_S:.0f} s)."
    )


def measurement_costs(
    sessions: Sequence[Mapping[str, Any]], target: str, dtype: str, max_gamma: int, serving_batch: int
) -> dict[str, Any]:
    """Seconds the optional measurements are likely to take on this machine: {"verify": s, "regime": s,
    "source": text}. From the newest finished session with this target and dtype: its measured phase times,
    else estimates from its baseline's step time; None where nothing is known yet."""
    from engine.service.api import StoredSession, batch_sweep_eta_s, verify_cost_eta_s

    for session in sessions:
        if session.get("status") != "done" or session.get("target") != target or session.get("dtype") != dtype:
            continue
        stored = StoredSession.of(session)
        times, tps = stored.phase_times_s, stored.baseline_tokens_per_s
        step = 1.0 / tps if tps else None
        verify = times.get("measuring v(k)")
        regime = times.get("batch sweep")
        if verify is None and regime is None and step is None:
            continue
        return {
            "verify": verify if verify is not None else verify_cost_eta_s(step, max_gamma),
            "regime": regime if regime is not None else batch_sweep_eta_s(step, serving_batch),
            "source": f"session #{session.get('id')}",
        }
    return {"verify": None, "regime": None, "source": None}


def cost_caption(seconds: float | None, source: str | None) -> str:
    """'about 2 min on this machine (from session #4)', or what is known when nothing was measured yet."""
    if seconds is None:
        return "cost unknown until a session with this target has run here"
    return f"{fmt_eta(seconds)} on this machine (from {source})"


def cost_captions(
    sessions: Sequence[Mapping[str, Any]], target: str, dtype: str, state: Mapping[str, Any]
) -> tuple[str, str]:
    """The costs stated next to the v(k) and regime switches, for the γ values and serving batch in the form."""
    typed = (state.get("gammas_text") or "").strip()
    try:
        gammas = data.parse_int_list(typed, "γ") if typed else list(state.get("gammas_choice") or [])
    except SettingsError:
        gammas = []
    costs = measurement_costs(sessions, target, dtype, max(gammas or [4]), int(state.get("serving_batch") or 1))
    return (
        f"v(k): {cost_caption(costs['verify'], costs['source'])}",
        f"batch sweep: {cost_caption(costs['regime'], costs['source'])}",
    )
