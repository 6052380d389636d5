"""The Run page's time budget and default engine: the budget input, the form sized to it, the engine's default.

"Fit to the budget" sizes the form's session (engine.service.sizing.budget) and writes the sized values into the
form, to
be changed at will; the budget then only warns: on Estimate, on Probe and before Start queues a session. The form is
also sized on its own, once: on the page's first visit when a finished comparable session gives the pace, else
after "Probe the pace" returns one; never after any fit, so values changed by hand since are left as they are.
A started session keeps its budget, and once it is done the page says how it kept it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import streamlit as st

from app import common, data
from app import run_view as rv
from app.common import md_escape
from engine.errors import SettingsError
from engine.service.api import (
    DEFAULT_TARGET,
    SessionSpec,
    SizedPlan,
    budget_outcome,
    default_budget,
    default_engine,
    parse_budget,
    registry,
    sized_for,
)

BUDGET = "budget"  # the budget input's key
PENDING = "run_budget_pending"  # sized form values, set before the form is drawn on the next run
SAID = "run_budget_said"  # what the sizing said, shown once after that run
FITTED = "run_budget_fitted"  # the form was sized at a known pace: it is the user's since, the budget only warns
VISITED = "run_budget_visited"  # the page's first run is done: a finished session's pace sizes the form only then
ENGINE_DEFAULT = "run_engine_default"  # the engine last set as the default: a different one was chosen by the user
BUDGET_HELP = (
    "How long the session may take, e.g. 10m, 600s or 1.5h; empty for none. 'Fit to the budget' cuts the batch "
    "sweep, new tokens, prompts (still stratified), γs and drafts, in that order, until the estimate fits, at the "
    "pace of a finished session here or of a probe. Change any sized value after: the budget then only warns."
)


def budget_text(hardware: Mapping[str, Any]) -> str:
    """The budget input's default: 10 minutes without a GPU, none on one."""
    seconds = default_budget(hardware)
    return f"{seconds / 60:g}m" if seconds else ""


def sized_values(sized: SizedPlan, state: Mapping[str, Any]) -> dict[str, Any]:
    """The form's widget values for the sized plan, only those the sizing changed."""
    spec, form = sized.spec, rv.RunForm.from_state(state)
    values: dict[str, Any] = {"max_new": spec.max_new_tokens, "n_prompts": sized.n_prompts}
    if not spec.detect_regime and state.get("detect_regime"):
        values["detect_regime"] = False
    if (form.gammas_text or "").strip():
        values["gammas_text"] = ",".join(str(g) for g in spec.gammas)
    else:
        values["gammas_choice"] = list(spec.gammas)
    values["drafts_choice"] = [d for d in form.drafts_choice if d in spec.drafts]
    values["drafts_text"] = ", ".join(d for d in data.parse_refs(form.drafts_text) if d in spec.drafts)
    return {key: value for key, value in values.items() if state.get(key) != value}


def set_default_engine(state: MutableMapping[str, Any], hardware: Mapping[str, Any]) -> str:
    """Before the engine choice is drawn: this machine's default engine for the form's target, unless the user
    chose another (its why: engine.service.sizing.default_engine)."""
    target = rv.effective_target(state.get("target_choice") or DEFAULT_TARGET, state.get("target_text"))
    chosen = default_engine(target, hardware).engine
    if state.get("engine") in (None, state.get(ENGINE_DEFAULT)):
        state["engine"] = state[ENGINE_DEFAULT] = chosen
    return chosen


def engine_note(engine: str, target: str, hardware: Mapping[str, Any]) -> tuple[bool, str]:
    """(usable, one line) for the engine choice, with why it is the default here when it is."""
    usable, line = registry.get(engine).availability()
    chosen = default_engine(target, hardware)
    return usable, f"{line} {chosen.why}" if chosen.why and chosen.engine == engine else line


def top(state: MutableMapping[str, Any], hardware: Mapping[str, Any]) -> None:
    """The form's first lines, before any of its widgets: the sized values of the last fit set, the default
    engine set, and the time budget's input."""
    state.update(state.pop(PENDING, None) or {})
    set_default_engine(state, hardware)
    state.setdefault(BUDGET, budget_text(hardware))
    field, note = st.columns([2, 9], vertical_alignment="bottom")
    field.text_input("Time budget", key=BUDGET, placeholder="none: e.g. 10m, 600s or 1.5h", help=BUDGET_HELP)
    note.caption("“Fit to the budget”, below the form, sizes the session to it at this machine's pace.")


def _form_plan(store: Any, state: Mapping[str, Any], fit: bool) -> SizedPlan | None:
    """The form's session sized to (or only checked against) its budget; None without a budget."""
    budget_s = parse_budget(state.get(BUDGET))
    if budget_s is None:
        return None
    spec, _, count = rv.session_spec(rv.RunForm.from_state(state))
    return sized_for(store, spec, count, budget_s, fit=fit)


