"""Parse prompt samples uploaded from real traffic into Prompts, with line-level diagnostics.

Uploads come from many tools (log exports, Spec-Bench / MT-bench files, chat transcripts, spreadsheets), so the parser
guesses the encoding and the format, imports every good line and reports every bad one by its line number instead of
rejecting the whole file. Only a file that cannot be read at all raises PromptFileError.

ParseResult.format is one of "text", "csv", "jsonl" or "json" (a whole-file array or object). The JSON formats get a
suffix when most records use a chat or benchmark layout: "-turns" (MT-bench / Spec-Bench), "-messages" (OpenAI) or
"-conversations" (ShareGPT), e.g. "jsonl-turns".
"""

from __future__ import annotations

import bisect
import codecs
import csv
import io
import json
import os
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import PromptFileError

__all__ = [
    "MAX_ISSUES",
    "MAX_PROMPT_CHARS",
    "MAX_UPLOAD_BYTES",
    "ParseIssue",
    "ParseResult",
    "Prompt",
    "check_prompt_lengths",
    "load_prompt_file",
    "parse_prompt_bytes",
    "summarise",
]

MB = 1024 * 1024
MAX_UPLOAD_BYTES = 10 * MB  # a few thousand prompts; larger files are logs, not samples
MAX_PROMPT_CHARS = 100_000  # far beyond any context the dashboard can decode; longer "prompts" are pasted documents
MAX_ISSUES = 200  # beyond this the UI list is noise; the rest are counted in one final issue
MAX_LABEL_CHARS = 200  # category and id columns in the store are String(200)
HEAD_BYTES = 8192  # how much of the file the binary sniffing looks at

PROMPT_FIELDS = ("prompt", "text", "turns", "messages", "conversations")
ID_FIELDS = ("question_id", "id", "prompt_id")
CSV_PROMPT_COLUMNS = ("prompt", "text", "question", "instruction", "input")
CSV_ID_COLUMNS = ("question_id", "id", "prompt_id")
JSON_EXTENSIONS = (".json",)
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonlines")
CSV_EXTENSIONS = (".csv", ".tsv")

_NO_FIELD = "no 'prompt', 'text', 'turns', 'messages' or 'conversations' field"
_NEWLINES_B = re.compile(rb"\r\n|\r|\n")
_SURROGATES = re.compile("[\ud800-\udfff]")
_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_ARRAY_START = re.compile(r'\[\s*(?:[{"]|$)')  # "[1] Write a poem" is a text prompt, not JSON
_CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\t\n\x0b\x0c\r\x1b")
_MAGIC = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (Excel and Word files are ZIP archives: save it as CSV or text)"),
    (b"\xd0\xcf\x11\xe0", "an Office document (save it as CSV or text)"),
    (b"\x1f\x8b", "a gzip archive (decompress it first)"),
    (b"\xfd7zXZ\x00", "an xz archive (decompress it first)"),
    (b"7z\xbc\xaf", "a 7z archive (decompress it first)"),
    (b"\x7fELF", "an executable"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)


@dataclass
class Prompt:
    """One prompt to decode; source_line points the user back at the line it came from."""

    text: str
    category: str | None
    source_line: int
    prompt_id: str


@dataclass
class ParseIssue:
    """A problem with one line (line set) or with the whole file (line None) that did not stop the import."""

    line: int | None
    message: str

    def __str__(self) -> str:
        return self.message if self.line is None else f"line {self.line}: {self.message}"


@dataclass
class ParseResult:
    """The prompts that were imported, the issues met on the way and the format that was detected."""

    prompts: list[Prompt]
    issues: list[ParseIssue]
    format: str
    duplicates_removed: int


class _Issues:
    """Collects issues up to MAX_ISSUES, so a corrupt 10 MB file cannot flood the UI."""

    def __init__(self) -> None:
        self.items: list[ParseIssue] = []
        self.dropped = 0

    def add(self, line: int | None, message: str) -> None:
        if len(self.items) < MAX_ISSUES:
            self.items.append(ParseIssue(line, _one_line(message)))
        else:
            self.dropped += 1

    def first(self) -> str:
        return str(self.items[0]) if self.items else ""

    def count(self) -> int:
        return len(self.items) + self.dropped

    def result(self) -> list[ParseIssue]:
        out = list(self.items)
        if self.dropped:
            out.append(ParseIssue(None, f"{self.dropped:,} more issues not shown"))
        return out


