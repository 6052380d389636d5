"""Theory: the latency win (Thm 3.8) and the arithmetic bill (Thm 3.11) of Leviathan et al. (ICML 2023) side by side.

Every number comes from engine.analysis.theory; the tables are recomputed, not copied.
"""

import streamlit as st

from app import charts, common, components, theory_tables
from engine.service.api import crossover_gamma

common.page_setup("Theory")
st.title("Theory: speed vs arithmetic")
st.markdown(
    "A draft proposes γ tokens; the target accepts each with probability **α** and scores all γ+1 positions in one "
    "forward pass. **c** is a draft forward's *wall time* relative to the target's (what latency pays), **ĉ** its "
    "*arithmetic* relative to the target's (what a compute-bound server pays)."
)
st.caption(
    f"Theorem 3.8 (wall-time improvement), Theorem 3.11 (arithmetic operations) and the T5 measurements are from "
    f"{theory_tables.SOURCE}."
)

c1, c2, c3, c4 = st.columns(4)
alpha = c1.slider("α (acceptance)", 0.0, 0.99, 0.8, 0.01, key="th_alpha")
gamma = c2.slider("γ (draft tokens per call)", 1, 32, 7, 1, key="th_gamma")
c = c3.slider("c (draft wall-time ratio)", 0.0, 1.0, 0.05, 0.01, key="th_c")
c_hat = c4.slider("ĉ (draft arithmetic ratio)", 0.0, 1.0, 0.05, 0.01, key="th_chat")

with common.guard("compute the theory"):
    p = theory_tables.point(alpha, gamma, c, c_hat)
    cross = crossover_gamma(alpha, c, c_hat, theory_tables.MAX_GAMMA)
    m = st.columns(3)
    m[0].metric("Speedup (Thm 3.8)", f"{p['speedup']:.2f}×", help="(1 − α^(γ+1)) / ((1 − α)(γc + 1))")
    m[1].metric("Ops multiplier (Thm 3.11)", f"{p['ops multiplier']:.2f}×", help="(1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))")
    m[2].metric("Tokens per target call", f"{p['expected tokens per call']:.2f}", help="(1 − α^(γ+1)) / (1 − α)")
    m = st.columns(3)
    m[0].metric(
        "Cost/token, memory-bound",
        f"{theory_tables.pct_change(p['cost memory-bound'])}",
        help="Extra arithmetic runs in idle capacity: cost per token is multiplied by 1/speedup.",
    )
    m[1].metric(
        "Cost/token, compute-bound",
        f"{theory_tables.pct_change(p['cost compute-bound'])}",
        help="Extra arithmetic displaces real work: cost per token is multiplied by the ops multiplier.",
    )
    m[2].metric("Crossover γ", f"{cross}" if cross is not None else f"none ≤ {theory_tables.MAX_GAMMA}")
    if cross is None:
        st.success(f"No crossover up to γ={theory_tables.MAX_GAMMA}: the arithmetic never overtakes the speedup here.")
    elif gamma >= cross:
        st.warning(
            f"γ={gamma} is at or past the crossover γ={cross}: a compute-bound server burns arithmetic faster than it "
            "gains time. (Memory-bound? Ignore the crossover and optimise latency.)"
        )
    else:
        st.info(f"Crossover at γ={cross}: stay below it if you are compute-bound.")

    curve = theory_tables.curve(alpha, c, c_hat)
    st.altair_chart(charts.theory_curves(curve, cross, gamma), width="stretch")
    st.caption(
        "Red rule: the crossover γ, the smallest γ where the ops multiplier exceeds the speedup. "
        "Grey dashed rule: the γ chosen above. The ops multiplier is (γĉ + γ + 1) divided by the expected tokens "
        "per target call — you always pay for γ+1 positions but don't always get γ+1 tokens."
    )

st.divider()
st.subheader("Tables from Theorems 3.8 and 3.11, recomputed")
left, right = st.columns(2)
with left:
    st.markdown("**Latency vs arithmetic** (c = ĉ = 0, the paper's simplification)")
    components.reference_table(theory_tables.alpha_gamma_table())
    st.markdown("**Change in cost per token** (c = ĉ = 0)")
    components.reference_table(theory_tables.cost_table())
with right:
    st.markdown("**How far to speculate: the crossover** (c = ĉ = 0)")
    components.reference_table(theory_tables.crossover_table())
    st.markdown("**The paradox: the better draft is slower** (T5-XXL target, γ = 7, the paper's T5 drafts)")
    components.reference_table(theory_tables.paradox_table())
    st.caption(
        "T5-large has the best α and is the slowest, predicted and measured: not the best α wins, but the best "
        "balance of α and c."
    )
with st.expander("Tables with the c and ĉ chosen above"):
    components.reference_table(theory_tables.alpha_gamma_table(c, c_hat))
    components.reference_table(theory_tables.cost_table(c, c_hat))
    components.reference_table(theory_tables.crossover_table(c, c_hat))
