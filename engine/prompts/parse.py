"""Parse prompt samples uploaded from real traffic into Prompts, with line-level diagnostics.

Uploads come from many tools (log exports, Spec-Bench / MT-bench files, chat transcripts, spreadsheets), so the parser
guesses the encoding and the format, imports every good line and reports every bad one by its line number instead of
rejecting the whole file. Only a file that cannot be read at all raises PromptFileError.

ParseResult.format is one of "text", "csv", "jsonl" or "json" (a whole-file array or object). The JSON formats get a
suffix when most records use a chat or benchmark layout: "-turns" (MT-bench / Spec-Bench), "-messages" (OpenAI) or
"-conversations" (ShareGPT), e.g. "jsonl-turns".
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import PromptFileError
from engine.prompts.csv_format import parse_csv
from engine.prompts.decoding import decode, strip_nuls
from engine.prompts.detect import detect
from engine.prompts.json_format import parse_json, parse_jsonl
from engine.prompts.model import MAX_PROMPT_CHARS, MAX_UPLOAD_BYTES, MB, Issues, ParseResult, one_line, plural
from engine.prompts.records import Builder


def parse_prompt_bytes(
    data: bytes,
    filename: str,
    max_bytes: int = MAX_UPLOAD_BYTES,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> ParseResult:
    """Parse an uploaded prompt file; bad lines become issues, and only an unreadable file raises PromptFileError."""
    name = display_name(filename)
    try:
        return _parse(bytes(data), name, os.path.splitext(str(filename or ""))[1].lower(), max_bytes, max_prompt_chars)
    except PromptFileError as e:
        raise PromptFileError(one_line(e.reason) or f"{name}: cannot be read", e.issues, e.issue_count) from None
    except RecursionError:
        raise PromptFileError(f"{name}: the file is nested too deeply to read") from None
    except MemoryError:
        raise PromptFileError(f"{name}: the file is too large to parse in memory") from None
    except Exception as e:  # the contract is one clear line for the UI, never a traceback
        raise PromptFileError(
            one_line(f"{name}: internal error while parsing ({type(e).__name__}: {e}); please report this")
        ) from e


def _parse(data: bytes, name: str, ext: str, max_bytes: int, max_prompt_chars: int) -> ParseResult:
    if not data:
        raise PromptFileError(f"{name}: file is empty")
    if len(data) > max_bytes:
        raise _size_error(name, len(data), max_bytes)
    issues = Issues()
    text = strip_nuls(decode(data, name, issues), issues)
    if not text.strip():
        raise PromptFileError(f"{name}: file has no text (only blank lines)")
    builder = Builder(issues, max_prompt_chars)
    fmt = detect(text, ext)
    if fmt == "csv":
        parse_csv(text, ext, name, builder, issues)
    elif fmt == "json":
        fmt = parse_json(text, builder, issues)
    elif fmt == "jsonl":
        parse_jsonl(text.split("\n"), builder)
    else:
        _parse_text(text, builder)
    if not builder.prompts:
        raise PromptFileError(f"{name}: no prompts found", tuple(str(i) for i in issues.items), issues.count())
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
        raise PromptFileError(f"{display_name(str(path))}: not a valid path ({e})") from None
    return parse_prompt_bytes(data, p.name, max_bytes=max_bytes, max_prompt_chars=max_prompt_chars)


def _parse_text(text: str, builder: Builder) -> None:
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            builder.add(number, line)


def _format_size(n: int) -> str:
    if n < 1024:
        return plural(n, "byte")
    value, unit = (n / MB, "MB") if n >= MB else (n / 1024, "KB")
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text} {unit}"


def _size_error(name: str, size: int, limit: int) -> PromptFileError:
    shown, limit_shown = _format_size(size), _format_size(limit)
    if shown == limit_shown:  # 10.01 MB against 10 MB would read "10 MB; the limit is 10 MB"
        shown, limit_shown = plural(size, "byte"), plural(limit, "byte")
    return PromptFileError(f"{name}: file is {shown}; the limit is {limit_shown}")


def display_name(filename: str | os.PathLike[str] | None) -> str:
    """How a file is named in error lines: its base name, unprintable characters as ?, at most 120 of them."""
    name = os.path.basename(str(filename or ""))
    name = "".join(ch if ch.isprintable() else "?" for ch in name)[:120]
    return name or "upload"
