"""Altair charts for the pages: built from DataFrames, never from model objects."""

from __future__ import annotations

import altair as alt
import pandas as pd

HEIGHT = 240


def bar_counts(frame: pd.DataFrame, x: str, y: str, title: str = "") -> alt.Chart:
    return (
        alt.Chart(frame, title=title, height=HEIGHT)
        .mark_bar()
        .encode(
            x=alt.X(f"{x}:N", sort="-y", title=x, axis=alt.Axis(labelAngle=-30, labelLimit=160)),
            y=alt.Y(f"{y}:Q", title=y, axis=alt.Axis(tickMinStep=1)),
            tooltip=[x, y],
        )
    )


def histogram(values: pd.DataFrame, field: str, title: str = "", maxbins: int = 30) -> alt.Chart:
    return (
        alt.Chart(values, title=title, height=HEIGHT)
        .mark_bar()
        .encode(
            x=alt.X(f"{field}:Q", bin=alt.Bin(maxbins=maxbins), title=field),
            y=alt.Y("count():Q", title="prompts", axis=alt.Axis(tickMinStep=1, format="d")),
            tooltip=[alt.Tooltip(f"{field}:Q", bin=alt.Bin(maxbins=maxbins)), "count():Q"],
        )
    )


def acceptance_by_position(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(
            frame,
            title=alt.Title(
                "Acceptance by draft position",
                subtitle="conditional: accepted at p ÷ drafts that reached p (the draft acceptance rate beside it is "
                "accepted ÷ all draft tokens)",
            ),
            height=HEIGHT,
        )
        .mark_bar()
        .encode(
            x=alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("rate:Q", title="acceptance rate", scale=alt.Scale(domain=[0, 1])),
            tooltip=["position", alt.Tooltip("rate:Q", format=".3f"), "evaluated"],
        )
    )


def utilisation(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame, title="Utilisation over time", height=HEIGHT)
        .mark_line(point=False)
        .encode(
            x=alt.X("seconds:Q", title="seconds since first sample"),
            y=alt.Y("value:Q", title="%", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("metric:N", title=None),
            tooltip=["metric", alt.Tooltip("seconds:Q", format=".1f"), alt.Tooltip("value:Q", format=".1f")],
        )
    )


def speedup_grouped(frame: pd.DataFrame, group: str = "which") -> alt.LayerChart:
    """Grouped horizontal bars: one row per configuration, bars offset and coloured by ``group``
    (measured/predicted, session, category); a dashed rule at 1× (the target alone). Horizontal so that
    long configuration names stay readable; the height grows with the rows (a step per bar); no chart
    title (the page labels it above the chart). Rows with ``lo``/``hi`` columns (the min and max of the
    per-prompt speedups) get an error bar from lo to hi over their bar."""
    base = alt.Chart(frame)
    y = alt.Y("config:N", title=None, sort=None, axis=alt.Axis(labelLimit=320))
    spread = {"lo", "hi"} <= set(frame.columns) and frame["lo"].notna().any()
    tooltip = ["config", group, alt.Tooltip("speedup:Q", format=".2f")]
    if spread:
        tooltip += [
            alt.Tooltip("lo:Q", format=".2f", title="lowest prompt"),
            alt.Tooltip("hi:Q", format=".2f", title="highest prompt"),
        ]
    bars = base.mark_bar().encode(
        y=y,
        yOffset=alt.YOffset(f"{group}:N"),
        x=alt.X("speedup:Q", title="speedup vs target alone (×)"),
        color=alt.Color(f"{group}:N", title=group),
        tooltip=tooltip,
    )
    one = base.mark_rule(strokeDash=[4, 4], color="gray").encode(x=alt.datum(1.0))
    layers: list[alt.Chart] = [bars, one]
    if spread:
        layers.append(
            base.transform_filter("isValid(datum.lo) && isValid(datum.hi)")
            .mark_errorbar(ticks=True, color="black")
            .encode(
                y=y,
                yOffset=alt.YOffset(f"{group}:N"),
                x=alt.X("lo:Q", title="speedup vs target alone (×)"),
                x2="hi:Q",
                tooltip=tooltip,
            )
        )
    return alt.layer(*layers).properties(height=alt.Step(12))


