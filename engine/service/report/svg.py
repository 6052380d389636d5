"""Inline SVG charts for the shareable session report: drawn here, so the HTML needs nothing from a network.

Each function returns one `<svg>` element as a string; every piece of text in it is escaped. Values that are
None or not finite are left out of a chart, never drawn at zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="12"'
WIDTH = 880


@dataclass(frozen=True)
class Bar:
    """One bar of a horizontal bar chart: a value, optionally with the span it comes from (lo…hi)."""

    series: str
    value: float
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True)
class Series:
    """A named line (or, with `points_only`, a set of markers) of (x, y) points."""

    name: str
    points: Sequence[tuple[float, float]]
    points_only: bool = False
    dashed: bool = False
    colour: str | None = None  # None: the next of PALETTE


@dataclass
class Axis:
    """A linear scale from the data range [lo, hi] onto the pixel range [start, end]."""

    lo: float
    hi: float
    start: float
    end: float
    ticks: list[float] = field(default_factory=list)

    def __call__(self, value: float) -> float:
        span = self.hi - self.lo or 1.0
        return self.start + (value - self.lo) / span * (self.end - self.start)


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    return [round(first + i * step, 10) for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _svg(height: float, body: list[str], title: str) -> str:
    return (
        f'<svg role="img" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" {FONT}><title>{escape(title)}</title>' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {extra}>{escape(text)}</text>'


def _short(label: str, limit: int = 40) -> str:
    """The label, its middle cut out when too long (the ends tell configurations apart); the full one is its title."""
    if len(label) <= limit:
        return label
    head = (limit - 1) // 2
    return label[:head] + "…" + label[-(limit - 1 - head) :]


def _legend(names: Sequence[str], colours: dict[str, str], x0: float, y: float) -> tuple[list[str], float]:
    """Colour keys in a row, wrapped at the chart's width; returns them and the baseline of their last line."""
    out, x = [], x0
    for name in names:
        width = 24 + 7 * len(name)
        if x > x0 and x + width > WIDTH:
            x, y = x0, y + 16
        out.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{colours[name]}"/>')
        out.append(_text(x + 14, y, name))
        x += width
    return out, y


def bar_chart(rows: Sequence[tuple[str, Sequence[Bar]]], title: str, unit: str = "×", reference: float = 1.0) -> str:
    """Horizontal grouped bars, one group per labelled row, with lo–hi whiskers and a reference line."""
    rows = [(label, [b for b in bars if finite(b.value)]) for label, bars in rows]
    rows = [(label, bars) for label, bars in rows if bars]
    series = list(dict.fromkeys(b.series for _, bars in rows for b in bars))
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    values = [v for _, bars in rows for b in bars for v in (b.value, b.lo, b.hi) if finite(v)] + [reference, 0.0]
    legend, legend_y = _legend(series, colours, 8, 34)
    left, top, bar_h = 270.0, legend_y + 10, 12.0
    group_h = bar_h * max(len(series), 1) + 10
    axis = Axis(0.0, max(values) * 1.08, left, WIDTH - 20)
    axis.ticks = [t for t in nice_ticks(0.0, axis.hi) if t <= axis.hi]
    height = top + group_h * len(rows) + 30
    body = [_text(8, 16, title, extra='font-weight="bold"'), *legend]
    for tick in axis.ticks:
        x = axis(tick)
        body.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{height - 24:.1f}" stroke="#e5e5e5"/>')
        body.append(_text(x, height - 10, f"{tick:g}{unit}", "middle", 'fill="#555"'))
    for i, (label, bars) in enumerate(rows):
        y0 = top + 4 + i * group_h
        body.append(
            f'<text x="{left - 6:.1f}" y="{y0 + group_h / 2 - 2:.1f}" text-anchor="end">'
            f"<title>{escape(label)}</title>{escape(_short(label))}</text>"
        )
        for b in bars:
            y = y0 + series.index(b.series) * bar_h
            width = max(axis(b.value) - left, 0.5)
            tip = f"{label} — {b.series}: {b.value:.2f}{unit}" + (
                f" (span {b.lo:.2f}–{b.hi:.2f}{unit})" if finite(b.lo) and finite(b.hi) else ""
            )
            body.append(
                f'<rect x="{left:.1f}" y="{y:.1f}" width="{width:.1f}" height="{bar_h - 2:.1f}" '
                f'fill="{colours[b.series]}"><title>{escape(tip)}</title></rect>'
            )
            if finite(b.lo) and finite(b.hi):
                yc = y + (bar_h - 2) / 2
                body.append(
                    f'<line x1="{axis(b.lo):.1f}" y1="{yc:.1f}" x2="{axis(b.hi):.1f}" y2="{yc:.1f}" '
                    'stroke="#222" stroke-width="1.2"/>'
                )
            end = max(b.value, b.hi) if finite(b.hi) else b.value
            body.append(_text(axis(end) + 4, y + bar_h - 3, f"{b.value:.2f}{unit}", extra='font-size="10"'))
    ref = axis(reference)
    body.append(
        f'<line x1="{ref:.1f}" y1="{top:.1f}" x2="{ref:.1f}" y2="{height - 24:.1f}" stroke="#d62728" '
        'stroke-dasharray="4 3"/>'
    )
    return _svg(height, body, title)


