"""Which parser a file gets ("text", "csv", "jsonl" or "json"), from its extension and its first characters."""

from __future__ import annotations

import csv
import json
import re
from typing import Any

CSV_PROMPT_COLUMNS = ("prompt", "text", "question", "instruction", "input")
JSON_EXTENSIONS = (".json",)
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonlines")
CSV_EXTENSIONS = (".csv", ".tsv")

_JSON_ARRAY_START = re.compile(r'\[\s*(?:[{"]|$)')  # "[1] Write a poem" is a text prompt, not JSON


def _try_json(text: str) -> Any:
    """The parsed document, or None when the text is not one JSON value."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def csv_delimiter(first_line: str, ext: str) -> str | None:
    """The delimiter whose split of the header line names a prompt column (None: not a prompt CSV header)."""
    candidates = "\t" if ext == ".tsv" else ",;\t|"
    for delimiter in candidates:
        try:
            cells = next(csv.reader([first_line], delimiter=delimiter))
        except (csv.Error, StopIteration):
            continue
        names = [c.strip().lower() for c in cells]
        if any(n in CSV_PROMPT_COLUMNS for n in names) and (len(names) > 1 or ext in CSV_EXTENSIONS):
            return delimiter
    return None


def detect(text: str, ext: str) -> str:
    """Pick a parser from the extension and the first characters of the content."""
    if ext in CSV_EXTENSIONS:
        return "csv"
    stripped = text.lstrip()
    first_line = stripped.split("\n", 1)[0].strip()
    if stripped.startswith("["):
        if ext in JSON_EXTENSIONS + JSONL_EXTENSIONS or _JSON_ARRAY_START.match(first_line):
            return "json"
        if isinstance(_try_json(text), list):
            return "json"
    elif stripped.startswith("{"):
        if ext in JSON_EXTENSIONS:
            return "json"  # one object, or JSON Lines: parse_json tells them apart
        if _try_json(first_line) is not None:
            return "jsonl"
        if first_line == "{" or _try_json(text) is not None:
            return "json"  # a pretty-printed object
        if ext in JSONL_EXTENSIONS or any(
            _try_json(line.strip()) is not None for line in stripped.split("\n", 50)[:50]
        ):
            return "jsonl"  # JSON Lines whose first line is broken
        # otherwise a text prompt that happens to start with "{" (a template, a code snippet)
    if ext in JSON_EXTENSIONS + JSONL_EXTENSIONS:
        return "jsonl"
    if csv_delimiter(first_line, ext):
        return "csv"
    return "text"
