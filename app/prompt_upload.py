"""The Prompts page's logic without Streamlit: parse an upload, preview it, save it, import a bundled sample.

Parsing goes through engine.prompts.parse_prompt_bytes, which imports every good line and reports
every bad one; only a file that cannot be read at all raises PromptFileError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine.errors import PromptFileError
from engine.service.api import MAX_UPLOAD_BYTES, ParseResult, display_name, parse_prompt_bytes, summarise
from foundation.paths import PROJECT_ROOT

SAMPLES_DIR = PROJECT_ROOT / "samples"
UPLOAD_TYPES = ["txt", "jsonl", "json", "csv"]
PASTE_FORMATS = {"plain text (one prompt per line)": "txt", "JSONL": "jsonl", "JSON": "json", "CSV": "csv"}
PREVIEW_ROWS = 50
STORED_ROWS = 20
MULTI_TURN_NOTE = "multi-turn records: the first user turn is used"
MAX_UPLOAD_MB = max(1, math.ceil(MAX_UPLOAD_BYTES / (1024 * 1024)))
ISSUES_LISTED = 10  # bad lines listed under a refused file's error; the rest are counted


@dataclass
class Parsed:
    """A parsed upload waiting to be saved."""

    filename: str
    result: ParseResult
    summary: dict[str, Any]

    @property
    def default_name(self) -> str:
        return Path(self.filename).stem or "prompts"


def size_limit_text() -> str:
    return f"{MAX_UPLOAD_BYTES / (1024 * 1024):.0f} MB"


def parse_upload(data: bytes, filename: str) -> Parsed:
    """Parse uploaded bytes; raises PromptFileError (one line naming the problem) when nothing is readable."""
    result = parse_prompt_bytes(data, filename)
    return Parsed(filename=filename, result=result, summary=summarise(result))


def refusal(exc: PromptFileError, filename: str, what: str | None = None) -> tuple[str, list[str]]:
    """A refused file's error as (headline, bad lines): `Could not read x.jsonl: no prompts found (2 issues):`
    naming the file (or ``what``) once, then up to ISSUES_LISTED of its issues and `and N more`."""
    name = display_name(filename)
    reason = exc.reason.removeprefix(f"{name}: ")
    count = exc.issue_count
    name = what or name
    if not count:
        return f"Could not read {name}: {reason}", []
    lines = list(exc.issues[:ISSUES_LISTED])
    if count > len(lines):
        lines.append(f"and {count - len(lines):,} more")
    return f"Could not read {name}: {reason} ({count:,} issue{'s' if count != 1 else ''}):", lines


def parse_pasted(text: str, fmt: str = "txt") -> Parsed:
    """Pasted prompts, parsed as if they were a file of the chosen format."""
    if not text or not text.strip():
        raise PromptFileError("nothing pasted: type or paste prompts first")
    return parse_upload(text.encode("utf-8"), f"pasted.{fmt}")


def preview_frame(parsed: Parsed, limit: int = PREVIEW_ROWS) -> pd.DataFrame:
    rows = [
        {"line": p.source_line, "id": p.prompt_id, "category": p.category or "", "chars": len(p.text), "prompt": p.text}
        for p in parsed.result.prompts[:limit]
    ]
    return pd.DataFrame(rows, columns=["line", "id", "category", "chars", "prompt"])


def preview_caption(parsed: Parsed) -> str:
    shown = min(len(parsed.result.prompts), PREVIEW_ROWS)
    return f"First {shown} of {len(parsed.result.prompts)} prompts ({MULTI_TURN_NOTE}):"


def issues_frame(parsed: Parsed) -> pd.DataFrame:
    """Issues as the parser words them (str(issue): "line 3: not valid JSON …"), with the line to sort by."""
    rows = [{"line": i.line, "issue": str(i)} for i in parsed.result.issues]
    return pd.DataFrame(rows, columns=["line", "issue"]).astype({"line": "Int64"})


def categories_frame(parsed: Parsed) -> pd.DataFrame:
    cats = parsed.summary.get("categories") or {}
    return pd.DataFrame({"category": list(cats), "prompts": list(cats.values())})


def lengths_frame(parsed: Parsed) -> pd.DataFrame:
    if parsed.summary.get("token_lengths"):
        return pd.DataFrame({"tokens": parsed.summary["token_lengths"]})
    return pd.DataFrame({"characters": parsed.summary.get("char_lengths") or []})


def sets_frame(sets: list[dict[str, Any]]) -> pd.DataFrame:
    """The stored prompt sets, newest first as the store lists them."""
    rows = [
        {
            "id": s["id"],
            "name": s["name"],
            "file": s.get("source_filename") or "",
            "prompts": s.get("n_prompts") or 0,
            "created": s.get("created_at"),
        }
        for s in sets
    ]
    return pd.DataFrame(rows, columns=["id", "name", "file", "prompts", "created"])


def stored_prompts_frame(prompts: list[dict[str, Any]]) -> pd.DataFrame:
    """Stored prompts numbered from 1, as everywhere in the dashboard."""
    rows = [{"#": p["position"] + 1, "category": p.get("category") or "", "prompt": p["text"]} for p in prompts]
    return pd.DataFrame(rows, columns=["#", "category", "prompt"])


def save(store: Any, parsed: Parsed, name: str) -> tuple[int, int, int]:
    """Store the parsed prompts as a set; returns (prompt_set_id, added, duplicates)."""
    if not parsed.result.prompts:
        raise PromptFileError(f"{parsed.filename}: no prompt could be imported, so there is nothing to save")
    clean_name = (name or "").strip() or parsed.default_name
    prompts = [{"text": p.text, "category": p.category} for p in parsed.result.prompts]
    return store.add_prompt_set(clean_name[:200], parsed.filename, prompts)


def sample_files() -> list[Path]:
    if not SAMPLES_DIR.is_dir():
        return []
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.suffix.lstrip(".") in UPLOAD_TYPES and p.is_file())


def import_sample(store: Any, path: Path) -> tuple[int, int, int, Parsed]:
    """One click: parse a bundled sample file and store it as 'sample: <stem>'."""
    parsed = parse_upload(path.read_bytes(), path.name)
    set_id, added, dupes = save(store, parsed, f"sample: {path.stem}")
    return set_id, added, dupes, parsed