class _Builder:
    """Turns raw records into Prompts: cleans, enforces limits, dedupes and hands out unique ids."""

    def __init__(self, issues: _Issues, max_prompt_chars: int) -> None:
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
            self.issues.add(line, f"removed {_plural(text.count(chr(0)), 'NUL character')} from the prompt")
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
        rid = next((r for r in (_label(fields.get(f)) for f in ID_FIELDS) if r), None)
        self.add(line, text, _label(fields.get("category")), rid, kind)

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


def _label(value: Any) -> str | None:
    """A category or id value as a short one-line string (None when absent or not a scalar)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (str, int, float)):
        return None
    text = _one_line(_SURROGATES.sub("\ufffd", str(value)).replace("\x00", ""))
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


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _format_size(n: int) -> str:
    if n < 1024:
        return _plural(n, "byte")
    value, unit = (n / MB, "MB") if n >= MB else (n / 1024, "KB")
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text} {unit}"


def _size_error(name: str, size: int, limit: int) -> PromptFileError:
    shown, limit_shown = _format_size(size), _format_size(limit)
    if shown == limit_shown:  # 10.01 MB against 10 MB would read "10 MB; the limit is 10 MB"
        shown, limit_shown = _plural(size, "byte"), _plural(limit, "byte")
    return PromptFileError(f"{name}: file is {shown}; the limit is {limit_shown}")


def _display_name(filename: str | os.PathLike[str] | None) -> str:
    name = os.path.basename(str(filename or ""))
    name = "".join(ch if ch.isprintable() else "?" for ch in name)[:120]
    return name or "upload"


# --- decoding ---------------------------------------------------------------------------------------------------


def _binary_kind(head: bytes) -> str | None:
    """What the head of the file looks like when it is not text (None when it may be text)."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if b"\x00\x00" in head:
        return "a binary file"
    suspicious = len(head) - len(head.translate(None, _CONTROL_BYTES))
    if suspicious > max(1, len(head) // 20):
        return "a binary file"
    return None


def _bomless_utf16(data: bytes) -> str | None:
    """The codec of UTF-16 text saved without a byte-order mark (mostly-ASCII text has every other byte zero)."""
    head = data[:HEAD_BYTES]
    if len(head) < 4 or len(data) % 2:
        return None
    even, odd = head[0::2], head[1::2]
    for zeros, others, codec in ((odd, even, "utf-16-le"), (even, odd, "utf-16-be")):
        if zeros.count(0) >= 0.9 * len(zeros) and others.count(0) <= 0.05 * len(others):
            return codec
    return None


def _decode_ascii_compatible(data: bytes, issues: _Issues) -> str:
    """UTF-8, falling back line by line to Windows-1252 (then Latin-1), so a mixed file keeps both kinds of lines."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    bad: list[int] = []
    used: set[str] = set()
    for number, raw in enumerate(_NEWLINES_B.split(data), 1):
        try:
            out.append(raw.decode("utf-8"))
            continue
        except UnicodeDecodeError:
            bad.append(number)
        try:
            out.append(raw.decode("cp1252"))
            used.add("Windows-1252")
        except UnicodeDecodeError:
            out.append(raw.decode("latin-1"))
            used.add("Latin-1")
    encodings = " or ".join(sorted(used, reverse=True))
    if len(bad) == 1:
        issues.add(bad[0], f"not valid UTF-8; read as {encodings} (check accented characters)")
    else:
        issues.add(bad[0], f"{len(bad):,} lines are not valid UTF-8 (this is the first); read them as {encodings}")
    return "\n".join(out)


def _looks_garbled(text: str) -> bool:
    """Decoded text full of control characters is a binary file that happened to decode."""
    head = text[:HEAD_BYTES]
    bad = sum(1 for ch in head if (ch < " " and ch not in "\t\n\r\x0b\x0c\x1b\x00") or "\x7f" <= ch < "\xa0")
    return bad > max(1, len(head) // 20)


def _decode(data: bytes, name: str, issues: _Issues) -> str:
    """Bytes to text with "\n" line endings; raises PromptFileError for binary data."""
    text: str | None = None
    for bom, codec, label in _BOMS:
        if data.startswith(bom):
            body = data[len(bom) :]
            try:
                text = body.decode(codec)
            except UnicodeDecodeError as e:
                issues.add(None, f"not valid {label} at byte {e.start + len(bom):,}; unreadable characters replaced")
                text = body.decode(codec, errors="replace")
            break
    if text is None:
        body = data.removeprefix(codecs.BOM_UTF8)
        codec16 = _bomless_utf16(body)
        if codec16:
            try:
                text = body.decode(codec16)
                issues.add(None, f"file has no byte-order mark; read as {codec16.upper()}")
            except UnicodeDecodeError:
                text = None
        if text is None:
            kind = _binary_kind(body[:HEAD_BYTES])
            if kind:
                raise PromptFileError(f"{name}: looks like {kind}, not a text file of prompts")
            text = _decode_ascii_compatible(body, issues)
    if _looks_garbled(text):
        raise PromptFileError(f"{name}: not readable text (not UTF-8, UTF-16 or Windows-1252; maybe a binary file)")
    return text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")


def _strip_nuls(text: str, issues: _Issues) -> str:
    """NUL bytes inside otherwise-text lines (a bad export) are dropped, with an issue per line."""
    if "\x00" not in text:
        return text
    for number, line in enumerate(text.split("\n"), 1):
        n = line.count("\x00")
        if n:
            issues.add(number, f"removed {_plural(n, 'NUL byte')}")
    return text.replace("\x00", "")


# --- formats ----------------------------------------------------------------------------------------------------


def _ws_end(text: str, pos: int) -> int:
    """The position after the JSON whitespace that starts at pos."""
    match = _JSON_WS.match(text, pos)
    return match.end() if match else pos


def _try_json(text: str) -> Any:
    """The parsed document, or None when the text is not one JSON value."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _csv_delimiter(first_line: str, ext: str) -> str | None:
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


def _detect(text: str, ext: str) -> str:
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
            return "json"  # one object, or JSON Lines: _parse_json tells them apart
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
    if _csv_delimiter(first_line, ext):
        return "csv"
    return "text"


def _parse_text(text: str, builder: _Builder) -> None:
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            builder.add(number, line)


def _parse_jsonl(lines: list[str], builder: _Builder) -> None:
    for number, line in enumerate(lines, 1):
        builder.json_line(number, line)


def _salvage(lines: list[str], after: int, builder: _Builder) -> None:
    """After a syntax error in a JSON array, keep the records that sit one per line further down."""
    for number in range(after + 1, len(lines) + 1):
        s = lines[number - 1].strip().lstrip("[").rstrip(",]").strip()
        if s.startswith("{") and s.endswith("}"):
            builder.json_line(number, s)


def _parse_json(text: str, builder: _Builder, issues: _Issues) -> str:
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
        _parse_jsonl(lines, builder)  # a one-line value with more after it: JSON Lines after all
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


def _parse_csv(text: str, ext: str, name: str, builder: _Builder, issues: _Issues) -> None:
    first_line = text.lstrip().split("\n", 1)[0]
    delimiter = _csv_delimiter(first_line, ext) or ("\t" if ext == ".tsv" else ",")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    header: list[str] | None = None
    prompt_col = category_col = id_col = -1
    previous = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            start = previous + 1
            if "unexpected end of data" in str(e):
                issues.add(
                    start, "not valid CSV (a quote opened here is never closed; the rest of the file was skipped)"
                )
                break
            issues.add(start, f"not valid CSV ({e})")
            if reader.line_num <= previous:
                break
            previous = reader.line_num
            continue
        start, previous = previous + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in row]
            prompt_col = next((header.index(c) for c in CSV_PROMPT_COLUMNS if c in header), -1)
            if prompt_col < 0:
                found = ", ".join(repr(h[:40]) for h in header[:10])
                raise PromptFileError(
                    f"{name}: no prompt column in the CSV header (expected one of {', '.join(CSV_PROMPT_COLUMNS)};"
                    f" found {found})"
                )
            category_col = header.index("category") if "category" in header else -1
            id_col = next((header.index(c) for c in CSV_ID_COLUMNS if c in header), -1)
            continue
        if len(row) > len(header):
            issues.add(
                start,
                f"row has {len(row)} fields but the header has {len(header)} (quote fields that contain {delimiter!r})",
            )
            continue
        if prompt_col >= len(row):
            issues.add(start, f"row has {len(row)} fields; the prompt is field {prompt_col + 1}")
            continue
        category = _label(row[category_col]) if 0 <= category_col < len(row) else None
        rid = _label(row[id_col]) if 0 <= id_col < len(row) else None
        builder.add(start, row[prompt_col], category, rid)


