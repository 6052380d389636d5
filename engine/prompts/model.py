"""The parse result types (Prompt, ParseIssue, ParseResult), the upload limits and the capped issue list."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024
MAX_UPLOAD_BYTES = 10 * MB  # a few thousand prompts; larger files are logs, not samples
MAX_PROMPT_CHARS = 100_000  # far beyond any context the dashboard can decode; longer "prompts" are pasted documents
MAX_ISSUES = 200  # beyond this the UI list is noise; the rest are counted in one final issue


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


class Issues:
    """Collects issues up to MAX_ISSUES, so a corrupt 10 MB file cannot flood the UI."""

    def __init__(self) -> None:
        self.items: list[ParseIssue] = []
        self.dropped = 0

    def add(self, line: int | None, message: str) -> None:
        if len(self.items) < MAX_ISSUES:
            self.items.append(ParseIssue(line, one_line(message)))
        else:
            self.dropped += 1

    def count(self) -> int:
        return len(self.items) + self.dropped

    def result(self) -> list[ParseIssue]:
        out = list(self.items)
        if self.dropped:
            out.append(ParseIssue(None, f"{self.dropped:,} more issues not shown"))
        return out


def one_line(text: str) -> str:
    return " ".join(text.split())


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")
