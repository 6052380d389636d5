"""Recommend: which draft and γ to serve with (or none), why, and the configuration to paste into a server.

Layout only: the decision, the regime, the exports and the payload come from
engine.service.decide.recommendations.recommend_and_export, the call `python -m engine recommend` makes (so both export
the same bytes), tables and text from app.recommend_view. Preselected sessions: ?session=N or N,M.
"""

from functools import partial
from typing import Any

import streamlit as st

from app import charts, common, components, memo
from app import recommend_view as rv
from app.common import md_escape
from engine.errors import SpectuneError
from engine.service import api

common.page_setup("Recommend")
st.title("Recommendation and export")
st.markdown(rv.INTRO)
common.hardware_banner()
store = common.get_store()
SESSIONS, FLASH, SAVED, VLLM = "rec_sessions", "rec_flash", "rec_saved", "rec_vllm_version"

sessions = common.attempt(store.list_sessions, action="list the sessions")
if sessions is None:
    st.stop()
finished = [s for s in sessions if s.get("status") == "done"]
by_id = {s["id"]: s for s in finished}
for problem in rv.preselection_problems(st.query_params.get("session"), sessions):
    common.show_error(SpectuneError(problem), "use the session from the address bar")
if not finished:
    st.info(rv.no_sessions_text(len(sessions)))
    st.page_link(common.PAGES["Run"], label="Go to Run", icon=common.ICONS["Run"])
    st.stop()

st.subheader("What to optimise")
chosen_ids: list[int] = components.sessions_picker("Finished sessions to recommend from", finished, SESSIONS,
                                                   default=[finished[0]["id"]], help=rv.HELP["sessions"])  # fmt: skip
c1, c2, c3, c4 = st.columns([1.5, 1, 1, 1.2])
objective = c1.radio("Objective", list(rv.OBJECTIVE_LABELS), format_func=rv.OBJECTIVE_LABELS.get, key="rec_objective",
                     help=rv.HELP["objective"])  # fmt: skip
budget_pct = None
if objective == "latency_within_budget":
    budget_pct = c1.slider("Cost budget (allowed rise in cost per token)", 0, 100, 20, 5, format="+%d%%",
                           key="rec_budget")  # fmt: skip
batch_size = c2.number_input("Serving batch size", min_value=1, max_value=4096, value=1, step=1, key="rec_batch",
                             help=rv.HELP["batch"])  # fmt: skip
price = c3.number_input("Price per accelerator-hour ($)", min_value=0.0, max_value=10_000.0, value=0.0, step=0.5,
                        format="%.2f", key="rec_price", help=rv.HELP["price"])  # fmt: skip
regime_choice = c4.selectbox("Regime", list(rv.REGIME_CHOICES), format_func=rv.REGIME_LABELS.get, key="rec_regime",
                             help=rv.HELP["regime"])  # fmt: skip
if not chosen_ids:
    st.info("Pick at least one finished session above.")
    st.stop()
if mixed := rv.mixed_targets(by_id[i] for i in chosen_ids):
    st.warning(md_escape(mixed))

budget, price_per_hour = rv.budget_fraction(budget_pct), rv.price_or_none(price)
override = rv.override_or_none(regime_choice)
engine = components.engine_picker(store, [by_id[i] for i in chosen_ids], rv.HELP["engine"], rv.ENGINE_NUMBERS)
temperature = components.temperature_picker(store, chosen_ids, st, "rec_temperature")
vllm_version = st.session_state.get(VLLM, api.VLLM_VERSION)  # its field is in the export section
result: api.Recommended | None = None
with common.guard("compute the recommendation"):
    result = memo.recommended(store, chosen_ids, objective, budget, int(batch_size), price_per_hour, override, engine,
                              temperature, vllm_version)  # fmt: skip


