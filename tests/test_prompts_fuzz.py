"""Hypothesis fuzzing of parse_prompt_bytes: whatever is uploaded, it returns a clean ParseResult or one clear error."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]

from engine.errors import PromptFileError  # noqa: E402
from engine.prompts import ParseResult, parse_prompt_bytes  # noqa: E402

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FILENAMES = st.sampled_from(["p.txt", "p.jsonl", "p.json", "p.csv", "p.tsv", "noext", "", "we\nird\x00.ndjson"])
KEYS = [
    "prompt", "text", "turns", "messages", "conversations", "category", "id", "question_id",
    "role", "content", "from", "value", "type", "user", "human",
]  # fmt: skip
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["user", "human", "text", "", " ", "\x00", "\ud800"])
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)
NEWLINES = st.sampled_from(["\n", "\r\n", "\r"])


def check(data: bytes, filename: str = "p.txt", max_prompt_chars: int = 100_000) -> ParseResult | None:
    """The contract: a ParseResult whose prompts are clean, or a PromptFileError with one non-empty line."""
    try:
        result = parse_prompt_bytes(data, filename, max_prompt_chars=max_prompt_chars)
    except PromptFileError as e:
        message = str(e)
        assert message.strip()
        assert "\n" not in message and "\r" not in message
        assert "internal error" not in message, message
        return None
    assert isinstance(result, ParseResult)
    assert result.prompts
    assert result.format.split("-")[0] in ("text", "csv", "jsonl", "json")
    for p in result.prompts:
        assert p.text and p.text == p.text.strip()
        assert "\x00" not in p.text
        assert len(p.text) <= max_prompt_chars
        p.text.encode("utf-8")  # no lone surrogates: the text can be hashed and stored
        assert p.source_line >= 1
        assert p.prompt_id
    assert len({p.text for p in result.prompts}) == len(result.prompts)
    assert len({p.prompt_id for p in result.prompts}) == len(result.prompts)
    for issue in result.issues:
        assert issue.message and "\n" not in issue.message
        assert issue.line is None or issue.line >= 1
    return result


@FUZZ
@given(st.binary(max_size=3000), FILENAMES)
@example(b"\xff\xfe", "p.txt")
@example(b"\xff\xfe\x00\xd8", "p.txt")
@example(b"\x00" * 10, "p.json")
@example(b'\xef\xbb\xbf"', "p.csv")
def test_random_bytes(data: bytes, filename: str) -> None:
    check(data, filename)


@FUZZ
@given(JSON_VALUES, FILENAMES)
def test_random_json_document(value: object, filename: str) -> None:
    check(json.dumps(value).encode(), filename)
    check(json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8", "surrogatepass"), filename)


@FUZZ
@given(st.lists(JSON_VALUES, min_size=1, max_size=8), FILENAMES, NEWLINES)
def test_random_json_lines(values: list[object], filename: str, newline: str) -> None:
    good = {"prompt": "the good line"}
    lines = [json.dumps(v) for v in values] + [json.dumps(good)]
    result = check(newline.join(lines).encode(), filename)
    if filename.endswith(".jsonl"):
        assert result is not None
        assert "the good line" in [p.text for p in result.prompts]


@FUZZ
@given(st.integers(1, 200_000), st.sampled_from(["[", '{"a":', '[{"turns":']), st.booleans(), FILENAMES)
@example(100_000, "[", False, "p.txt")
@example(100_000, "[", True, "p.json")
def test_deep_nesting(depth: int, opener: str, with_good_line: bool, filename: str) -> None:
    deep = (opener * depth).encode()
    data = b'{"prompt": "survivor"}\n' + deep + b"\n" if with_good_line else deep
    result = check(data, filename)
    if with_good_line and filename.endswith((".jsonl", ".txt")):
        assert result is not None
        assert "survivor" in [p.text for p in result.prompts]


@FUZZ
@given(st.lists(st.text(alphabet="ab c", max_size=120), min_size=1, max_size=12), NEWLINES)
def test_huge_lines_are_skipped(lines: list[str], newline: str) -> None:
    limit = 50
    result = check(newline.join(lines).encode(), "p.txt", max_prompt_chars=limit)
    expected = list(dict.fromkeys(s.strip() for s in lines if s.strip() and len(s.strip()) <= limit))
    if not expected:
        assert result is None
        return
    assert result is not None
    assert [p.text for p in result.prompts] == expected
    too_long = [s for s in lines if len(s.strip()) > limit]
    assert sum("the limit is 50" in i.message for i in result.issues) == len(too_long)


@FUZZ
@given(
    st.lists(st.text(max_size=30), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=6),
    st.sampled_from(["text", "jsonl", "csv"]),
)
def test_nul_bytes(lines: list[str], positions: list[int], kind: str) -> None:
    if kind == "jsonl":
        raw = "\n".join(json.dumps({"prompt": s}) for s in lines).encode()
    elif kind == "csv":
        raw = ("prompt\n" + "\n".join('"' + s.replace('"', '""') + '"' for s in lines)).encode("utf-8", "replace")
    else:
        raw = "\n".join(lines).encode("utf-8", "replace")
    data = bytearray(raw)
    for pos in positions:
        data.insert(pos % (len(data) + 1), 0)
    check(bytes(data), {"text": "p.txt", "jsonl": "p.jsonl", "csv": "p.csv"}[kind])


@FUZZ
@given(
    st.lists(st.tuples(st.text(max_size=30), st.sampled_from(["utf-8", "cp1252", "latin-1", "utf-16", "ascii"])),
             min_size=1, max_size=8),
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00"]),
    NEWLINES,
    FILENAMES,
)  # fmt: skip
def test_mixed_encodings_and_boms(lines: list[tuple[str, str]], bom: bytes, newline: str, filename: str) -> None:
    data = bom + newline.encode().join(s.encode(enc, "replace") for s, enc in lines)
    check(data, filename)


PRINTABLE = st.characters(
    blacklist_categories=("Cs", "Cc", "Cf", "Co", "Cn", "Zl", "Zp"), blacklist_characters='{["\t,;|'
)


@FUZZ
@given(
    st.lists(st.text(PRINTABLE, max_size=40), min_size=1, max_size=10),
    st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]),
    NEWLINES,
    st.booleans(),
)
def test_text_round_trips_through_boms_and_line_endings(
    lines: list[str], encoding: str, newline: str, trailing_newline: bool
) -> None:
    body = newline.join(lines) + (newline if trailing_newline else "")
    result = check(body.encode(encoding), "p.txt")
    expected = list(dict.fromkeys(s.strip() for s in lines if s.strip()))
    if not expected:
        assert result is None
        return
    assert result is not None
    assert result.format == "text"
    assert [p.text for p in result.prompts] == expected
    assert result.issues == []
    lines_of = {s.strip(): n for n, s in reversed(list(enumerate(lines, 1)))}
    assert [p.source_line for p in result.prompts] == [lines_of[t] for t in expected]
