"""Prompt files from real traffic (text, CSV, JSON Lines, JSON) parsed into Prompts, bad lines reported by number."""

from engine.prompts.model import MAX_ISSUES, MAX_PROMPT_CHARS, MAX_UPLOAD_BYTES, MB, ParseIssue, ParseResult, Prompt
from engine.prompts.parse import display_name, load_prompt_file, parse_prompt_bytes
from engine.prompts.summary import check_prompt_lengths, summarise

__all__ = [
    "MAX_ISSUES",
    "MAX_PROMPT_CHARS",
    "MAX_UPLOAD_BYTES",
    "MB",
    "ParseIssue",
    "ParseResult",
    "Prompt",
    "check_prompt_lengths",
    "display_name",
    "load_prompt_file",
    "parse_prompt_bytes",
    "summarise",
]
