"""The Sessions page's logic without Streamlit: a session's facts, the fidelity verdict, the outputs to show.

Strings here may carry user input (names, model references); the page escapes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pandas as pd

from app import data
from engine.service.api import (
    UNFINISHED_RUNS,
    StoredSession,
    budget_facts,
    floor_note,
    loop_note,
    overhead_note,
    run_spread,
    run_verdict,
    spread_text,
    stored_speedup_flag,
    surface_cells,
)
from engine.service.api import stops_paying as surface_stops

RUN_NUMBERS = {
    "α": "%.3f",
    "tokens per call": "%.2f",
    "c": "%.3f",
    "tokens/s": "%.1f",
    "baseline tokens/s": "%.1f",
    "speedup measured": "%.2f×",
    "speedup predicted": "%.2f×",
}
RUN_HELPS = {
    "tokens per call": "tokens emitted ÷ target calls, every call counted (a speedup is bounded by it)",
    "speedup measured": "over the whole run: tokens/s over every prompt ÷ the target alone's over the same prompts "
    "(the figure the bound checks and the one model predicts); the per-prompt median is in the spread",
    "per-prompt spread": "each prompt's speedup against the target alone on the same prompt: lowest–highest, and "
    "their median; ⚠ marks a prompt above its own bound (its tokens per call ÷ (v_min + the draft's share))",
    "bound": "the measured speedup is above tokens per call ÷ (the cheapest verify, 1 target step unless the "
    "engine measured a wider forward cheaper, + the draft's share of a call): impossible, a measurement error, "
    "never calibrated to (why: below the table)",
    "speedup predicted": "what the one model predicted for this run when it was measured, from the runs stored then; "
    "the decision above predicts from every run of the session, so its figure for the same configuration may differ",
}
# the runs table's columns in the order shown: on a 1400 px screen the measured speedup, its bound and verdict and
# the prediction are in view unscrolled; the throughputs they come from follow, and the spread, the widest text, last
RUN_THROUGHPUTS = ["tokens/s", "baseline tokens/s"]
RUN_ORDER = [*(c for c in data.RUN_COLUMNS if c not in RUN_THROUGHPUTS and c != "speedup predicted"), "bound",
             "verdict", "speedup predicted", *RUN_THROUGHPUTS, "per-prompt spread"]  # fmt: skip
RUN_LABELS = {"tokens per call": "tokens/call", "baseline tokens/s": "baseline tok/s"}  # shorter headers
RUN_WIDTHS: dict[str, Literal["small", "medium", "large"] | int] = {"bound": 90, "verdict": 110}
HISTORY_NUMBERS: dict[str, str] = {}  # "best speedup" is text: BestSpeedup.text
HISTORY_WIDTHS: dict[str, Literal["small", "medium", "large"] | int] = {"name": "medium", "drafts": "medium"}
FIDELITY_NUMBERS = {"logit margin": "%.4f", "tolerance": "%.4f"}
CATEGORY_BASIS = (
    "Each category's requests timed end to end (prefill and the engine's round trip included), against the target "
    "alone on the same prompts. The runs table times decoding alone, so a category of one prompt can differ from "
    "that prompt's place in the per-prompt spread."
)
CATEGORY_NUMBERS = {"tokens/s": "%.1f", "speedup": "%.2f×", "draft share": "%.2f"}
VERDICTS = ["identical", "numerical near-tie", "bug", "not applicable (sampled)"]


def facts(session: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs for the line under a session's title; missing values are "—"."""
    temps = ", ".join(f"{float(t):g}" for t in session.get("temperatures") or [])
    stored = StoredSession.of(session)
    return [
        ("engine", stored.engine),
        ("Target", str(session.get("target") or "—")),
        ("drafts", ", ".join(map(str, session.get("drafts") or [])) or "—"),
        ("γ", ", ".join(map(str, session.get("gammas") or [])) or "—"),
        *([("policies", ", ".join(stored.policies))] if stored.policies else []),
        ("T", temps or "—"),
        ("max new tokens", _or_dash(session.get("max_new_tokens"))),
        stored.weights,
        ("prompts", f"{_or_dash(session.get('n_prompts'))} (set #{_or_dash(session.get('prompt_set_id'))})"),
        *budget_facts(session),
    ]


