"""A report a user can share: one self-contained HTML document for a session (or the sessions of a recommendation).

`session_report_html` puts in one file what the Sessions and Recommend pages show: the session's settings, the
prompts and the hardware, each run's figures with their spread, noise verdict and broken bounds, the regime
evidence, the recommendation (draft, γ, policy, predicted speedup — or speculation OFF, and then no γ) and the
exported configuration files. The figures come from the same service calls the pages make
(engine.service.decide.recommendations.recommend_and_export, engine.service.decide.policies.session_policies) and the
same
stored fields; the charts are inline SVG drawn here, so the file opens anywhere, offline, with no script.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from engine.errors import SettingsError, SpectuneError
from engine.service.decide.evidence import measured_temperatures
from engine.service.decide.policies import PolicyReport
from engine.service.decide.recommendations import Recommended, recommend_and_export
from engine.service.report.html import Html, bullets, document, facts, note, number, section, table, tag
from engine.service.report.measurement_notes import floor_note, loop_note, overhead_note
from engine.service.report.recommendation import flagged_measurements, recommendation_parts
from engine.service.report.runs import RunFigures, run_figures
from engine.service.report.session_status import ending_note
from engine.service.report.svg import Bar, Series, bar_chart, line_chart
from engine.service.sizing.budget import budget_facts
from engine.service.stored_session import StoredSession
from engine.session.sampling import session_prompts

PROMPT_PREVIEW = 600  # characters of each prompt shown


def report_filename(session_ids: int | Sequence[int]) -> str:
    """spectune-session-3.html, or spectune-sessions-3-5.html for several."""
    ids = _ids(session_ids)
    return f"spectune-session-{ids[0]}.html" if len(ids) == 1 else f"spectune-sessions-{'-'.join(map(str, ids))}.html"


def _ids(session_ids: int | Sequence[int]) -> list[int]:
    raw = [session_ids] if isinstance(session_ids, int) else list(session_ids)
    try:
        ids = list(dict.fromkeys(int(i) for i in raw))
    except (TypeError, ValueError):
        raise SettingsError(f"session ids must be whole numbers, got {raw!r}") from None
    if not ids:
        raise SettingsError("choose at least one session for the report")
    return ids


def session_report_html(
    store: Any,
    session_ids: int | Sequence[int],
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    price_per_hour: float | None = None,
    regime_override: str | None = None,
    engine: str | None = None,
    temperature: float | None = None,
    recommended: Recommended | None = None,
) -> str:
    """The report as one HTML document. `recommended` is a result the caller already computed from the same
    sessions and options (the Recommend page's), used as it is; without it the recommendation is made here — one
    per measured temperature when the sessions measured several and no `temperature` is given. A session that
    cannot give a recommendation (not done, no speculative runs) still gets its report, saying why.
    SettingsError when a session does not exist."""
    ids = _ids(session_ids)
    sessions = []
    for sid in ids:
        session = store.get_session(sid)
        if session is None:
            raise SettingsError(f"session #{sid} does not exist: there is nothing to report")
        sessions.append(session)
    options = dict(objective=objective, budget=budget, batch_size=batch_size, regime_override=regime_override)
    results = [recommended] if recommended is not None else None
    recs = _recommendations(store, ids, options, price_per_hour, engine, temperature, results)
    flags = {k: v for result, _, _ in recs if result is not None for k, v in flagged_measurements(result).items()}
    parts = [part for session in sessions for part in session_sections(store, session, flags, len(ids) > 1)]
    parts += [recommendation_section(result, policies, why, len(recs) > 1) for result, policies, why in recs]
    title = f"spectune report — {_who(sessions)}"
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = (
        f"Made {made} from the spectune store. Self-contained: the charts are drawn in the file, nothing is "
        "fetched from a network."
    )
    return document(title, subtitle, parts)


def report_or_error(store: Any, session_ids: int | Sequence[int], *args: Any, **kwargs: Any) -> str:
    """session_report_html, or a short document saying why it could not be made: for a download made when its
    button is pressed, where no error can be shown on the page."""
    try:
        return session_report_html(store, session_ids, *args, **kwargs)
    except SpectuneError as exc:
        body = [section("error", "The report could not be made", [note(str(exc), "error")])]
        return document("spectune report — not made", "Nothing was reported.", body)


def _who(sessions: Sequence[Mapping[str, Any]]) -> str:
    if len(sessions) == 1:
        name = " ".join(str(sessions[0].get("name") or "").split())
        return f"session #{sessions[0]['id']}" + (f" {name}" if name else "")
    return "sessions " + ", ".join(f"#{s['id']}" for s in sessions)


Rec = tuple[Recommended | None, PolicyReport | None, str | None]  # (result, policy report, why there is none)


def _recommendations(
    store: Any,
    ids: list[int],
    options: dict[str, Any],
    price: float | None,
    engine: str | None,
    temperature: float | None,
    given: list[Recommended] | None,
) -> list[Rec]:
    """The recommendation(s) with their policy reports; a failure is kept as its message, not raised."""
    out: list[Rec] = []
    if given is None:
        temps = measured_temperatures(store, ids)
        wanted = [temperature] if temperature is not None or len(temps) < 2 else temps
        given = []
        for t in wanted:
            try:
                given.append(
                    recommend_and_export(store, ids, price_per_hour=price, engine=engine, temperature=t, **options)
                )
            except SpectuneError as exc:
                out.append((None, None, str(exc)))
    out.extend((result, result.policies, None) for result in given)  # the policy report the decision rests on
    return out


def recommendation_section(
    result: Recommended | None, policies: PolicyReport | None, why: str | None, several: bool
) -> Html:
    if result is None:
        return section("recommendation", "Recommendation", [note(f"No recommendation: {why}", "error")])
    title = "Recommendation" + (f" at T = {result.recommendation.temperature:g}" if several else "")
    anchor = f"recommendation-t{result.recommendation.temperature:g}" if several else "recommendation"
    return section(anchor, title, recommendation_parts(result, policies, why))


# ----------------------------------------------------------------------------------------------------------------------
# one session


def settings_facts(session: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The session's settings, as the Sessions page lists them, and the rest of its spec."""
    options = session.get("options") or {}
    stored = StoredSession.of(session)
    engine = stored.engine
    joined = lambda xs: ", ".join(map(str, xs or [])) or "—"  # noqa: E731
    return [
        ("status", session.get("status")),
        ("engine", engine),
        ("target", session.get("target")),
        ("drafts", joined(session.get("drafts"))),
        ("γ", joined(session.get("gammas"))),
        *([("policies", joined(options["policies"]))] if options.get("policies") else []),
        ("temperatures", ", ".join(f"{float(t):g}" for t in session.get("temperatures") or []) or "—"),
        ("top-k / top-p", f"{session.get('top_k')} / {session.get('top_p')}"),
        ("seed", session.get("seed")),
        ("max new tokens", session.get("max_new_tokens")),
        stored.weights,
        ("device", session.get("device")),
        ("prompts", f"{session.get('n_prompts') or '—'} (set #{session.get('prompt_set_id') or '—'})"),
        ("created / finished", f"{minute(session.get('created_at'))} / {minute(session.get('finished_at'))}"),
        *budget_facts(session),
    ]


def minute(value: Any) -> str:
    """A stored time to the minute, as the pages show it ('2026-05-01 14:03 UTC'); '—' where none was stored."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value[:16]
    zone = " UTC" if value.tzinfo is not None and value.utcoffset() == UTC.utcoffset(None) else ""
    return value.strftime("%Y-%m-%d %H:%M") + zone


def hardware_facts(session: Mapping[str, Any]) -> list[tuple[str, Any]]:
    hardware = (session.get("summary") or {}).get("hardware")
    if not isinstance(hardware, Mapping):
        return [("hardware", session.get("hardware") or "not recorded yet")]
    keys = [
        ("label", "machine"),
        ("cores", "CPU cores"),
        ("memory_gb", "memory (GB)"),
        ("gpu_name", "GPU"),
        ("gpu_count", "GPUs"),
        ("driver_version", "driver"),
        ("cuda_version", "CUDA"),
        ("torch_version", "torch"),
    ]
    return [(label, hardware.get(key)) for key, label in keys if hardware.get(key) not in (None, "")]


def prompts_part(store: Any, session: Mapping[str, Any]) -> Html:
    prompts = session_prompts(store.get_prompts, session) if session.get("prompt_set_id") else []
    if not prompts:
        return tag("p", "No prompts stored with this session.", "muted")
    items = []
    for p in prompts:
        text = str(p.get("text") or "")
        shown = text if len(text) <= PROMPT_PREVIEW else text[: PROMPT_PREVIEW - 1] + "…"
        items.append(tag("li", [*([tag("strong", f"[{p['category']}] ")] if p.get("category") else []), shown]))
    return Html(f"<details><summary>The {len(prompts)} prompt(s)</summary><ol>{''.join(items)}</ol></details>")


def session_notes(session: Mapping[str, Any]) -> list[Html]:
    summary = session.get("summary") or {}
    out = []
    if (ending := ending_note(session)) is not None:
        kind, text = ending
        out.append(note(text, {"warning": "warn"}.get(kind, kind)))
    if summary.get("machine_note"):
        out.append(note(summary["machine_note"]))
    if (floor := floor_note(summary)) is not None:
        out.append(note(floor.text) if floor.off else note(floor.text, "info"))
    if (overhead := overhead_note(summary)) is not None:
        out.append(note(overhead, "info"))
    if (loop := loop_note(summary)) is not None:
        out.append(note(loop, "info"))
    if summary.get("noisy_runs"):
        out.append(
            note(
                f"Too noisy to calibrate to: {', '.join(map(str, summary['noisy_runs']))} — the per-prompt "
                "speedups straddle 1× or spread wider than 1.5× between prompts; the recommender does not fit "
                "to these measurements."
            )
        )
    return out


def session_sections(store: Any, session: Mapping[str, Any], flags: Mapping[Any, str], several: bool) -> list[Html]:
    sid = session["id"]
    suffix = f" — session #{sid}" if several else ""
    runs = store.list_runs(sid)
    outputs = {r["id"]: store.get_outputs(r["id"]) for r in runs}
    figures = run_figures(runs, outputs, flags)
    settings = [facts(settings_facts(session)), prompts_part(store, session)]
    return [
        section(f"session-{sid}", f"Session settings{suffix}", settings),
        section(f"hardware-{sid}", f"Hardware{suffix}", [facts(hardware_facts(session))]),
        section(f"runs-{sid}", f"Runs{suffix}", [*session_notes(session), *runs_parts(figures)]),
        section(f"regime-{sid}", f"Regime evidence{suffix}", stored_regime(session.get("regime"))),
    ]


def stored_regime(regime: Any) -> list[Html]:
    if not isinstance(regime, Mapping) or not regime.get("label"):
        return [tag("p", "No regime was detected for this session (it ran without the batch sweep).", "muted")]
    evidence = regime.get("evidence")
    lines = [str(x) for x in evidence] if isinstance(evidence, list | tuple) else [str(evidence)] if evidence else []
    head = tag(
        "p",
        [
            tag("strong", str(regime["label"])),
            " — as detected when the session ran (a recommendation judges it again at its serving batch and γ)",
        ],
    )
    return [head, Html(f"<details><summary>The evidence ({len(lines)} line(s))</summary>{bullets(lines)}</details>")]


# ----------------------------------------------------------------------------------------------------------------------
# the runs


RUN_HEADERS = ["configuration", "status", "α", "tokens per call", "draft acceptance rate", "c", "tokens/s",
               "baseline tokens/s", "speedup measured", "per-prompt spread", "verdict", "speedup predicted", "fidelity",
               "check"]  # fmt: skip
RUN_LEGEND = (
    "tokens per call: tokens emitted ÷ target calls, every call counted · draft acceptance rate: accepted ÷ drafted "
    "tokens · c: a draft forward's time ÷ a target forward's · speedup measured: over the whole run, tokens/s over "
    "every prompt ÷ the target alone's over the same prompts (the figure its bound checks) · per-prompt spread: "
    "each prompt against the target alone on the same prompt, lowest to highest, and their median; ⚠ marks a "
    "prompt above its own bound · "
    "predicted: from the measured α, c and verify cost · fidelity: the outputs against the target alone's"
)
RUN_NUMERIC = RUN_HEADERS[2:9] + ["speedup predicted"]  # the spread is words too: it wraps, not the page


def run_row(r: RunFigures, status: bool) -> list[Any]:
    spread = r.spread_words or "—"
    check = tag("span", "⚠ flagged", "flag") if r.flags else ""
    return [
        r.label,
        *([r.status] if status else []),
        number(r.alpha, "%.3f"),
        number(r.tokens_per_call, "%.2f"),
        number(r.draft_acceptance_rate, "%.3f"),
        number(r.c, "%.3f"),
        number(r.tokens_per_s, "%.1f"),
        number(r.baseline_tokens_per_s, "%.1f"),
        number(r.speedup_measured, "%.2f×"),
        spread,
        r.verdict or "—",
        number(r.speedup_predicted, "%.2f×"),
        r.fidelity or "—",
        check,
    ]


def runs_parts(figures: list[RunFigures]) -> list[Html]:
    if not figures:
        return [tag("p", "No runs yet.", "muted")]
    status = any(r.status != "done" for r in figures)  # the status column only while some run is not done
    headers = [h for h in RUN_HEADERS if status or h != "status"]
    parts = [table(headers, [run_row(r, status) for r in figures], RUN_NUMERIC), tag("p", RUN_LEGEND, "muted")]
    flagged = [(r.label, flag) for r in figures for flag in r.flags]
    if flagged:
        parts.append(tag("h3", "Flags: figures that break a physical bound"))
        parts.append(
            Html(
                "<ul>"
                + "".join(
                    tag("li", [tag("strong", f"{label}: "), tag("span", flag, "flag")]) for label, flag in flagged
                )
                + "</ul>"
            )
        )
    speculative = [r for r in figures if r.kind != "baseline"]
    rows = [
        (
            r.label,
            [
                Bar(
                    "measured (whole run; whisker: lowest–highest prompt)",
                    r.speedup_measured,
                    r.spread["min"] if r.spread else None,
                    r.spread["max"] if r.spread else None,
                ),
                Bar("predicted", r.speedup_predicted),
            ],
        )
        for r in speculative
    ]
    if any(bars for _, bars in rows):
        parts.append(Html(bar_chart(rows, "Speedup per configuration against the target alone (red dashed: 1×)")))
    acceptance = widest_per_draft(speculative)
    if acceptance:
        series = [Series(r.label, [(i + 1, a) for i, a in enumerate(r.per_position_acceptance)]) for r in acceptance]
        parts.append(
            Html(
                line_chart(
                    series,
                    "Acceptance rate per draft position (the widest γ of each draft)",
                    "draft position",
                    "acceptance rate",
                    reference=None,
                    y_max=1.0,
                )
            )
        )
    return parts


def widest_per_draft(runs: list[RunFigures]) -> list[RunFigures]:
    """Per draft × temperature, the fixed-γ run that measured the most positions."""
    best: dict[tuple[str, Any], RunFigures] = {}
    for r in runs:
        if r.policy or not r.per_position_acceptance:
            continue
        key = (r.draft, r.temperature)
        if key not in best or len(r.per_position_acceptance) > len(best[key].per_position_acceptance):
            best[key] = r
    return list(best.values())
