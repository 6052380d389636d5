"""Bytes to text: byte-order marks, BOM-less UTF-16, a UTF-8 / Windows-1252 mix, and binary files refused."""

from __future__ import annotations

import codecs
import re

from engine.errors import PromptFileError
from engine.prompts.model import Issues, plural

HEAD_BYTES = 8192  # how much of the file the binary sniffing looks at

_NEWLINES_B = re.compile(rb"\r\n|\r|\n")
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


def _decode_ascii_compatible(data: bytes, issues: Issues) -> str:
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


def decode(data: bytes, name: str, issues: Issues) -> str:
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


def strip_nuls(text: str, issues: Issues) -> str:
    """NUL bytes inside otherwise-text lines (a bad export) are dropped, with an issue per line."""
    if "\x00" not in text:
        return text
    for number, line in enumerate(text.split("\n"), 1):
        n = line.count("\x00")
        if n:
            issues.add(number, f"removed {plural(n, 'NUL byte')}")
    return text.replace("\x00", "")
