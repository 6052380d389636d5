"""spectune dashboard entry: what it is, the hardware, the worker, what is stored, and where to go next.

Run with `python -m app.serve` (streamlit run, the first visit's imports done before it listens). The pages in
app/pages/ only queue sessions and read the store; a separate worker process does all decoding.
"""

import streamlit as st

from app import common

common.page_setup("Home")
st.title("⚡ spectune")
st.markdown(
    "Tune **speculative decoding** on your own prompts and hardware. A small draft (a model or n-gram lookup) "
    "proposes γ tokens and the target verifies them in one forward pass; spectune measures the acceptance rate α, "
    "the draft cost c and the real speedup for every draft × γ × temperature, checks the output is still the "
    "target's, and tells you whether speculation pays off in your regime."
)
common.hardware_banner()

store = common.get_store()
pid, worker_line = common.worker_status()

with common.guard("read the database"):
    prompt_sets = store.list_prompt_sets()
    sessions = store.list_sessions()
    by_status: dict[str, int] = {}
    for s in sessions:
        by_status[s["status"]] = by_status.get(s["status"], 0) + 1

    cols = st.columns(4)
    cols[0].metric("Prompt sets", len(prompt_sets))
    cols[1].metric("Sessions", len(sessions))
    cols[2].metric("Queued / running", by_status.get("queued", 0) + by_status.get("running", 0))
    cols[3].metric("Finished", by_status.get("done", 0))

    dot, where = common.WORKER_DOT[bool(pid)], common.md_escape(store.where)
    st.caption(f"{dot} {common.md_escape(worker_line)} · database: {where}")
    if not pid and (by_status.get("queued") or 0) > 0:
        st.warning(f"{by_status['queued']} session(s) are queued but no worker is running.")
        if st.button("Start the worker"):
            with common.guard("start the worker"):
                st.success(common.md_escape(common.start_worker()))

st.subheader("Where to go")
for page, label in (
    ("Prompts", "Prompts — upload or import prompt sets"),
    ("Run", "Run — start a tuning session and watch it live"),
    ("Sessions", "Sessions — results, fidelity, comparisons"),
    ("Theory", "Theory — speedup vs arithmetic, the crossover γ"),
    ("Recommend", "Recommend — best draft and γ, exports"),
    ("Endpoints", "Endpoints — tune a running vLLM, SGLang or llama.cpp server"),
    ("Policies", "Policies — adaptive drafting policies against the best fixed γ"),
    ("Watch", "Watch — is speculation still paying in a running deployment?"),
):
    st.page_link(common.PAGES[page], label=label, icon=common.ICONS[page])

st.divider()
st.caption(
    "Typical flow: import a prompt set that looks like your traffic → start a session with a few drafts and γ values "
    "→ read the measured speedup next to the prediction → check the Theory page for your regime → Recommend and "
    "export: the draft and γ to serve with, as a configuration for your server."
)
