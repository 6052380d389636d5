"""Recommend: which draft and γ to serve with (or none), why, and the configuration to paste into a server.

Pick finished sessions, an objective, the serving batch size and (optionally) a price; the page
shows the regime with its evidence, the crossover table for the measured α with the recommended γ
highlighted, the draft comparison, the γ-by-batch schedule, and one export per serving engine.
Everything is computed from the store by pure engine functions (engine.service.evidence / recommend /
export / regime classifiers): no model is loaded here. Preselected sessions: ?session=N or N,M.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from typing import Any  # noqa: E402

import streamlit as st  # noqa: E402

from app import charts, common  # noqa: E402
from app import recommend_view as rv  # noqa: E402
from app.common import md_escape  # noqa: E402
from engine.analysis.export import FORMATS, export  # noqa: E402
from engine.analysis.recommend import crossover_from_curve, gamma_curve  # noqa: E402
from engine.analysis.regime import RegimeReport  # noqa: E402
from engine.analysis.theory import COMPUTE_BOUND  # noqa: E402
from engine.errors import SpectuneError  # noqa: E402
from engine.service.evidence import recommend_from_store  # noqa: E402

common.page_setup("Recommend")
st.title("🎯 Recommendation and export")
st.markdown(
    "Which draft and γ to serve with — or no speculation at all — for **your** objective at **your** batch size, "
    "from the α, c and speedups your sessions measured. Whether the extra arithmetic is free depends on the "
    "regime, so the regime and its evidence come first."
)
common.hardware_banner()
store = common.get_store()

SESSIONS = "rec_sessions"
APPLIED = "rec_sessions_from_url"
FLASH = "rec_flash"
SAVED = "rec_saved"
NUMBER = st.column_config.NumberColumn
FORMAT_LABELS = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "transformers": "transformers",
    "llamacpp": "llama.cpp",
    "spectune": "spectune record",
}
FORMAT_LANGUAGE = {"vllm": "json", "sglang": "bash", "transformers": "json", "llamacpp": "bash", "spectune": "json"}
FORMAT_MIME = {"vllm": "application/json", "transformers": "application/json", "spectune": "application/json"}
NVML_NOTE = (
    "GPU utilisation (NVML) is deliberately not evidence: it is the share of time *any* kernel was running, so a "
    "batch-1 decode that streams weights and leaves the tensor cores idle reads about 100%. It says nothing about "
    "whether you are memory- or compute-bound — the batch sweep and v(k) do."
)


# ---------------------------------------------------------------------------------------------------------------------
# sessions: finished only, preselected from ?session=


sessions = common.attempt(store.list_sessions, action="list the sessions")
if sessions is None:
    st.stop()
finished = [s for s in sessions if s.get("status") == "done"]
by_id = {s["id"]: s for s in finished}

raw_param = st.query_params.get("session")
wanted = rv.parse_session_param(raw_param)
preselected, problems = rv.split_preselection(wanted, sessions)
for problem in problems:
    common.show_error(SpectuneError(problem), "use the session from the address bar")

if not finished:
    others = len(sessions)
    st.info(
        "No finished sessions yet. A recommendation is computed from the α, c and speedups a finished tuning session "
        "measured: start a session on the Run page, let it finish, then come back here."
        + (f" ({others} session(s) are stored, none of them done.)" if others else "")
    )
    st.page_link(common.PAGES["Run"], label="Go to Run", icon="▶️")
    st.stop()

if raw_param is not None and st.session_state.get(APPLIED) != str(raw_param):
    st.session_state[APPLIED] = str(raw_param)
    st.session_state[SESSIONS] = preselected
if SESSIONS not in st.session_state:
    st.session_state[SESSIONS] = [finished[0]["id"]]  # the newest finished session
st.session_state[SESSIONS] = [i for i in st.session_state[SESSIONS] if i in by_id]


def _sync_sessions_to_url() -> None:
    chosen = st.session_state.get(SESSIONS) or []
    value = ",".join(str(i) for i in chosen)
    st.session_state[APPLIED] = value
    if value:
        st.query_params["session"] = value
    else:
        st.query_params.pop("session", None)


st.subheader("What to optimise")
chosen_ids: list[int] = st.multiselect(
    "Finished sessions to recommend from",
    list(by_id),
    format_func=lambda i: common.session_label(by_id[i]),
    key=SESSIONS,
    on_change=_sync_sessions_to_url,
    help="Their speculative runs are pooled per draft × temperature. Only finished (done) sessions are listed.",
)

c1, c2, c3, c4 = st.columns([1.5, 1, 1, 1.2])
with c1:
    objective = st.radio(
        "Objective",
        list(rv.OBJECTIVE_LABELS),
        format_func=rv.OBJECTIVE_LABELS.get,
        key="rec_objective",
        help="Latency: the fastest decoding. Cost: the lowest cost per token. Latency within a budget: the fastest "
        "decoding whose cost per token rises by at most the budget.",
    )
    budget_pct = None
    if objective == "latency_within_budget":
        budget_pct = st.slider(
            "Cost budget (allowed rise in cost per token)", 0, 100, 20, 5, format="+%d%%", key="rec_budget"
        )
with c2:
    batch_size = st.number_input(
        "Serving batch size", min_value=1, max_value=4096, value=1, step=1, key="rec_batch",
        help="Concurrent sequences per decode step on the server: decides memory- vs compute-bound.",
    )  # fmt: skip
with c3:
    price = st.number_input(
        "Price per accelerator-hour ($)", min_value=0.0, max_value=10_000.0, value=0.0, step=0.5, format="%.2f",
        key="rec_price", help="Optional (0 = none): shows money per million tokens before and after.",
    )  # fmt: skip
with c4:
    regime_choice = st.selectbox(
        "Regime", list(rv.REGIME_CHOICES), format_func=rv.REGIME_LABELS.get, key="rec_regime",
        help="Auto judges the chosen batch size against the stored batch sweep's knee. Override it only if you "
        "know better than the measurement.",
    )  # fmt: skip

if not chosen_ids:
    st.info("Pick at least one finished session above.")
    st.stop()

picked = [by_id[i] for i in chosen_ids]
targets = sorted({str(s.get("target")) for s in picked})
if len(targets) > 1:
    st.warning(
        f"The chosen sessions measure different targets ({md_escape(', '.join(targets))}): their drafts are compared "
        "as if they served one target."
    )

budget = rv.budget_fraction(budget_pct)
price_per_hour = rv.price_or_none(price)
override = rv.override_or_none(regime_choice)
inputs = rv.inputs_dict(chosen_ids, objective, budget, int(batch_size), price_per_hour, override)

result: Any = None
with common.guard("compute the recommendation"):
    result = recommend_from_store(store, chosen_ids, objective, budget, int(batch_size), price_per_hour, override)


# ---------------------------------------------------------------------------------------------------------------------
# sections


def show_decision(rec: Any) -> None:
    st.subheader("Recommendation")
    parts = rv.decision_parts(rec)
    context = f"{rec.regime}, batch {rec.batch_size}, objective: {rv.OBJECTIVE_LABELS[rec.objective].lower()}"
    if rec.objective == "latency_within_budget" and rec.budget is not None:
        context += f" (budget {rv.pct(rec.budget)})"
    if rec.off:
        st.warning(f"**Speculation OFF** — serve the target alone ({md_escape(context)}).", icon="⛔")
    else:
        st.success(
            f"**{md_escape(parts['draft'])}** with **γ = {rec.gamma}**: predicted **{parts['speedup']}** faster · "
            f"ops multiplier **{parts['ops']}** · cost per token **{parts['cost']}** ({md_escape(context)})",
            icon="✅",
        )
    st.markdown(md_escape(rec.explanation))
    cols = st.columns(5)
    cols[0].metric("Draft", parts["draft"])
    cols[1].metric("γ", parts["gamma"])
    cols[2].metric("Predicted speedup", parts["speedup"], help="Latency multiple against the target alone.")
    cols[3].metric("Ops multiplier", parts["ops"], help="Theorem 3.11: (γĉ + γ + 1) / E[tokens per target call].")
    cols[4].metric(
        "Cost per token",
        parts["cost"],
        help="Memory-bound: ×1/speedup (the extra arithmetic is free). Compute-bound: ×ops multiplier (it is billed).",
    )
    if price_per_hour is not None:
        if rec.cost_per_million_baseline is None:
            st.caption("No baseline tokens/s is stored for these sessions, so money per million tokens is unknown.")
        else:
            m = st.columns(3)
            m[0].metric("$ per million tokens, target alone", rv.money(rec.cost_per_million_baseline))
            m[1].metric(
                "$ per million tokens, " + ("off" if rec.off else "recommended"),
                rv.money(rec.cost_per_million),
                delta=None if rec.off else rv.pct(rv.money_change(rec)),
                delta_color="inverse",
            )
            m[2].caption(
                f"At ${price_per_hour:,.2f}/h, {rec.batch_size} stream(s) at the measured baseline tokens/s each; the "
                "speculative figure applies the cost-per-token multiplier of the regime."
            )
    for note in rec.notes:
        st.caption(f"ℹ️ {md_escape(note)}")


def show_regime(rec: Any, ev: Any, evidence: list[str], verify: dict[int, float]) -> None:
    st.subheader(f"Regime: {rec.regime}")
    knee = rv.rejudged_knee(ev.regime, rec.batch_size)
    st.caption(md_escape(rv.regime_source(rec, override, knee, ev.regime is not None)))
    left, right = st.columns(2)
    with left:
        st.markdown("**Evidence**")
        st.markdown("\n".join(f"- {md_escape(line)}" for line in evidence) or "- none stored")
        for note in ev.notes:
            st.caption(md_escape(note))
        st.info(NVML_NOTE, icon="📉")
    with right:
        sweep = rv.stored_sweep(ev.regime)
        if sweep is None:
            st.caption(
                "No batch sweep is stored for these sessions (regime detection was off, or it failed): the regime "
                "comes from the override or the default."
            )
        else:
            st.markdown("**Batch sweep: decode step time vs batch size**")
            st.altair_chart(charts.batch_sweep(rv.sweep_frame(*sweep), knee, rec.batch_size), width="stretch")
            st.caption(
                "Flat step time: extra rows ride on the weight stream (memory-bound, speculation's arithmetic is "
                "free). About linear growth past the knee (red): compute is saturated and every extra token is "
                "billed. Grey dashed: the serving batch chosen above."
            )
        st.markdown("**Verify cost v(k): a k-token target forward relative to a 1-token one**")
        st.altair_chart(charts.verify_cost(rv.verify_frame(verify)), width="stretch")
        if len([k for k in verify if k > 1]) == 0:
            st.caption("Only v(1) = 1 is stored: the sessions did not measure the cost of verifying more tokens.")


def show_crossover(rec: Any, ev: Any) -> None:
    cands = rv.candidates(ev.measurements)
    if not cands:
        return
    st.subheader("Crossover table for the measured α")
    winner = rv.winner_index(rec, cands)
    show_t = len({m.temperature for m in cands}) > 1
    labels = [rv.candidate_label(s, m, show_t) for s, m in zip(rec.comparison, cands, strict=True)]
    default = winner
    if default is None:  # off: show the best candidate's curve
        default = max(range(len(cands)), key=lambda i: rec.comparison[i].best_speedup)
    index = default
    if len(cands) > 1:
        key = f"rec_curve_{rv.fingerprint({'labels': labels, 'winner': winner}, '')}"
        index = st.selectbox(
            "Draft", list(range(len(cands))), index=default, format_func=lambda i: labels[i], key=key,
            help="The recommended draft first; pick another to see why it lost.",
        )  # fmt: skip
    m, summary = cands[index], rec.comparison[index]
    if index == winner:
        curve, highlight, mark = rec.curve, rec.gamma, rv.RECOMMENDED_MARK
    else:
        curve, highlight = gamma_curve(m), summary.best_gamma
        mark = "◀ best γ for this draft" + (" (speculation off)" if rec.off else " (not recommended)")
    cross = crossover_from_curve(curve)
    table = rv.curve_frame(curve, rec.regime, highlight)
    if mark != rv.RECOMMENDED_MARK:
        table["mark"] = table["mark"].str.replace(rv.RECOMMENDED_MARK, mark, regex=False)
    source = curve[0].expected_tokens_source if curve else "positional"
    source_text = "the greedy agreement runs" if source == "agreement_runs" else "per-position acceptance"
    c_fit = f" (fitted to the measured speedups: {summary.c_effective:.3f})" if summary.c_effective is not None else ""
    st.markdown(
        f"**{md_escape(labels[index])}** — α {m.alpha:.3f} (T = {m.temperature:g}), c {m.c:.3f}{md_escape(c_fit)}; "
        f"tokens per call from {source_text}"
        f" · crossover **{'γ = ' + str(cross) if cross is not None else 'none up to γ = 32'}** · "
        f"{'recommended' if index == winner else 'best'} **γ = {highlight}**"
    )
    if rec.regime == COMPUTE_BOUND and cross is not None and highlight >= cross:
        st.warning(
            f"γ = {highlight} is at or past the crossover γ = {cross}: on a compute-bound server the arithmetic grows "
            "faster than the speed."
        )

    def _style(row: Any) -> list[str]:
        if row["γ"] == highlight:
            return ["background-color: rgba(46, 160, 67, 0.25); font-weight: bold"] * len(row)
        if cross is not None and row["γ"] == cross:
            return ["color: #d62728"] * len(row)
        return [""] * len(row)

    styled = table.style.apply(_style, axis=1).format(
        {
            "mean acceptance length": "{:.2f}",
            "speedup (model)": "{:.2f}×",
            "speedup (calibrated)": "{:.2f}×",
            "speedup (Thm 3.8, one α)": "{:.2f}×",
            "ops multiplier": "{:.2f}×",
            "measured speedup": "{:.2f}×",
        },
        na_rep="—",
    )
    lines, measured = rv.curve_chart_frames(curve)
    st.altair_chart(charts.recommend_curve(lines, measured, highlight, cross), width="stretch")
    st.dataframe(
        styled,
        hide_index=True,
        width="stretch",
        height=36 + 35 * min(len(table), 16),
        column_config={"mark": st.column_config.Column(width=115)},
    )
    st.caption(
        "Calibrated speedup: the model E/(γc + v(γ+1)) bent through the measured speedups — what the recommender "
        "ranks on. Thm 3.8: the single-α formula with v = 1. Ops multiplier: (γĉ + γ + 1)/E. Crossover (red): the "
        "first γ where the ops multiplier exceeds the speedup; only a compute-bound server has to stay below it. "
        "Diamonds: measured speedups."
    )


def show_comparison(rec: Any, ev: Any) -> None:
    st.subheader("Draft comparison")
    cands = rv.candidates(ev.measurements)
    show_t = len({m.temperature for m in cands}) > 1
    labels = [rv.candidate_label(s, m, show_t) for s, m in zip(rec.comparison, cands, strict=True)]
    winner = rv.winner_index(rec, cands)
    table = rv.comparison_frame(rec.comparison, winner, labels)

    def _style(row: Any) -> list[str]:
        chosen = winner is not None and row.name == winner
        return ["background-color: rgba(46, 160, 67, 0.25); font-weight: bold" if chosen else ""] * len(row)

    styled = table.style.apply(_style, axis=1).format(
        {
            "α": "{:.3f}",
            "c": "{:.3f}",
            "predicted speedup": "{:.2f}×",
            "measured speedup": "{:.2f}×",
            "at γ": "{:.0f}",
            "ops multiplier": "{:.2f}×",
        },
        na_rep="—",
    )
    st.dataframe(
        styled,
        hide_index=True,
        width="stretch",
        column_config={
            "α": st.column_config.Column(help="acceptance rate measured on your prompts"),
            "c": st.column_config.Column(help="draft forward time / target forward time (profiled)"),
            "best γ": st.column_config.Column(help="the draft's best γ for this objective"),
            "predicted speedup": st.column_config.Column(help="at the draft's best γ for this objective"),
            "measured speedup": st.column_config.Column(help="the best speedup a session measured for this draft"),
            "at γ": st.column_config.Column(help="the γ of that measured speedup"),
            "ops multiplier": st.column_config.Column(help="Theorem 3.11's arithmetic bill at the best γ"),
        },
    )
    st.markdown(md_escape(rec.explanation))
    st.caption("Not the best α wins but the best balance of α and c: a bigger draft guesses better and costs more.")


def show_schedule(rec: Any, ev: Any) -> None:
    st.subheader("γ by serving batch size")
    knee = rv.rejudged_knee(ev.regime, rec.batch_size)
    if not rec.schedule:
        st.caption("No schedule: speculation is off for this objective." if rec.off else "No schedule was computed.")
        return
    left, right = st.columns([1, 2])
    with left:
        st.dataframe(rv.schedule_frame(rec.schedule, rec.batch_size, knee), hide_index=True, width="stretch")
    with right:
        st.markdown(
            "As the batch grows the server moves from memory- to compute-bound, so γ shrinks: "
            "below half the knee the latency-optimal γ; approaching it, γ capped below the crossover; at or past "
            "the knee, off. "
            + (f"Knee from the stored batch sweep: batch **{knee}**." if knee is not None else
               "No knee was stored, so γ stays the same at every batch.")
        )  # fmt: skip
        st.caption("vLLM takes the schedule as num_speculative_tokens_per_batch_size; SGLang and llama.cpp cannot.")


# ---------------------------------------------------------------------------------------------------------------------
# export and history


def _save(formats: list[str], files: dict[str, tuple[str, str]], payload: dict[str, Any], key: str) -> None:
    """Callback of the download buttons and 'Save to history': one stored recommendation per result, its files once."""
    try:
        saved = st.session_state.setdefault(SAVED, {})
        entry = saved.get(key)
        if entry is None or store.get_recommendation(entry["id"]) is None:
            ids, objective_name = payload["inputs"]["session_ids"], payload["inputs"]["objective"]
            rec_id = store.save_recommendation(ids, objective_name, payload)
            entry = {"id": rec_id, "formats": []}
            saved[key] = entry
        added = []
        for fmt in formats:
            if fmt in entry["formats"] or fmt not in files:
                continue
            filename, text = files[fmt]
            store.save_export(entry["id"], fmt, filename, text)
            entry["formats"].append(fmt)
            added.append(FORMAT_LABELS.get(fmt, fmt))
        what = ", ".join(added) if added else "nothing new (already saved)"
        st.session_state[FLASH] = ("success", f"Recommendation #{entry['id']} in the history; files saved: {what}.")
    except Exception as exc:  # noqa: BLE001 - shown on the next line of the page, never a traceback
        st.session_state[FLASH] = ("error", exc)


def show_exports(rec: Any, report: RegimeReport | None) -> None:
    st.subheader("Export")
    files: dict[str, tuple[str, str]] = {}
    for fmt in FORMATS:
        with common.guard(f"export for {FORMAT_LABELS.get(fmt, fmt)}"):
            files[fmt] = export(rec, fmt, regime=report)
    if not files:
        return
    spectune_text = files.get("spectune", ("", ""))[1]
    key = rv.fingerprint(inputs, spectune_text)
    payload = rv.payload(rec, inputs, spectune_text)
    st.caption(
        "Paste-ready configuration for each server"
        + (" — speculation off is exported too, as an explained absence, so nobody re-enables it by accident."
           if rec.off else ".")
        + " Downloading a file also keeps it in the history below."
    )  # fmt: skip
    cols = st.columns(len(files) + 1)
    for col, (fmt, (filename, text)) in zip(cols, files.items(), strict=False):
        col.download_button(
            f"⬇ {FORMAT_LABELS.get(fmt, fmt)}", data=text, file_name=filename,
            mime=FORMAT_MIME.get(fmt, "text/plain"), key=f"rec_dl_{fmt}", on_click=_save,
            args=([fmt], files, payload, key), width="stretch", help=filename,
        )  # fmt: skip
    cols[-1].button(
        "💾 Save to history", key="rec_save", on_click=_save, args=(list(files), files, payload, key),
        width="stretch", help="Keep this recommendation and every exported file in the database.",
    )  # fmt: skip
    flash = st.session_state.pop(FLASH, None)
    if flash is not None:
        kind, value = flash
        if kind == "success":
            st.success(md_escape(value))
        else:
            common.show_error(value, "save the recommendation")
    for fmt, (filename, text) in files.items():
        with st.expander(f"{FORMAT_LABELS.get(fmt, fmt)} — {filename}"):
            st.code(text, language=FORMAT_LANGUAGE.get(fmt, "text"))


def show_history() -> None:
    st.subheader("Previous recommendations")
    recs = common.attempt(store.list_recommendations, action="list the saved recommendations")
    if recs is None:
        return
    if not recs:
        st.caption("None saved yet: download an export or press “Save to history”.")
        return
    st.dataframe(
        rv.history_frame(recs),
        hide_index=True,
        width="stretch",
        column_config={
            "created": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm"),
            "speedup": NUMBER(format="%.2f×"),
        },
    )
    by_rec = {r["id"]: r for r in recs}
    chosen = st.selectbox(
        "Download a saved recommendation's files again", list(by_rec), key="rec_history_pick",
        format_func=lambda i: f"#{i} · {by_rec[i].get('objective')} · sessions "
        + ", ".join(f"#{s}" for s in by_rec[i].get("session_ids") or []),
    )  # fmt: skip
    if chosen is None:
        return
    exports = common.attempt(store.list_exports, chosen, action=f"list the files of recommendation #{chosen}")
    if not exports:
        if exports is not None:
            st.caption("No files were saved with this recommendation.")
        return
    cols = st.columns(min(len(exports), 6))
    for i, item in enumerate(exports):
        cols[i % len(cols)].download_button(
            f"⬇ {FORMAT_LABELS.get(item['format'], item['format'])}", data=item["content"] or "",
            file_name=item["filename"] or "export.txt", key=f"rec_hist_dl_{item['id']}", on_click="ignore",
            width="stretch", help=item["filename"],
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# page

if result is not None:
    rec, ev, stored_report = result
    cands = rv.candidates(ev.measurements)
    chosen_measurement = rec.measurement or (cands[0] if cands else None)
    verify = rv.verify_points(chosen_measurement)
    evidence: list[str] = []
    with common.guard("judge the regime evidence"):
        evidence = rv.regime_evidence(ev.regime, rec.batch_size, override, verify)
    report = RegimeReport(
        label=rec.regime,
        evidence=evidence,
        votes=dict(stored_report.votes) if stored_report else {},
        agree=stored_report.agree if stored_report else True,
    )
    with common.guard("show the recommendation"):
        show_decision(rec)
    st.divider()
    with common.guard("show the regime"):
        show_regime(rec, ev, evidence, verify)
    st.divider()
    with common.guard("show the crossover table"):
        show_crossover(rec, ev)
    st.divider()
    with common.guard("show the draft comparison"):
        show_comparison(rec, ev)
    with common.guard("show the γ schedule"):
        show_schedule(rec, ev)
    st.divider()
    with common.guard("export the recommendation"):
        show_exports(rec, report)

st.divider()
with common.guard("show the saved recommendations"):
    show_history()
