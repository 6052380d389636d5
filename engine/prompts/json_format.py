"""JSON Lines and whole-file JSON (an array element by element, so each record keeps its line; or one object)."""

from __future__ import annotations

import bisect
import json
import re
from typing import Any

from engine.prompts.model import Issues
from engine.prompts.records import Builder

_JSON_WS = re.compile(r"[ \t\n\r]*")


def _ws_end(text: str, pos: int) -> int:
    """The position after the JSON whitespace that starts at pos."""
    match = _JSON_WS.match(text, pos)
    return match.end() if match else pos


def parse_jsonl(lines: list[str], builder: Builder) -> None:
    for number, line in enumerate(lines, 1):
        builder.json_line(number, line)


def _salvage(lines: list[str], after: int, builder: Builder) -> None:
    """After a syntax error in a JSON array, keep the records that sit one per line further down."""
    for number in range(after + 1, len(lines) + 1):
        s = lines[number - 1].strip().lstrip("[").rstrip(",]").strip()
        if s.startswith("{") and s.endswith("}"):
            builder.json_line(number, s)


def parse_json(text: str, builder: Builder, issues: Issues) -> str:
    """A whole-file JSON array (element by element, so each keeps its line) or object; returns the format used."""
    lines = text.split("\n")
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", text))

    def line_of(pos: int) -> int:
        return bisect.bisect_right(starts, pos)

    decoder = json.JSONDecoder()
    pos = _ws_end(text, 0)

    def decode_at(at: int) -> tuple[Any, int] | None:
        try:
            return decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            bad = e.lineno
            issues.add(bad, f"not valid JSON ({e.msg} at column {e.colno})")
        except RecursionError:
            bad = line_of(at)
            issues.add(bad, "JSON is nested too deeply")
        except ValueError as e:
            bad = line_of(at)
            issues.add(bad, f"not valid JSON ({e})")
        _salvage(lines, bad, builder)
        return None

    try:
        _, end = decoder.raw_decode(text, pos)
    except (ValueError, RecursionError):
        end = None
    if end is not None and "\n" not in text[pos:end] and _ws_end(text, end) < len(text):
        parse_jsonl(lines, builder)  # a one-line value with more after it: JSON Lines after all
        return "jsonl"
    if not text.startswith("[", pos):
        decoded = decode_at(pos)
        if decoded is not None:
            builder.record(line_of(pos), decoded[0])
            if _ws_end(text, decoded[1]) < len(text):
                issues.add(line_of(_ws_end(text, decoded[1])), "text after the end of the JSON object was ignored")
        return "json"
    pos = _ws_end(text, pos + 1)
    if text.startswith("]", pos):
        issues.add(line_of(pos), "the JSON array is empty")
        return "json"
    while True:
        decoded = decode_at(pos)
        if decoded is None:
            return "json"
        builder.record(line_of(pos), decoded[0])
        pos = _ws_end(text, decoded[1])
        if text.startswith(",", pos):
            pos = _ws_end(text, pos + 1)
            if not text.startswith("]", pos):  # a trailing comma before ']' is tolerated
                continue
        if text.startswith("]", pos):
            rest = _ws_end(text, pos + 1)
            if rest < len(text):
                issues.add(line_of(rest), "text after the end of the JSON array was ignored")
            return "json"
        bad = line_of(pos)
        if pos >= len(text):
            issues.add(bad, "not valid JSON (the array is not closed with ']')")
        else:
            issues.add(bad, f"not valid JSON (Expecting ',' delimiter at column {pos - starts[bad - 1] + 1})")
            _salvage(lines, bad, builder)
        return "json"
