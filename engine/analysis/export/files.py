"""The two shapes an export file takes, each rendered in one place: JSON documents and flags files.

Flags files are `#` comment lines then one shell-quoted line of flags (parse with shlex.split(text,
comments=True)); JSON files are indented, with non-finite numbers written as null.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats → None, mapping keys → str (JSON has only string keys)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def dumps(obj: Any) -> str:
    return json.dumps(clean(obj), indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Fit:
    """How an engine runs a policy: exactly, or the closest thing it runs (`runs`, in words) and what that loses.

    `remarks` are what else the user should know about how the engine runs it."""

    exact: bool = True
    runs: str = ""
    lost: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()


@dataclass(frozen=True)
class JsonFile:
    """An export that is one JSON document."""

    doc: dict[str, Any]
    fit: Fit = Fit()

    def render(self) -> str:
        return dumps(self.doc)


@dataclass(frozen=True)
class FlagsFile:
    """An export that is command-line flags, after the comments that explain them."""

    comments: tuple[str, ...]
    flags: tuple[str, ...] = ()
    fit: Fit = Fit()

    def render(self) -> str:
        lines = [f"# {line}" for c in self.comments for line in str(c).splitlines() or [""]]  # a comment per line
        if self.flags:
            lines.append(shlex.join(self.flags))
        return "\n".join(lines) + "\n"


def with_notes(doc: dict[str, Any], notes: Sequence[str]) -> dict[str, Any]:
    """JSON files that are not parsed by a server as-is: the recommendation's notes as a "notes" list."""
    return doc | {"notes": list(notes)} if notes else doc


def note_comments(notes: Sequence[str]) -> list[str]:
    """Flags files: the recommendation's notes as `note:` comments, one line each (names may hold newlines)."""
    return [f"note: {' '.join(str(n).split())}" for n in notes]


@dataclass
class PolicyExport:
    """One engine's file for a speculation policy: `exact` when the engine runs the policy itself, else the
    closest thing it can run, with `lost` saying what that gives up."""

    fmt: str
    filename: str
    text: str
    exact: bool
    runs: str  # what the engine will run, in words
    lost: list[str] = field(default_factory=list)