def fit(store: Any, state: MutableMapping[str, Any]) -> None:
    """Size the form's session to its budget: the sized values into the form (on a rerun), and what was cut."""
    try:
        if parse_budget(state.get(BUDGET)) is None:
            st.info("No time budget: type one above (e.g. 10m) to size the session to it.")
            return
    except SettingsError as exc:
        common.show_error(exc, "size the session to its budget")
        return
    sized = common.attempt(_form_plan, store, state, True, action="size the session to its budget")
    if sized is not None:
        _apply(state, sized, sized.sentences())


def auto_fit(store: Any, state: MutableMapping[str, Any], said: list[str], sessions_only: bool = False) -> None:
    """Size the form to its budget on its own, as "Fit to the budget" does, unless a fit was made already: `said`
    (what came before it) and what was cut, on a rerun; nothing when no pace is known (`sessions_only`: none from a
    finished session), the form or budget is invalid (Estimate and Start say why) or nothing had to go."""
    if state.get(FITTED):
        return
    try:
        sized = _form_plan(store, state, True)
    except Exception:  # noqa: BLE001 - said by Estimate and Start, not on a visit
        return
    if sized is not None and sized.pace is not None and not (sessions_only and sized.pace.probed):
        _apply(state, sized, [*said, *sized.sentences()] if sized.cuts else [])


def _apply(state: MutableMapping[str, Any], sized: SizedPlan, said: list[str]) -> None:
    """The sized values into the form on a rerun when anything was cut, with `said` shown once; a fit at a known
    pace is the last made on its own."""
    state[FITTED] = state.get(FITTED) or sized.pace is not None
    if said:
        state[SAID] = said
    if sized.cuts:
        state[PENDING] = sized_values(sized, state)
        st.rerun()


def check(store: Any, state: Mapping[str, Any]) -> None:
    """After an estimate: whether the form's session fits its budget, or no pace is known (nothing is cut)."""
    sized = common.attempt(_form_plan, store, state, False, action="check the session against its budget")
    if sized is None:
        return
    lines = sized.sentences()
    if sized.over:
        st.warning(
            md_escape(" ".join(lines) + " 'Fit to the budget' cuts the plan to fit."), icon=common.ICONS["warning"]
        )
    elif lines:
        st.caption(md_escape(" ".join(lines)))


def show_said(state: MutableMapping[str, Any]) -> None:
    """What the last fit said, once."""
    if lines := state.pop(SAID, None):
        st.info(md_escape(" ".join(lines)))


def start_spec(store: Any, state: Mapping[str, Any]) -> tuple[SessionSpec, int, int]:
    """(spec, prompt set id, prompt count) for Start, the budget kept with the spec; a warning first when its
    estimate exceeds the budget (it is queued all the same); SettingsError for a bad form or budget."""
    spec, set_id, count = rv.session_spec(rv.RunForm.from_state(state))
    spec.time_budget_s = budget_s = parse_budget(state.get(BUDGET))
    if budget_s is not None and (line := sized_for(store, spec, count, budget_s, fit=False).warning()):
        st.warning(md_escape(f"{line} It is queued as asked: Cancel stops it."), icon=common.ICONS["warning"])
    return spec, set_id, count


def done_lines(store: Any, session: Mapping[str, Any], runs: Any) -> list[str]:
    """A finished session in words: the Recommend page's answer beside its runs as stored, then how it kept its time
    budget ('Time budget 10 min: took 8.2 min (within)'); nothing for a session with neither."""
    from app import memo

    lines = rv.choice_lines(session, runs, memo.session_decisions(store, session)) if rv.has_choices(session) else []
    return [*lines, *([f"Time budget {kept}."] if (kept := budget_outcome(session)) else [])]


def after_buttons(store: Any, state: MutableMapping[str, Any], pressed: Mapping[str, bool]) -> None:
    """The form's buttons done: the form saved, then the estimate (a probe's pace sizing the form on its own, once)
    and its budget check, or the fit; on the page's first visit, the form sized on its own at a finished session's
    pace."""
    from app import components

    first, state[VISITED] = not state.get(VISITED), True
    if any(pressed.values()):
        rv.save_form(state)
    if pressed["estimate"] or pressed["probe"]:
        lines = components.estimate(store, pressed["probe"])
        if pressed["probe"] and lines:  # a pace is known now: sized on its own (a rerun) unless a fit was made
            auto_fit(store, state, lines[:1])
        check(store, state)
    if pressed["fit"]:
        fit(store, state)
    elif first and not any(pressed.values()):
        auto_fit(store, state, [], sessions_only=True)
    show_said(state)
