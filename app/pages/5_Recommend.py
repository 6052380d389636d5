"""Recommend: placeholder until the recommender lands — lists the sessions it will work from."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from app import common, data  # noqa: E402

common.page_setup("Recommend")
st.title("🎯 Recommendation and export")
st.info("Recommendation and export — coming with the recommender.")
common.hardware_banner()
store = common.get_store()

with common.guard("list the sessions"):
    sessions = store.list_sessions()
    if not sessions:
        st.caption("No sessions yet.")
    else:
        finished = [s for s in sessions if s["status"] == "done"]
        st.caption(f"{len(finished)} finished session(s) of {len(sessions)} will be available here.")
        table = data.sessions_frame(sessions, {s["id"]: data.best_speedup(s) for s in sessions})
        st.dataframe(table, hide_index=True, width="stretch")