def show_decision(rec: Any) -> None:
    st.subheader("Recommendation")
    components.stored_decision(store, chosen_ids, rec, objective, int(batch_size), temperature, budget, price_per_hour,
                               override, engine)  # fmt: skip
    if measured := rec.measured_sentence():  # a measured run of this configuration, beside the headline
        (st.warning if rec.prefers_measurement else st.info)(md_escape(measured), icon=common.ICONS["info"])
    st.markdown(md_escape(rec.explanation))
    for col, (label, value, helptext) in zip(st.columns(5), rv.decision_metrics(rec), strict=True):
        col.metric(label, value, help=helptext)
    if price_per_hour is not None:
        metrics, caption = rv.money_metrics(rec, price_per_hour)
        cols = st.columns(3)
        for col, (label, value, delta) in zip(cols, metrics, strict=False):
            col.metric(label, value, delta=delta, delta_color="inverse")
        cols[2].caption(caption)
    for note in rec.notes:
        st.caption(f"{common.ICONS['info']} {md_escape(note)}")


def show_regime(rec: Any, ev: Any, report: Any) -> None:
    st.subheader(rv.regime_heading(rec.regime, report.label))
    st.caption(md_escape(report.source))
    left, right = st.columns(2)
    left.markdown("**Evidence**")
    left.markdown("\n".join(f"- {md_escape(line)}" for line in report.evidence) or "- none stored")
    left.info(rv.NVML_NOTE, icon=common.ICONS["gpu_note"])
    with right:
        if report.sweep is None:
            st.caption("No batch sweep is stored for these sessions: the regime comes from the other evidence.")
        else:
            st.markdown("**Batch sweep: decode step time vs batch size**")
            frame = rv.sweep_frame(report.sweep.batch_sizes, report.sweep.step_times_s)
            st.altair_chart(charts.batch_sweep(frame, report.knee_batch, rec.batch_size), width="stretch")
            st.caption(rv.SWEEP_CAPTION)
        st.markdown("**Verify cost v(k): a k-token target forward relative to a 1-token one**")
        st.altair_chart(charts.verify_cost(rv.verify_frame(ev.verify_cost)), width="stretch")
        if not ev.verify_cost:
            st.caption("No v(k) measured: only v(1) = 1 is known, so verification is assumed free.")


def show_crossover(rec: Any, ev: Any) -> None:
    cands = rv.candidates(ev.measurements)
    index = rv.default_candidate(rec, cands)
    if index is None:
        return
    st.subheader("Crossover table for the measured α")
    labels = rv.candidate_labels(rec, cands)
    if len(cands) > 1:
        index = st.selectbox("Draft", list(range(len(cands))), index=index, format_func=lambda i: labels[i],
                             key=rv.curve_picker_key(rec, cands), help=rv.HELP["draft"])  # fmt: skip
    view = rv.curve_view(rec, cands, index)
    st.markdown(f"**{md_escape(labels[index])}** — {md_escape(view['headline'])}")
    if view["warning"]:
        st.warning(view["warning"])
    lines, measured = rv.curve_chart_frames(view["curve"])
    recommended = view["highlight"] if view["recommended"] else None  # off: no γ is labelled recommended
    st.altair_chart(charts.recommend_curve(lines, measured, recommended, view["cross"]), width="stretch")
    table = view["table"]
    components.table(rv.styled_curve(table, view["highlight"], view["cross"]), height=36 + 35 * min(len(table), 16))
    st.caption(rv.CURVE_CAPTION)
    if view["reference"]:
        st.caption(md_escape(view["reference"]))


def show_drafts(rec: Any, ev: Any) -> None:
    st.subheader("Draft comparison")
    cands = rv.candidates(ev.measurements)
    winner = rv.winner_index(rec, cands)
    table = rv.comparison_frame(rec.comparison, winner, rv.candidate_labels(rec, cands))
    components.table(rv.styled_comparison(table, winner), helps=rv.COMPARISON_HELP)
    st.markdown(md_escape(rec.explanation))
    st.caption("Not the best α wins but the best balance of α and c: a bigger draft guesses better and costs more.")
    st.subheader("γ by serving batch size")
    if not rec.schedule:
        st.caption("No schedule: speculation is off for this objective." if rec.off else "No schedule was computed.")
        return
    left, right = st.columns([1, 2])
    with left:
        components.table(rv.schedule_frame(rec.schedule, rec.batch_size, rec.knee_batch, rec.schedule_measured))
    right.markdown(rv.schedule_text(rec))
    right.caption("vLLM takes the schedule as num_speculative_tokens_per_batch_size; SGLang and llama.cpp cannot.")