def vega_spec(chart: alt.TopLevelMixin) -> dict:
    """The chart as the Vega-Lite spec st.altair_chart would send (data as Arrow), built once so that a live
    view can send it again with st.vega_lite_chart(spec=copy.deepcopy(spec)) without converting it again."""
    try:  # Streamlit's own conversion: the same spec and data transport as st.altair_chart
        from streamlit.elements.vega_charts import _convert_altair_to_vega_lite_spec
    except ImportError:  # a Streamlit without it: plain Altair (data inline)
        return chart.to_dict()
    return _convert_altair_to_vega_lite_spec(chart)


def theory_curves(curve: pd.DataFrame, crossover: int | None, gamma: int) -> alt.LayerChart:
    """Speedup and ops multiplier vs γ; the crossover (ops overtakes speed) and the chosen γ as rules."""
    long = curve.melt(id_vars=["γ"], value_vars=["speedup", "ops multiplier"], var_name="quantity", value_name="×")
    lines = (
        alt.Chart(long, height=320)
        .mark_line(point=True)
        .encode(
            x=alt.X("γ:Q", title="γ (draft tokens per target call)"),
            y=alt.Y("×:Q", title="multiple of the target alone (×)"),
            color=alt.Color("quantity:N", title=None),
            tooltip=["γ", "quantity", alt.Tooltip("×:Q", format=".3f")],
        )
    )
    layers: list[alt.Chart] = [lines]
    chosen = pd.DataFrame({"γ": [gamma], "label": [f"chosen γ={gamma}"]})
    layers.append(alt.Chart(chosen).mark_rule(color="gray", strokeDash=[2, 2]).encode(x="γ:Q", tooltip=["label"]))
    if crossover is not None:
        layers += labelled_rule("γ", crossover, f"crossover γ={crossover}")
    return alt.layer(*layers)


def labelled_rule(
    field: str, value: float, label: str, color: str = "red", label_y: int = 4, at_right_end: bool = False
) -> list[alt.Chart]:
    """A vertical rule at `value` on the x field, with its label written beside it at the top: to its right, or
    to its left where the rule stands at the right end of the axis (the label would run under the legend)."""
    frame = pd.DataFrame({field: [value], "label": [label]})
    rule = alt.Chart(frame).mark_rule(color=color, strokeWidth=2).encode(x=f"{field}:Q", tooltip=["label"])
    align, dx = ("right", -4) if at_right_end else ("left", 4)
    text = (
        alt.Chart(frame)
        .mark_text(align=align, baseline="top", dx=dx, color=color)
        .encode(x=f"{field}:Q", y=alt.value(label_y), text="label:N")
    )
    return [rule, text]


def in_last_doubling(value: float, values: pd.Series) -> bool:
    """Whether `value` lies in the last doubling of a log₂ axis over `values` (its label would reach the edge)."""
    return not values.empty and value * 2 > float(values.max())


def batch_sweep(frame: pd.DataFrame, knee: int | None, serving_batch: int | None) -> alt.LayerChart:
    """Decode step time and time per row vs batch size (log-log): flat step time = memory-bound; the knee
    (first batch where step time grows about linearly) as a red rule, the serving batch as a grey dashed one."""
    lines = (
        alt.Chart(frame, height=HEIGHT)
        .mark_line(point=True)
        .encode(
            x=alt.X("batch:Q", title="batch size (rows per decode step)", scale=alt.Scale(type="log", base=2)),
            y=alt.Y("ms:Q", title="milliseconds", scale=alt.Scale(type="log")),
            color=alt.Color("quantity:N", title=None),
            tooltip=["batch", "quantity", alt.Tooltip("ms:Q", format=".3f")],
        )
    )
    layers: list[alt.Chart] = [lines]
    if serving_batch is not None:
        serving = pd.DataFrame({"batch": [serving_batch], "label": [f"serving batch {serving_batch}"]})
        layers.append(
            alt.Chart(serving).mark_rule(color="gray", strokeDash=[4, 4]).encode(x="batch:Q", tooltip=["label"])
        )
    if knee is not None:
        edge = in_last_doubling(knee, frame["batch"])
        layers += labelled_rule("batch", knee, f"knee: batch {knee}", at_right_end=edge)
    return alt.layer(*layers)


