"""CSV and TSV: the header names the prompt column (and optional category and id columns); bad rows become issues."""

from __future__ import annotations

import csv
import io

from engine.errors import PromptFileError
from engine.prompts.detect import CSV_PROMPT_COLUMNS, csv_delimiter
from engine.prompts.model import Issues
from engine.prompts.records import Builder, label

CSV_ID_COLUMNS = ("question_id", "id", "prompt_id")


def parse_csv(text: str, ext: str, name: str, builder: Builder, issues: Issues) -> None:
    first_line = text.lstrip().split("\n", 1)[0]
    delimiter = csv_delimiter(first_line, ext) or ("\t" if ext == ".tsv" else ",")
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
        category = label(row[category_col]) if 0 <= category_col < len(row) else None
        rid = label(row[id_col]) if 0 <= id_col < len(row) else None
        builder.add(start, row[prompt_col], category, rid)