# --- public API -------------------------------------------------------------------------------------------------


def parse_prompt_bytes(
    data: bytes,
    filename: str,
    max_bytes: int = MAX_UPLOAD_BYTES,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> ParseResult:
    """Parse an uploaded prompt file; bad lines become issues, and only an unreadable file raises PromptFileError."""
    name = _display_name(filename)
    try:
        return _parse(bytes(data), name, os.path.splitext(str(filename or ""))[1].lower(), max_bytes, max_prompt_chars)
    except PromptFileError as e:
        raise PromptFileError(_one_line(str(e)) or f"{name}: cannot be read") from None
    except RecursionError:
        raise PromptFileError(f"{name}: the file is nested too deeply to read") from None
    except MemoryError:
        raise PromptFileError(f"{name}: the file is too large to parse in memory") from None
    except Exception as e:  # the contract is one clear line for the UI, never a traceback
        raise PromptFileError(
            _one_line(f"{name}: internal error while parsing ({type(e).__name__}: {e}); please report this")
        ) from e


def _parse(data: bytes, name: str, ext: str, max_bytes: int, max_prompt_chars: int) -> ParseResult:
    if not data:
        raise PromptFileError(f"{name}: file is empty")
    if len(data) > max_bytes:
        raise _size_error(name, len(data), max_bytes)
    issues = _Issues()
    text = _strip_nuls(_decode(data, name, issues), issues)
    if not text.strip():
        raise PromptFileError(f"{name}: file has no text (only blank lines)")
    builder = _Builder(issues, max_prompt_chars)
    fmt = _detect(text, ext)
    if fmt == "csv":
        _parse_csv(text, ext, name, builder, issues)
    elif fmt == "json":
        fmt = _parse_json(text, builder, issues)
    elif fmt == "jsonl":
        _parse_jsonl(text.split("\n"), builder)
    else:
        _parse_text(text, builder)
    if not builder.prompts:
        detail = f" ({_plural(issues.count(), 'issue')}; first: {issues.first()[:200]})" if issues.count() else ""
        raise PromptFileError(f"{name}: no prompts found{detail}")
    if fmt.startswith("json"):
        fmt += builder.style()
    return ParseResult(builder.prompts, issues.result(), fmt, builder.duplicates)


def load_prompt_file(
    path: str | os.PathLike[str],
    max_bytes: int = MAX_UPLOAD_BYTES,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> ParseResult:
    """Read and parse a prompt file from disk, turning OS errors into one-line PromptFileErrors."""
    p = Path(path)
    try:
        if p.is_dir():
            raise PromptFileError(f"{p}: is a directory, not a file")
        size = p.stat().st_size
        if size > max_bytes:
            raise _size_error(p.name, size, max_bytes)
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)  # bounded even when stat lies (pipes, /proc)
    except FileNotFoundError:
        raise PromptFileError(f"{p}: no such file") from None
    except PermissionError:
        raise PromptFileError(f"{p}: permission denied") from None
    except OSError as e:
        raise PromptFileError(f"{p}: cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # e.g. a NUL byte in the path
        raise PromptFileError(f"{_display_name(str(path))}: not a valid path ({e})") from None
    return parse_prompt_bytes(data, p.name, max_bytes=max_bytes, max_prompt_chars=max_prompt_chars)


def check_prompt_lengths(
    prompts: Iterable[Prompt], tokenizer_len: Callable[[str], int], max_tokens: int
) -> list[ParseIssue]:
    """Flag prompts that do not fit the model's context (the caller supplies the tokenizer's count)."""
    issues: list[ParseIssue] = []
    for p in prompts:
        try:
            n = int(tokenizer_len(p.text))
        except Exception as e:  # noqa: BLE001 -- a tokenizer failure on one prompt must not hide the others
            issues.append(ParseIssue(p.source_line, _one_line(f"could not count tokens ({type(e).__name__}: {e})")))
            continue
        if n > max_tokens:
            issues.append(
                ParseIssue(p.source_line, f"prompt {p.prompt_id} is {n:,} tokens; the limit is {max_tokens:,}")
            )
    return issues


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "max": 0, "mean": 0.0, "median": 0.0, "total": 0}
    return {
        "min": min(values),
        "max": max(values),
        "mean": round(statistics.fmean(values), 1),
        "median": float(statistics.median(values)),
        "total": sum(values),
    }


def summarise(result: ParseResult, tokenizer_len: Callable[[str], int] | None = None) -> dict[str, Any]:
    """Numbers for the upload preview; token lengths (for the histogram) only when a tokenizer count is given."""
    char_lengths = [len(p.text) for p in result.prompts]
    categories = Counter(p.category or "(none)" for p in result.prompts)
    summary: dict[str, Any] = {
        "count": len(result.prompts),
        "format": result.format,
        "issues": len(result.issues),
        "duplicates_removed": result.duplicates_removed,
        "categories": dict(categories.most_common()),
        "chars": _stats(char_lengths),
        "char_lengths": char_lengths,
    }
    if tokenizer_len is not None:
        token_lengths = [int(tokenizer_len(p.text)) for p in result.prompts]
        summary["tokens"] = _stats(token_lengths)
        summary["token_lengths"] = token_lengths
    return summary