def _save(formats: list[str], result: api.Recommended, key: str) -> None:
    """Callback of the download buttons and 'Save to history': one stored recommendation per result, its files once."""
    try:
        entry = st.session_state.setdefault(SAVED, {}).setdefault(key, {"id": None, "formats": []})
        entry["id"], added = api.save_result(store, result, formats, entry["id"], entry["formats"])
        what = ", ".join(api.format_label(f) for f in added) or "nothing new (already saved)"
        st.session_state[FLASH] = ("success", f"Recommendation #{entry['id']} in the history; files saved: {what}.")
    except Exception as exc:  # noqa: BLE001 - shown on the next run of the page, never a traceback
        st.session_state[FLASH] = ("error", exc)


def show_exports(result: api.Recommended) -> None:
    st.subheader("Export")
    st.columns([1, 3])[0].text_input("vLLM version you deploy", value=api.VLLM_VERSION, key=VLLM, max_chars=40,
                                     help=rv.HELP["vllm"])  # fmt: skip
    for fmt, exc in result.failed.items():
        common.show_error(exc, f"export for {api.format_label(fmt)}")
    files = result.files
    if not files:
        return
    key = rv.fingerprint(result.inputs, files.get("spectune", ("", ""))[1])
    _ = result.payload  # made before the buttons: one that cannot be made stops this section here
    st.caption(rv.export_caption(result.recommendation))
    cols = st.columns(len(files) + 1)
    for col, (fmt, (filename, text)) in zip(cols, files.items(), strict=False):
        col.download_button(f"⬇ {api.format_label(fmt)}", data=text, file_name=filename, key=f"rec_dl_{fmt}",
                            mime=api.export_format(fmt).mime, on_click=_save,
                            args=([fmt], result, key), width="stretch", help=filename)  # fmt: skip
    cols[-1].button("Save to history", icon=common.ICONS["save"], key="rec_save", on_click=_save,
                    args=(list(files), result, key), width="stretch",
                    help="Keep this recommendation and every exported file.")  # fmt: skip
    kind, value = st.session_state.pop(FLASH, (None, None))
    if kind == "success":
        st.success(md_escape(value))
    elif kind == "error":
        common.show_error(value, "save the recommendation")
    for fmt, (filename, text) in files.items():
        with st.expander(f"{api.format_label(fmt)} — {filename}"):
            st.code(text, language=api.export_format(fmt).language)


if result is not None:
    rec, ev, report = result.triple
    st.download_button("⬇ Report (one HTML file)", key="rec_report", file_name=api.report_filename(chosen_ids),
                       data=partial(api.report_or_error, store, chosen_ids, objective, budget, int(batch_size),
                                    price_per_hour, override, engine, temperature, recommended=result),
                       mime="text/html", on_click="ignore",
                       help="The decision, its evidence, the runs, charts and every export, to share")  # fmt: skip
    for title, show, args in (
        ("the recommendation", show_decision, (rec,)), ("the regime", show_regime, (rec, ev, report)),
        ("the crossover table", show_crossover, (rec, ev)), ("the drafts and the γ schedule", show_drafts, (rec, ev)),
        ("the measured γ × concurrency surface", components.surface_section, (store, chosen_ids)),
        ("the drafting policy", components.policy_section, (result.policies, chosen_ids)),
        ("export the recommendation", show_exports, (result,)),
    ):  # fmt: skip
        with common.guard(title if title.startswith("export") else f"show {title}"):
            show(*args)
        if show is not components.surface_section:  # it draws its own divider, only when there is a surface
            st.divider()
else:
    with common.guard("show the measured γ × concurrency surface"):
        components.surface_section(store, chosen_ids)
with common.guard("show the saved recommendations"):
    components.recommendation_history(store)
