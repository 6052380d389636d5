"""Watch: a running deployment judged window by window against a stored session, as `python -m engine watch` stored it.

Layout only: the windows and their verdicts come from the store (the watcher judged them, engine.watch); words,
frames and tones from app.watch_view, the timeline from app.charts. Preselected deployment: ?deployment=NAME.
"""

import streamlit as st

from app import charts, common
from app import watch_view as wv
from engine.service.api import watch_action_file

common.page_setup("Watch")
st.title("Is speculation still paying?")
st.markdown(wv.INTRO)
store = common.get_store()

deployments = common.attempt(store.watch_deployments, action="list the watched deployments")
if deployments is None:
    st.stop()
if not deployments:
    st.info(wv.NONE_YET)
    st.code(wv.START_COMMAND, language="bash")
    st.stop()

asked = st.query_params.get("deployment")
c1, c2 = st.columns([4, 2])
chosen = c1.selectbox("Deployment", deployments, index=deployments.index(asked) if asked in deployments else 0,
                      key="watch_deployment")  # fmt: skip
shown = c2.select_slider("Windows shown (newest)", [20, 100, 500, 2000], value=100, key="watch_limit")
st.query_params["deployment"] = chosen
rows = common.attempt(store.list_watch_windows, chosen, limit=int(shown), action="read the deployment's windows")
if not rows:
    st.stop()

latest = rows[-1]
getattr(st, wv.tone(str(latest["verdict"])))(f"Latest window ({latest['ended_at']:%Y-%m-%d %H:%M:%S}): "
                                             f"{wv.headline(latest)}")  # fmt: skip
judged = wv.last_judged(rows)
if judged is not None and judged is not latest:
    getattr(st, wv.tone(str(judged["verdict"])))(f"Last judged window ({judged['ended_at']:%Y-%m-%d %H:%M:%S}): "
                                                 f"{wv.headline(judged)}")  # fmt: skip
figures = (judged or latest).get("figures") or {}
m1, m2, m3, m4 = st.columns(4)
m1.metric(
    "Predicted speedup",
    wv.number_text(figures.get("predicted_speedup"), 2, "×"),
    help="The deployed configuration against serving without speculation, at this window's α and batch.",
)
m2.metric(
    "Mean acceptance length",
    wv.number_text(figures.get("mean_acceptance_length"), 2),
    help="1 + accepted ÷ drafts: tokens per drafting step.",
)
m3.metric(
    "Draft acceptance rate", wv.number_text(figures.get("draft_acceptance_rate"), 2), help="Accepted ÷ draft tokens."
)
m4.metric(
    "Requests running",
    wv.number_text(figures.get("requests_running"), 1),
    help="The mean over the window: the serving batch the prediction is made at.",
)
counts = wv.verdict_counts(rows)
st.caption("Over the windows shown: " + ", ".join(f"{verdict} {n}" for verdict, n in counts.items()) + ".")

offered_on = judged or latest
offered = common.attempt(watch_action_file, store, str(offered_on["verdict"]), offered_on.get("figures") or {},
                         action="make the file this verdict offers")  # fmt: skip
if offered is not None:
    st.subheader("What to do")
    st.markdown(wv.offer_text(offered))
    st.download_button(f"Download {offered.filename}", offered.text, file_name=offered.filename,
                       mime=offered.mime, key="watch_action_file")  # fmt: skip
    st.code(offered.text, language=offered.language)
    if offered.checkable:
        st.caption(wv.check_text(offered))

st.subheader("Timeline")
st.altair_chart(charts.watch_timeline(wv.timeline(rows)), use_container_width=True)
if any(wv.tone(v) == "error" for v in counts):
    st.page_link(common.PAGES["Recommend"], label="Recommend — the session's own answer and every export",
                 icon=common.ICONS["Recommend"])  # fmt: skip

st.subheader("Windows")
st.dataframe(wv.windows_table(rows), hide_index=True, use_container_width=True)
with st.expander("Watch another deployment"):
    st.code(wv.START_COMMAND, language="bash")