def _or_dash(value: Any) -> str:
    return "—" if value is None or value == "" else str(value)


def hardware_label(session: Mapping[str, Any]) -> str:
    """Where the session ran: its summary's hardware, else the session's own note."""
    label = StoredSession.of(session).hardware.get("label")
    return str(label or session.get("hardware") or "not recorded yet")


def regime_details(regime: Any) -> tuple[str, list[str], dict[str, Any]] | None:
    """(label, evidence lines, the other fields) of a stored regime, or None when none was detected."""
    if not isinstance(regime, Mapping) or not regime.get("label"):
        return None
    evidence = regime.get("evidence")
    if isinstance(evidence, list | tuple):
        lines = [str(line) for line in evidence]
    else:
        lines = [str(evidence)] if evidence else []
    return str(regime["label"]), lines, {k: v for k, v in regime.items() if k != "evidence"}


def runs_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The runs table; the status column only while some run is not done. Speculative runs measured side by
    side show the spread of their per-prompt speedups (lowest–highest prompt) and what it allows us to say.

    The bound and the verdict follow the measured speedup they judge (an impossible speedup is never read as a
    win), the prediction follows them, and the spread, the widest text, comes last (RUN_ORDER); the policy and
    temperature columns only where they tell runs apart."""
    table = data.runs_frame(runs)
    if any(run_spread(r) for r in runs):
        table["per-prompt spread"] = [spread_text(r) for r in runs]
        table["verdict"] = [run_verdict(r) for r in runs]
    flags = [stored_speedup_flag(r) for r in runs]
    if any(flags):
        table["bound"] = ["⚠ impossible" if f else None for f in flags]
    table = table[[c for c in RUN_ORDER if c in table.columns]]
    says_nothing = {
        "status": (table["status"] == "done").all(),
        "policy": table["policy"].isna().all(),
        "T": table["T"].nunique() <= 1,  # one temperature: the line above the table names it
    }
    return table.drop(columns=[c for c, nothing in says_nothing.items() if nothing])


def unfinished_note(session: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why some runs show no figures: the session ended (cancelled, interrupted, failed) before they finished;
    None while it runs or when every run finished."""
    if session.get("status") in ("queued", "running") or all(data.finished(r) for r in runs):
        return None
    return UNFINISHED_RUNS


def category_empty_text(runs: Sequence[Mapping[str, Any]]) -> str:
    """What the By category section says when it has no row: no finished run (figures by category are those of
    finished runs, as in the runs table), or no output with a category yet."""
    if any(r.get("kind") != "baseline" and not data.finished(r) for r in runs):
        return "No figures by category for runs that did not finish (as in the runs table). " + UNFINISHED_RUNS
    return "No outputs with a category yet."


