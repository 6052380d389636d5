"""Policies: every speculation policy replayed from a session's recorded draft pass, against the best fixed γ.

Layout only: the replay comes from engine.service.decide.policies (what `python -m engine policies` prints), frames,
charts and words from app.policies_view. Preselected sessions: ?session=N or N,M.
"""

from typing import Any

import streamlit as st

from app import common, components, memo
from app import policies_view as pv
from app import recommend_view as rv
from app.common import md_escape
from engine.service.api import prove

common.page_setup("Policies")
st.title("Speculation policies")
st.markdown(pv.INTRO)
common.hardware_banner()
store = common.get_store()

sessions = common.attempt(store.list_sessions, action="list the sessions")
if sessions is None:
    st.stop()
finished = [s for s in sessions if s.get("status") == "done"]
if not finished:
    st.info(pv.NO_SESSIONS)
    st.page_link(common.PAGES["Run"], label="Go to Run", icon=common.ICONS["Run"])
    st.stop()

chosen_ids: list[int] = components.sessions_picker("Finished sessions", finished, "pol_sessions",
                                                   default=[finished[0]["id"]])  # fmt: skip
c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
objective = c1.radio("Objective", list(pv.OBJECTIVE_LABELS), format_func=pv.OBJECTIVE_LABELS.get,
                     horizontal=True, key="pol_objective")  # fmt: skip
budget = None
if objective == "latency_within_budget":
    budget = c1.slider("Cost budget", 0, 100, 20, 5, format="+%d%%", key="pol_budget") / 100.0
batch_size = c2.number_input(
    "Serving batch size",
    min_value=1,
    max_value=4096,
    value=1,
    step=1,
    key="pol_batch",
    help="Policies are judged at this width: b × (drafted + 1) token rows per verify step",
)
regime_choice = c3.selectbox("Regime", list(rv.REGIME_CHOICES), format_func=rv.REGIME_LABELS.get, key="pol_regime")
if not chosen_ids:
    st.info("Pick at least one finished session above.")
    st.stop()
temperature = components.temperature_picker(store, chosen_ids, c4, "pol_temperature")

report: Any = None
with common.guard("replay the policies"):
    report = memo.policies(store, chosen_ids, objective, budget, int(batch_size), rv.override_or_none(regime_choice),
                           temperature=temperature)  # fmt: skip
if report is None:
    st.stop()
for note in report.notes:
    st.caption(f"{common.ICONS['info']} {md_escape(note)}")
if not report.drafts:
    st.info(components.NOTHING_TO_REPLAY if report.notes else components.NO_POLICY_TRACE)
    st.stop()

st.subheader("Best drafting policy")
components.query_decision(store, chosen_ids, objective, int(batch_size), temperature, budget, None,
                          rv.override_or_none(regime_choice))  # fmt: skip
components.policy_headline(report)
st.divider()

st.subheader("Policies against their setting")
labels = [pv.draft_label(d) for d in report.drafts]
index = labels.index(pv.draft_label(report.chosen)) if report.chosen in report.drafts else 0
if len(labels) > 1:
    index = st.selectbox("Draft", list(range(len(labels))), index=index, format_func=lambda i: labels[i],
                         key="pol_draft")  # fmt: skip
draft = report.drafts[index]
k1, k2 = st.columns(2)
kinds = pv.kinds_of(draft)
kind = k1.radio("Policy", kinds, format_func=pv.KIND_LABELS.get, horizontal=True, key="pol_kind")
metric = k2.radio("Show", list(pv.METRICS), format_func=pv.METRICS.get, horizontal=True, key="pol_metric")
with common.guard("draw the policy chart"):
    frame = pv.chart_frame(draft, kind)
    reference = pv.reference_value(draft, metric)
    label = f"best fixed {draft.comparison.best_fixed.policy}: {reference:.3f}"
    st.altair_chart(pv.policy_chart(frame, kind, metric, reference, label), width="stretch")
cost = draft.cost
st.caption(md_escape(f"c = {cost.c:.3f} per draft forward, v(k) {'measured' if cost.verify_cost else 'assumed 1'}, "
                     f"{cost.regime}; at T > 0 every figure is an estimate from β per position."))  # fmt: skip

st.subheader("Replay table")
show_all = st.toggle("Show every policy of the grid", key="pol_all")
components.table(pv.table_frame(draft, None if show_all else 20),
                 numbers={"tokens/call": "%.3f", "draft calls/step": "%.2f", "speedup": "%.2f×", "cost ×": "%.3f",
                          "live tokens/call": "%.3f", "live speedup": "%.2f×"})  # fmt: skip
for note in draft.notes:
    st.caption(f"{common.ICONS['info']} {md_escape(note)}")

st.subheader("Replayed beside live")
live = pv.live_frame(draft)
if live.empty:
    st.caption("This session ran no policy live yet: prove the best ones below.")
else:
    components.table(live, numbers={"tokens/call replayed": "%.3f", "tokens/call live": "%.3f",
                                    "speedup predicted": "%.2f×", "speedup live": "%.2f×"})  # fmt: skip
n_prove = st.number_input("Policies to prove live", 1, 4, 3, key="pol_prove_n", help=pv.PROVE_HELP)
if st.button("▶ Prove them live (queue a session)", key="pol_prove"):
    with common.guard("queue the proving session"):
        new_id, specs = prove(store, report, int(n_prove))
        st.success(md_escape(f"Session {new_id} queued: {', '.join(specs)}. {common.start_worker()}"))
st.divider()

st.subheader("Export the recommended policy")
st.caption(md_escape("What each engine can express — " + "; ".join(pv.support_lines())))
exported = pv.exports(report)
for col, (fmt, item) in zip(st.columns(len(exported)), exported.items(), strict=False):
    if not isinstance(item, Exception):
        col.download_button(f"⬇ {pv.format_label(fmt)}", data=item.text, file_name=f"policy-{item.filename}",
                            key=f"pol_dl_{fmt}", on_click="ignore", width="stretch")  # fmt: skip
for fmt, item in exported.items():
    with st.expander(md_escape(pv.export_caption(fmt, item))):
        if not isinstance(item, Exception):
            st.code(item.text, language="json" if item.filename.endswith(".json") else "bash")