def line_chart(
    series: Sequence[Series],
    title: str,
    x_label: str,
    y_label: str,
    mark_x: float | None = None,
    mark_label: str = "",
    reference: float | None = 1.0,
    y_unit: str = "",
    y_max: float | None = None,
) -> str:
    """Lines (and marker-only series) over a shared x axis; `mark_x` draws a labelled vertical marker; `y_max`
    fixes the top of the y axis (a rate: 1)."""
    series = [
        Series(
            s.name,
            [(x, y) for x, y in s.points if finite(x) and finite(y)],
            s.points_only,
            s.dashed,
            s.colour or PALETTE[i % len(PALETTE)],
        )
        for i, s in enumerate(series)
    ]
    series = [s for s in series if s.points]
    xs = [x for s in series for x, _ in s.points] or [0.0, 1.0]
    ys = [y for s in series for _, y in s.points] + ([reference] if reference is not None else []) or [0.0, 1.0]
    colours = {s.name: s.colour or PALETTE[0] for s in series}
    legend, legend_y = _legend([s.name for s in series], colours, 60, 34)
    left, right, top = 60.0, WIDTH - 20.0, legend_y + 14
    height = top + 276
    bottom = height - 44
    x_axis = Axis(min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1, left, right)
    y_ticks = nice_ticks(min(0.0, min(ys)), y_max if y_max is not None else max(ys) * 1.05)
    y_axis = Axis(y_ticks[0], y_ticks[-1], bottom, top)
    body = [_text(8, 16, title, extra='font-weight="bold"'), *legend]
    for tick in y_ticks:
        y = y_axis(tick)
        body.append(f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        body.append(_text(left - 6, y + 4, f"{tick:g}{y_unit}", "end", 'fill="#555"'))
    for tick in _x_ticks(x_axis.lo, x_axis.hi):
        body.append(_text(x_axis(tick), bottom + 16, f"{tick:g}", "middle", 'fill="#555"'))
    body.append(_text((left + right) / 2, height - 8, x_label, "middle"))
    middle = (top + bottom) / 2
    body.append(_text(14, middle, y_label, "middle", f'transform="rotate(-90 14 {middle:.1f})"'))
    if reference is not None and y_axis.lo <= reference <= y_axis.hi:
        y = y_axis(reference)
        body.append(
            f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#999" stroke-dasharray="4 3"/>'
        )
    if mark_x is not None and finite(mark_x):
        x = x_axis(mark_x)
        body.append(
            f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#2ca02c" stroke-width="2"/>'
        )
        body.append(_text(x + 4, top + 12, mark_label, extra='fill="#2ca02c" font-weight="bold"'))
    for s in series:
        body.extend(_draw_series(s, colours[s.name], x_axis, y_axis))
    return _svg(height, body, title)


def _x_ticks(lo: float, hi: float) -> list[float]:
    if hi - lo <= 16 and float(lo).is_integer():
        return [float(x) for x in range(int(lo), int(hi) + 1)]
    return [t for t in nice_ticks(lo, hi, 8) if lo <= t <= hi]


def _draw_series(s: Series, colour: str, x_axis: Axis, y_axis: Axis) -> list[str]:
    coords = [(x_axis(x), y_axis(y), x, y) for x, y in s.points]
    out = []
    if not s.points_only and len(coords) > 1:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in coords)
        dash = ' stroke-dasharray="5 4"' if s.dashed else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
    radius = 5 if s.points_only else 3
    for px, py, x, y in coords:
        out.append(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{radius}" fill="{colour}" stroke="#fff">'
            f"<title>{escape(f'{s.name}: {x:g} → {y:.3g}')}</title></circle>"
        )
    return out