def impossible_note(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """'<run>: <why>' for each run whose measured speedup breaks its bound (the flag it was stored with)."""
    return [f"{data.run_label(r)}: {flag}" for r in runs if (flag := stored_speedup_flag(r))]


def speedup_frame(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """data.speedup_long with lo/hi (lowest and highest per-prompt speedup) on the measured rows, for error bars."""
    frame = data.speedup_long(runs).copy()
    if frame.empty:
        return frame
    impossible = {data.run_label(r) for r in runs if stored_speedup_flag(r)}
    flagged = frame["config"].isin(impossible) & (frame["which"] == "measured")
    frame.loc[flagged, "which"] = "measured: impossible"
    bounds = {data.run_label(r): run_spread(r) for r in runs if r.get("kind") != "baseline"}
    rows = list(zip(frame["config"], frame["which"].str.startswith("measured"), strict=True))
    frame["lo"] = [bounds[c]["min"] if m and bounds.get(c) else None for c, m in rows]
    frame["hi"] = [bounds[c]["max"] if m and bounds.get(c) else None for c, m in rows]
    return frame


def concurrency_surface(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The speedup surface of a session measured at several concurrency levels (vLLM), the cells the Recommend
    page and the recommender read (engine.service.decide.surface): one row per speculative run, against the baseline at
    the same level; empty when every run was measured at one level."""
    return data.surface_frame(surface_cells(runs))


def stops_paying(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per configuration and γ, where speculation stops paying (engine.service.decide.surface.stops_paying)."""
    return [stop.line() for stop in surface_stops(surface_cells(runs))]


def machine_note(session: Mapping[str, Any]) -> str | None:
    """The session-level warning when it was measured on a busy machine (from its summary), else None."""
    return StoredSession.of(session).machine_note


def floor_warning(session: Mapping[str, Any]) -> str | None:
    """The measurement floor's sentence when it marks every speedup too noisy to tell, else None."""
    found = floor_note(StoredSession.of(session).summary)
    return found.text if found is not None and found.off else None


def measurement_captions(session: Mapping[str, Any]) -> list[str]:
    """How the session measured, as captions: a floor that holds, what measuring cost, the loop and its threads."""
    summary = StoredSession.of(session).summary
    found = floor_note(summary)
    lines = [found.text] if found is not None and not found.off else []
    return lines + [text for text in (overhead_note(summary), loop_note(summary)) if text]


def noisy_note(session: Mapping[str, Any]) -> str | None:
    """Which runs' speedups are too noisy to calibrate to, from the session's summary."""
    noisy = StoredSession.of(session).noisy_runs
    if not noisy:
        return None
    return (
        f"Too noisy to calibrate to: {', '.join(map(str, noisy))} — the per-prompt speedups straddle 1× or spread "
        "wider than 1.5× between prompts; the recommender does not fit to these measurements."
    )


def suffix_cache_note(session: Mapping[str, Any]) -> str | None:
    """The order a session's prompts ran in and how warm each suffix run's cache was, from its summary."""
    state = StoredSession.of(session).suffix_cache
    if not state:
        return None
    order = ", ".join(map(str, state.get("prompt_order") or []))
    runs = []
    for label, requests in (state.get("runs") or {}).items():
        cached = ", ".join(str(r.get("cached_before")) for r in requests)
        first = next((i for i, r in enumerate(requests) if r.get("warm")), None)
        runs.append(
            f"{label}: cold throughout"
            if first is None
            else f"{label}: warm from prompt {first + 1} (responses cached: {cached})"
        )
    return f"Suffix decoding learns from earlier responses: prompts ran in the order {order}. " + "; ".join(runs)


def fidelity_message(counts: Mapping[str, int]) -> tuple[str, str] | None:
    """(kind, text) summing up the fidelity verdicts: kind is "error", "info" or "success"."""
    if counts.get("bug"):
        return "error", (
            f"{counts['bug']} output(s) differ from the target alone by more than numerical noise allows: "
            "that is a bug in the decoding, not rounding."
        )
    if counts.get("numerical near-tie"):
        return "info", (
            "Some outputs differ at a greedy near-tie: the target's top two logits were within the dtype's "
            "rounding noise, so a batched verify forward may pick the other one. That is within hardware numerics."
        )
    if counts.get("identical"):
        return "success", "Every greedy speculative output is identical to the target's own."
    return None


def category_chart_frame(categories: pd.DataFrame) -> pd.DataFrame:
    return categories.dropna(subset=["speedup"]).rename(columns={"run": "config"})


def comparison_chart_frame(table: pd.DataFrame) -> pd.DataFrame:
    frame = table.dropna(subset=["speedup measured"]).rename(columns={"speedup measured": "speedup"})
    frame = frame[frame["bound"].isna()] if "bound" in frame.columns else frame  # an impossible one is no bar
    return frame[["config", "session", "speedup"]]


def output_prompt_text(output: Mapping[str, Any], prompts: Sequence[Mapping[str, Any]]) -> str:
    """The prompt an output answers, or a line saying it is no longer stored."""
    by_id, ordered = data.prompt_lookup(prompts)
    prompt = data.prompt_for(output, by_id, ordered)
    return prompt["text"] if prompt else f"(prompt {output.get('prompt_id')} no longer stored)"