def verify_cost(frame: pd.DataFrame) -> alt.Chart:
    """Measured v(k) against the free (v = 1) and fully billed (v = k) references (dashed)."""
    return (
        alt.Chart(frame, height=HEIGHT)
        .mark_line(point=True)
        .encode(
            x=alt.X("k:Q", title="k (tokens scored in one target forward)", axis=alt.Axis(tickMinStep=1)),
            y=alt.Y("v:Q", title="v(k) in 1-token steps"),
            color=alt.Color(
                "curve:N",
                title=None,
                sort=None,
                scale=alt.Scale(
                    domain=["measured", "free: v = 1", "billed: v = k"],
                    range=["#1f77b4", "#2ca02c", "#d62728"],
                ),
            ),
            strokeDash=alt.condition(alt.datum.curve == "measured", alt.value([1, 0]), alt.value([4, 4])),
            tooltip=["curve", "k", alt.Tooltip("v:Q", format=".3f")],
        )
    )


def recommend_curve(
    lines: pd.DataFrame, measured: pd.DataFrame, recommended: int | None, crossover: int | None
) -> alt.LayerChart:
    """Predicted speedup and ops multiplier vs γ for one draft; measured speedups as points; the recommended γ
    as a green rule and the crossover as a red one; a dashed rule at 1× (the target alone)."""
    layers: list[alt.Chart] = [
        alt.Chart(lines, height=320)
        .mark_line(point=True)
        .encode(
            x=alt.X("γ:Q", title="γ (draft tokens per target call)"),
            y=alt.Y("×:Q", title="multiple of the target alone (×)"),
            color=alt.Color("quantity:N", title=None),
            tooltip=["γ", "quantity", alt.Tooltip("×:Q", format=".3f")],
        ),
        alt.Chart(pd.DataFrame({"×": [1.0]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="×:Q"),
    ]
    if not measured.empty:
        layers.append(
            alt.Chart(measured)
            .mark_point(shape="diamond", size=140, filled=True, color="black")
            .encode(x="γ:Q", y="×:Q", tooltip=["γ", "quantity", alt.Tooltip("×:Q", format=".3f")])
        )
    marks = ((recommended, "green", "recommended γ={}", 4), (crossover, "red", "crossover γ={}", 20))
    for gamma, colour, text, y in marks:
        if gamma is None:
            continue
        layers += labelled_rule("γ", gamma, text.format(gamma), colour, label_y=y)
    return alt.layer(*layers)


def versus_concurrency(
    frame: pd.DataFrame, y_title: str, title: str = "", rule_at: float | None = None, flip: int | None = None
) -> alt.LayerChart:
    """Endpoint metrics against concurrency (log₂ axis). Measured points are filled on solid lines, predicted
    ones hollow on dashed lines; `rule_at` draws a dashed level (1× for a speedup), `flip` a red rule at the
    concurrency where speculation stopped paying (measured)."""
    base = alt.Chart(frame, height=HEIGHT)
    x = alt.X(
        "concurrency:Q",
        title="concurrency (requests in flight)",
        scale=alt.Scale(type="log", base=2),
        axis=integer_ticks(frame["concurrency"]),
    )
    tooltip = ["series:N", "kind:N", "concurrency:Q", alt.Tooltip("value:Q", format=".4g")]
    measured = base.transform_filter(alt.datum.kind == "measured").mark_line(
        point=alt.OverlayMarkDef(filled=True, size=60)
    )
    predicted = base.transform_filter(alt.datum.kind == "predicted").mark_line(
        strokeDash=[5, 4], point=alt.OverlayMarkDef(filled=False, size=70)
    )
    encode = {
        "x": x,
        "y": alt.Y("value:Q", title=y_title),
        "color": alt.Color("series:N", title=None),
        "tooltip": tooltip,
    }
    layers: list[alt.Chart] = [measured.encode(**encode), predicted.encode(**encode)]
    if rule_at is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"value": [rule_at]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="value:Q")
        )
    if flip is not None:
        layers += labelled_rule(
            "concurrency",
            flip,
            f"stops paying at {flip} (measured)",
            at_right_end=in_last_doubling(flip, frame["concurrency"]),
        )
    return alt.layer(*layers).properties(title=title)


