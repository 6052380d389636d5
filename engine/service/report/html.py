"""HTML pieces of the shareable session report: one document, its style inline, every text escaped here.

Callers pass plain strings (names, model references, prompts may be anything a user typed); these functions
escape them. Only `Html` values (markup made by these functions or by engine.service.report.svg) pass through.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any


class Html(str):
    """Markup that is already safe: built here from escaped text, or an SVG chart."""


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; margin: 0;
       background: #f6f7f9; line-height: 1.45; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 1.6em; margin: 0 0 4px; } h2 { font-size: 1.25em; margin: 28px 0 8px; padding-top: 8px;
     border-top: 2px solid #e6e8eb; } h3 { font-size: 1.05em; margin: 18px 0 6px; }
.sub { color: #666; margin: 0 0 12px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 0.82em; }
th, td { border: 1px solid #dde0e4; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.facts th { width: 180px; }
.banner { padding: 10px 14px; border-radius: 6px; margin: 10px 0; font-size: 1.05em; }
.on { background: #e7f6ea; border: 1px solid #9fd8ab; } .off { background: #fdf1e1; border: 1px solid #f0c27a; }
.warn { background: #fff6e0; border-left: 4px solid #e0a800; padding: 6px 10px; margin: 6px 0; }
.error { background: #fdecec; border-left: 4px solid #d62728; padding: 6px 10px; margin: 6px 0; }
.info { background: #eef4fb; border-left: 4px solid #4a78b5; padding: 6px 10px; margin: 6px 0; }
.flag { color: #b71c1c; } .muted { color: #666; font-size: 0.9em; }
pre { background: #f4f5f7; border: 1px solid #dde0e4; padding: 10px; overflow-x: auto; font-size: 0.82em;
      white-space: pre-wrap; word-break: break-word; }
svg { display: block; max-width: 100%; height: auto; margin: 8px 0 14px; }
details summary { cursor: pointer; } .scroll { overflow-x: auto; max-width: 100%; }
"""


def text(value: Any) -> Html:
    return Html(escape("—" if value is None or value == "" else str(value)))


def tag(name: str, content: Any, cls: str | None = None, **attrs: str) -> Html:
    """<name class=…>content</name>; content is escaped unless it is Html; a list is joined."""
    if isinstance(content, list | tuple):
        inner = "".join(c if isinstance(c, Html) else text(c) for c in content)
    else:
        inner = content if isinstance(content, Html) else text(content)
    extra = "".join(f' {k.rstrip("_")}="{escape(v)}"' for k, v in attrs.items())
    klass = f' class="{escape(cls)}"' if cls else ""
    return Html(f"<{name}{klass}{extra}>{inner}</{name}>")


def number(value: Any, fmt: str) -> str:
    """`fmt` applied to a finite number ("%.2f×"), "—" for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "—"
    return fmt % value


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[str] = ()) -> Html:
    """A table; cells in a `numeric` column are right-aligned. A cell may be Html."""
    right = set(numeric)
    head = "".join(tag("th", h) for h in headers)
    body = []
    for row in rows:
        cells = [tag("td", cell, "num" if h in right else None) for h, cell in zip(headers, row, strict=True)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return Html(
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
    )


def facts(pairs: Iterable[tuple[str, Any]]) -> Html:
    """A two-column label → value table."""
    rows = "".join(f"<tr>{tag('th', label)}{tag('td', value)}</tr>" for label, value in pairs)
    return Html(f'<table class="facts"><tbody>{rows}</tbody></table>')


def bullets(lines: Iterable[Any]) -> Html:
    items = [tag("li", line) for line in lines]
    return Html(f"<ul>{''.join(items)}</ul>") if items else Html("")


def note(message: Any, kind: str = "warn") -> Html:
    return tag("div", message, kind)


def section(anchor: str, title: str, parts: Iterable[Html]) -> Html:
    return Html(f'<section id="{escape(anchor)}">{tag("h2", title)}{"".join(parts)}</section>')


def document(title: str, subtitle: str, sections: Iterable[Html]) -> str:
    """The whole report: no script, no external resource, its style inline."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body><main>"
        f"{tag('h1', title)}{tag('p', subtitle, 'sub')}{''.join(sections)}</main></body></html>\n"
    )
