"""One record (a JSON value or a CSV row) to a Prompt: field lookup, chat layouts, cleaning, dedupe, unique ids."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from engine.prompts.model import Issues, Prompt, one_line, plural

MAX_LABEL_CHARS = 200  # category and id columns in the store are String(200)
PROMPT_FIELDS = ("prompt", "text", "turns", "messages", "conversations")
ID_FIELDS = ("question_id", "id", "prompt_id")

_NO_FIELD = "no 'prompt', 'text', 'turns', 'messages' or 'conversations' field"
_SURROGATES = re.compile("[\ud800-\udfff]")


class Builder:
    """Turns raw records into Prompts: cleans, enforces limits, dedupes and hands out unique ids."""

    def __init__(self, issues: Issues, max_prompt_chars: int) -> None:
        self.issues = issues
        self.max_chars = max_prompt_chars
        self.prompts: list[Prompt] = []
        self.seen: set[str] = set()
        self.ids: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.duplicates = 0
        self.kinds: Counter[str] = Counter()

    def add(self, line: int, text: str, category: str | None = None, rid: str | None = None, kind: str = "") -> None:
        cleaned = self._clean(line, text)
        if cleaned is None:
            return
        if cleaned in self.seen:
            self.duplicates += 1
            return
        self.seen.add(cleaned)
        self.prompts.append(Prompt(cleaned, category, line, self._unique_id(line, rid)))
        self.kinds[kind] += 1

    def _clean(self, line: int, text: str) -> str | None:
        if "\x00" in text:
            self.issues.add(line, f"removed {plural(text.count(chr(0)), 'NUL character')} from the prompt")
            text = text.replace("\x00", "")
        if _SURROGATES.search(text):
            self.issues.add(line, "replaced unpaired surrogate characters (invalid Unicode) with U+FFFD")
            text = _SURROGATES.sub("\ufffd", text)
        text = text.strip().strip("\ufeff").strip()
        if not text:
            self.issues.add(line, "prompt is empty")
            return None
        if len(text) > self.max_chars:
            self.issues.add(line, f"prompt is {len(text):,} characters; the limit is {self.max_chars:,}")
            return None
        return text

    def _unique_id(self, line: int, rid: str | None) -> str:
        base = rid or f"line{line}"
        if base not in self.ids:
            self.ids.add(base)
            return base
        n = self.next_suffix.get(base, 2)
        while f"{base}-{n}" in self.ids:
            n += 1
        self.next_suffix[base] = n + 1
        pid = f"{base}-{n}"
        self.ids.add(pid)
        if rid:
            self.issues.add(line, f"id {rid!r} is used more than once; renamed to {pid!r}")
        return pid

    def record(self, line: int, obj: Any) -> None:
        """Import one JSON value (a line of JSONL or an element of a JSON array)."""
        if isinstance(obj, str):
            self.add(line, obj)
            return
        if not isinstance(obj, dict):
            self.issues.add(line, f"expected a JSON object with a 'prompt' field, got {_json_type(obj)}")
            return
        fields = {str(k).lower(): v for k, v in obj.items()}
        text, kind, error = _extract(fields)
        if text is None:
            self.issues.add(line, error)
            return
        rid = next((r for r in (label(fields.get(f)) for f in ID_FIELDS) if r), None)
        self.add(line, text, label(fields.get("category")), rid, kind)

    def json_line(self, line: int, raw: str) -> None:
        """Parse and import one JSONL line; a bad line becomes an issue naming the column."""
        stripped = raw.strip().lstrip("\ufeff")
        if not stripped:
            return
        indent = len(raw) - len(raw.lstrip())
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as e:
            self.issues.add(line, f"not valid JSON ({e.msg} at column {e.colno + indent})")
            return
        except RecursionError:
            self.issues.add(line, "JSON is nested too deeply")
            return
        except ValueError as e:  # e.g. an integer with more digits than Python converts
            self.issues.add(line, f"not valid JSON ({e})")
            return
        self.record(line, obj)

    def style(self) -> str:
        """The dominant record layout, used as the format suffix."""
        if not self.kinds:
            return ""
        kind = self.kinds.most_common(1)[0][0]
        return f"-{kind}" if kind else ""


def _extract(fields: dict[str, Any]) -> tuple[str | None, str, str]:
    """Find the prompt text in a record: (text, layout kind, error message when text is None)."""
    first_error = ""
    for name in PROMPT_FIELDS:
        if name not in fields or fields[name] is None:
            continue
        value = fields[name]
        text: str | None = None
        error = ""
        if name in ("prompt", "text"):
            if isinstance(value, str):
                text = value
            else:
                error = f"'{name}' is {_json_type(value)}, not a string"
        elif name == "turns":
            if not isinstance(value, list) or not value:
                error = f"'turns' is {_json_type(value)}; expected a non-empty list of strings"
            elif isinstance(value[0], str):
                text = value[0]
            else:
                error = f"the first turn is {_json_type(value[0])}, not a string"
        else:
            text, error = _from_chat(name, value)
        if text is not None:
            return text, "" if name in ("prompt", "text") else name, ""
        first_error = first_error or error
    return None, "", first_error or _NO_FIELD


def _from_chat(name: str, value: Any) -> tuple[str | None, str]:
    """The first user turn of an OpenAI `messages` or ShareGPT `conversations` list."""
    if not isinstance(value, list):
        return None, f"'{name}' is {_json_type(value)}, not a list"
    for message in value:
        if not isinstance(message, dict):
            continue
        m = {str(k).lower(): v for k, v in message.items()}
        role = m.get("role", m.get("from"))
        if not isinstance(role, str) or role.strip().lower() not in ("user", "human"):
            continue
        content = m["content"] if m.get("content") is not None else m.get("value")
        text = _content_text(content)
        if text is None:
            return None, f"the first user message in '{name}' has no text"
        return text, ""
    return None, f"no user message in '{name}'"


def _content_text(content: Any) -> str | None:
    """Message content: a string, or a list of parts of which the text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return None
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "\n".join(parts) if parts else None


def label(value: Any) -> str | None:
    """A category or id value as a short one-line string (None when absent or not a scalar)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (str, int, float)):
        return None
    text = one_line(_SURROGATES.sub("\ufffd", str(value)).replace("\x00", ""))
    return text[:MAX_LABEL_CHARS] or None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return "an object"