def integer_ticks(levels: pd.Series) -> alt.Axis:
    """An axis ticked only at the levels measured, written as whole numbers: concurrency is an integer, and a
    log axis left to itself ticks 1.1, 1.2, … between 1 and 2."""
    values = sorted({int(v) for v in pd.to_numeric(levels, errors="coerce").dropna()})
    return alt.Axis(values=values, format="d") if values else alt.Axis(format="d", tickMinStep=1)


def concurrency_surface(surface: pd.DataFrame) -> alt.LayerChart:
    """The γ × concurrency speedup surface of a session measured at several levels (vLLM): speedup
    against concurrency (log-2 axis), one line per configuration and γ, a dashed rule at 1× where speculation
    stops paying."""
    frame = surface.assign(series=[f"{c} γ={g}" for c, g in zip(surface["configuration"], surface["γ"], strict=True)])
    base = alt.Chart(frame)
    lines = base.mark_line(point=True).encode(
        x=alt.X(
            "concurrency:Q",
            scale=alt.Scale(type="log", base=2),
            title="requests in flight",
            axis=integer_ticks(frame["concurrency"]),
        ),
        y=alt.Y("speedup:Q", title="speedup vs target alone at the same level (×)"),
        color=alt.Color("series:N", title="configuration"),
        tooltip=["series", "concurrency", alt.Tooltip("speedup:Q", format=".2f"), "verdict"],
    )
    one = base.mark_rule(strokeDash=[4, 4], color="gray").encode(y=alt.datum(1.0))
    return alt.layer(lines, one)


WATCH_PANELS = (
    ("predicted_speedup", "predicted speedup (×)"),
    ("mean_acceptance_length", "mean acceptance length"),
    ("requests_running", "requests running"),
)
VERDICT_COLOURS = {"paying": "#2ca02c", "below 1×": "#ff7f0e", "traffic drifted": "#bcbd22",
                   "costing you": "#d62728", "acceptance collapsed": "#8c564b"}  # fmt: skip


def watch_timeline(frame: pd.DataFrame) -> alt.VConcatChart:
    """A watched deployment over time, one panel each for the predicted speedup (a dashed rule at 1×), the mean
    acceptance length and the requests running, sharing the time axis, under a strip of every window's verdict or
    state (a window the source was down for has no figures, but its tick); each point has its verdict's colour."""
    verdicts = list(dict.fromkeys(frame["verdict"]))
    colour = alt.Color(
        "verdict:N",
        title="verdict",
        scale=alt.Scale(domain=verdicts, range=[VERDICT_COLOURS.get(v, "#7f7f7f") for v in verdicts]),
    )
    time_axis = alt.Axis(format="%H:%M:%S", labelOverlap=True)  # a window ends on whole seconds, never on .500
    strip = (
        alt.Chart(frame, height=28, title="every window's verdict or state")
        .mark_tick(thickness=4, size=22)
        .encode(x=alt.X("ended:T", title=None, axis=time_axis), color=colour, tooltip=["ended:T", "verdict:N"])
    )
    panels: list[alt.TopLevelMixin] = [strip]
    for field, title in WATCH_PANELS:
        base = alt.Chart(frame, height=HEIGHT // 2).encode(
            x=alt.X("ended:T", title="window end", axis=time_axis),
            y=alt.Y(f"{field}:Q", title=title, scale=alt.Scale(zero=False), axis=alt.Axis(format=".3~g")),
            tooltip=["ended:T", "verdict:N", alt.Tooltip(f"{field}:Q", format=".3g")],
        )
        layers: list[alt.Chart] = [
            base.mark_line(color="#999999"),
            base.mark_point(filled=True, size=50).encode(color=colour),
        ]
        if field == "predicted_speedup":
            layers.append(
                alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q")
            )
        panels.append(alt.layer(*layers))
    return alt.vconcat(*panels).resolve_scale(x="shared")
