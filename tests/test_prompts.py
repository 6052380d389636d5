"""Prompt-file parsing: every supported format, every bad input, and the bundled sample sets."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from engine.errors import PromptFileError  # noqa: E402
from engine.prompts import (  # noqa: E402
    MAX_ISSUES,
    MB,
    ParseIssue,
    ParseResult,
    Prompt,
    check_prompt_lengths,
    load_prompt_file,
    parse_prompt_bytes,
    summarise,
)

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
SAMPLES = ROOT / "samples"


def jsonl(*records: object) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def texts(result: ParseResult) -> list[str]:
    return [p.text for p in result.prompts]


def issue_strings(result: ParseResult) -> list[str]:
    return [str(i) for i in result.issues]


# --- formats ----------------------------------------------------------------------------------------------------


def test_plain_text_one_prompt_per_line() -> None:
    r = parse_prompt_bytes(b"First prompt\n\n   \nSecond prompt  \n", "p.txt")
    assert r.format == "text"
    assert texts(r) == ["First prompt", "Second prompt"]
    assert [(p.source_line, p.prompt_id, p.category) for p in r.prompts] == [(1, "line1", None), (4, "line4", None)]
    assert r.issues == []


def test_text_lines_that_look_like_brackets_stay_text() -> None:
    r = parse_prompt_bytes(b"[1] Write a poem\n[2] Write a song\n", "p.txt")
    assert r.format == "text"
    assert texts(r) == ["[1] Write a poem", "[2] Write a song"]
    r = parse_prompt_bytes(b"{name} says hello to {friend}\nSecond prompt\n", "templates.txt")
    assert r.format == "text"
    assert texts(r) == ["{name} says hello to {friend}", "Second prompt"]


def test_jsonl_prompt_and_text_fields() -> None:
    data = jsonl({"prompt": "a", "category": "x", "id": 7}, {"text": "b"}, {"Prompt": "c", "question_id": "q3"})
    r = parse_prompt_bytes(data, "p.jsonl")
    assert r.format == "jsonl"
    assert [(p.text, p.category, p.prompt_id, p.source_line) for p in r.prompts] == [
        ("a", "x", "7", 1),
        ("b", None, "line2", 2),
        ("c", None, "q3", 3),
    ]


def test_mt_bench_turns_use_first_turn_and_question_id() -> None:
    data = jsonl({"question_id": 81, "category": "writing", "turns": ["first", "second"]})
    r = parse_prompt_bytes(data, "question.jsonl")
    assert r.format == "jsonl-turns"
    assert r.prompts == [Prompt("first", "writing", 1, "81")]


def test_openai_messages_first_user_message() -> None:
    data = jsonl(
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "describe"}]}]},
        {"messages": [{"role": "assistant", "content": "hi"}]},
    )
    r = parse_prompt_bytes(data, "chat.jsonl")
    assert r.format == "jsonl-messages"
    assert texts(r) == ["hello", "describe"]
    assert issue_strings(r) == ["line 3: no user message in 'messages'"]


def test_sharegpt_conversations_first_human_turn() -> None:
    data = jsonl(
        {"id": "c1", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "question?"}]},
        {"conversations": [{"from": "gpt", "value": "answer"}]},
    )
    r = parse_prompt_bytes(data, "sharegpt.json")
    assert r.format == "jsonl-conversations"
    assert r.prompts == [Prompt("question?", None, 1, "c1")]
    assert issue_strings(r) == ["line 2: no user message in 'conversations'"]


def test_json_array_of_mixed_records_keeps_line_numbers() -> None:
    data = b"""[
  {"prompt": "plain", "category": "a"},
  {"turns": ["turn one"], "question_id": 2},
  {"messages": [{"role": "user", "content": "chat"}]},
  {"conversations": [{"from": "human", "value": "share"}]},
  "just a string"
]
"""
    r = parse_prompt_bytes(data, "all.json")
    assert r.format.startswith("json")
    assert texts(r) == ["plain", "turn one", "chat", "share", "just a string"]
    assert [p.source_line for p in r.prompts] == [2, 3, 4, 5, 6]
    assert r.issues == []


def test_json_array_with_a_broken_element_keeps_the_others() -> None:
    data = b'[\n{"prompt": "a"},\n{"prompt": "b" "c"},\n{"prompt": "d"}\n]\n'
    r = parse_prompt_bytes(data, "broken.json")
    assert texts(r) == ["a", "d"]
    assert issue_strings(r) == ["line 3: not valid JSON (Expecting ',' delimiter at column 16)"]


def test_pretty_printed_single_object() -> None:
    r = parse_prompt_bytes(b'{\n  "prompt": "one",\n  "category": "x"\n}\n', "one.json")
    assert r.format == "json"
    assert r.prompts == [Prompt("one", "x", 1, "line1")]


@pytest.mark.parametrize("column", ["prompt", "Text", "QUESTION", "instruction", " Input "])
def test_csv_prompt_column_names(column: str) -> None:
    data = f'id,{column},category\n1,"Hello, world",greet\n2,"Two\nlines",\n'.encode()
    r = parse_prompt_bytes(data, "p.csv")
    assert r.format == "csv"
    assert [(p.text, p.category, p.prompt_id, p.source_line) for p in r.prompts] == [
        ("Hello, world", "greet", "1", 2),
        ("Two\nlines", None, "2", 3),
    ]
    assert r.issues == []


def test_csv_detected_by_content_and_semicolons() -> None:
    r = parse_prompt_bytes(b"category;prompt\nmath;What is 2+2?\n", "export.txt")
    assert r.format == "csv"
    assert r.prompts == [Prompt("What is 2+2?", "math", 2, "line2")]


def test_tsv() -> None:
    r = parse_prompt_bytes(b"prompt\tcategory\nhello there\tgreet\n", "p.tsv")
    assert r.prompts == [Prompt("hello there", "greet", 2, "line2")]


def test_csv_malformed_rows_become_issues() -> None:
    data = b'prompt,category\ngood one,a\nunquoted, comma,b\n"bad"quote,c\ngood two,d\n'
    r = parse_prompt_bytes(data, "p.csv")
    assert texts(r) == ["good one", "good two"]
    assert issue_strings(r)[0] == "line 3: row has 3 fields but the header has 2 (quote fields that contain ',')"
    assert issue_strings(r)[1].startswith("line 4: not valid CSV (")


def test_csv_unclosed_quote() -> None:
    r = parse_prompt_bytes(b'prompt\nfine\n"never closed\nmore\n', "p.csv")
    assert texts(r) == ["fine"]
    assert issue_strings(r) == [
        "line 3: not valid CSV (a quote opened here is never closed; the rest of the file was skipped)"
    ]


def test_csv_without_prompt_column() -> None:
    with pytest.raises(PromptFileError, match=r"p\.csv: no prompt column in the CSV header .*found 'a', 'b'"):
        parse_prompt_bytes(b"a,b\n1,2\n", "p.csv")


@pytest.mark.skipif(not SPEC_BENCH.exists(), reason="shared Spec-Bench question file not present")
def test_spec_bench_question_file() -> None:
    r = load_prompt_file(SPEC_BENCH)
    assert r.format == "jsonl-turns"
    assert len(r.prompts) == 480
    assert len({p.category for p in r.prompts}) == 13
    assert r.issues == []
    assert r.duplicates_removed == 0
    assert r.prompts[0].prompt_id == "81"
    assert len({p.prompt_id for p in r.prompts}) == 480


# --- bad input --------------------------------------------------------------------------------------------------


def test_binary_file_by_signature() -> None:
    with pytest.raises(PromptFileError, match=r"^cat\.png: looks like a PNG image, not a text file of prompts$"):
        parse_prompt_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "cat.png")


def test_excel_file_gets_a_hint() -> None:
    with pytest.raises(PromptFileError, match="ZIP archive .*save it as CSV"):
        parse_prompt_bytes(b"PK\x03\x04\x14\x00\x06\x00" + bytes(100), "prompts.xlsx")


def test_binary_file_random_bytes() -> None:
    data = random.Random(0).randbytes(4096)
    with pytest.raises(PromptFileError, match=r"^blob\.txt: looks like a binary file"):
        parse_prompt_bytes(data, "blob.txt")


def test_wrong_encoding_falls_back_to_cp1252_and_keeps_lines() -> None:
    data = "Plain line\nCafé au lait\nNaïve question\n".encode("cp1252")
    r = parse_prompt_bytes(data, "legacy.txt")
    assert texts(r) == ["Plain line", "Café au lait", "Naïve question"]
    assert issue_strings(r) == ["line 2: 2 lines are not valid UTF-8 (this is the first); read them as Windows-1252"]


def test_mixed_encodings_decode_per_line() -> None:
    data = "Grüße aus Köln\n".encode() + "Café crème\n".encode("cp1252")
    r = parse_prompt_bytes(data, "mixed.txt")
    assert texts(r) == ["Grüße aus Köln", "Café crème"]
    assert issue_strings(r) == ["line 2: not valid UTF-8; read as Windows-1252 (check accented characters)"]


def test_empty_file() -> None:
    with pytest.raises(PromptFileError, match=r"^empty\.txt: file is empty$"):
        parse_prompt_bytes(b"", "empty.txt")
    with pytest.raises(PromptFileError, match=r"only blank lines"):
        parse_prompt_bytes(b"\xef\xbb\xbf \r\n\n\t\n", "blank.txt")


def test_malformed_json_line_names_the_line() -> None:
    data = jsonl({"prompt": "good 1"}) + b'{"prompt": "x" "y"}\n' + jsonl({"prompt": "good 2"}, {"other": 1})
    r = parse_prompt_bytes(data, "p.jsonl")
    assert texts(r) == ["good 1", "good 2"]
    assert issue_strings(r) == [
        "line 2: not valid JSON (Expecting ',' delimiter at column 16)",
        "line 4: no 'prompt', 'text', 'turns', 'messages' or 'conversations' field",
    ]
    assert r.issues[0] == ParseIssue(2, "not valid JSON (Expecting ',' delimiter at column 16)")


def test_wrongly_typed_fields_are_explained() -> None:
    data = jsonl({"prompt": 5}, {"turns": []}, {"turns": [{"a": 1}]}, {"messages": "hi"}, [1, 2], {"prompt": "  "})
    r = parse_prompt_bytes(data + jsonl({"prompt": "ok"}), "p.jsonl")
    assert texts(r) == ["ok"]
    assert issue_strings(r) == [
        "line 1: 'prompt' is a number, not a string",
        "line 2: 'turns' is an empty list; expected a non-empty list of strings",
        "line 3: the first turn is an object, not a string",
        "line 4: 'messages' is a string, not a list",
        "line 5: expected a JSON object with a 'prompt' field, got a list",
        "line 6: prompt is empty",
    ]


def test_no_prompt_anywhere_raises_with_the_first_issue() -> None:
    with pytest.raises(PromptFileError, match=r"^p\.jsonl: no prompts found \(2 issues; first: line 1: not valid JSON"):
        parse_prompt_bytes(b"{oops\n{also bad\n", "p.jsonl")


def test_oversized_file_names_the_limit() -> None:
    with pytest.raises(PromptFileError, match=r"^big\.jsonl: file is 12\.3 MB; the limit is 10 MB$"):
        parse_prompt_bytes(b"a" * int(12.3 * MB), "big.jsonl")
    with pytest.raises(PromptFileError, match=r"file is 150 bytes; the limit is 100 bytes"):
        parse_prompt_bytes(b"a\n" * 75, "small.txt", max_bytes=100)


def test_over_long_prompt_is_skipped_and_the_rest_kept() -> None:
    data = b"short one\n" + b"x" * 2_000_000 + b"\nshort two\n"
    r = parse_prompt_bytes(data, "p.txt")
    assert texts(r) == ["short one", "short two"]
    assert issue_strings(r) == ["line 2: prompt is 2,000,000 characters; the limit is 100,000"]
    r = parse_prompt_bytes(jsonl({"prompt": "y" * 50}, {"prompt": "ok"}), "p.jsonl", max_prompt_chars=10)
    assert issue_strings(r) == ["line 1: prompt is 50 characters; the limit is 10"]


def test_deeply_nested_json_is_an_issue() -> None:
    data = jsonl({"prompt": "ok"}) + b"[" * 100_000 + b"\n" + b'{"a":' * 50_000 + b"\n"
    r = parse_prompt_bytes(data, "deep.jsonl")
    assert texts(r) == ["ok"]
    assert issue_strings(r) == ["line 2: JSON is nested too deeply", "line 3: JSON is nested too deeply"]
    with pytest.raises(PromptFileError, match="nested too deeply"):
        parse_prompt_bytes(b"[" * 100_000, "deep.json")


def test_nul_bytes_are_stripped_with_an_issue() -> None:
    r = parse_prompt_bytes(b"good\nba\x00d\n", "p.txt")
    assert texts(r) == ["good", "bad"]
    assert issue_strings(r) == ["line 2: removed 1 NUL byte"]
    r = parse_prompt_bytes(jsonl({"prompt": "a\u0000b"}), "p.jsonl")
    assert texts(r) == ["ab"]
    assert issue_strings(r) == ["line 1: removed 1 NUL character from the prompt"]


def test_issue_list_is_capped() -> None:
    r = parse_prompt_bytes(b"{bad\n" * (MAX_ISSUES + 50) + jsonl({"prompt": "ok"}), "p.jsonl")
    assert len(r.issues) == MAX_ISSUES + 1
    assert str(r.issues[-1]) == "50 more issues not shown"


# --- encodings and line endings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-be-bom", "utf-32"])
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_bom_and_line_endings(encoding: str, newline: str) -> None:
    text = newline.join(["Grüße", "", "naïve café", "日本語のプロンプト"]) + newline
    data = b"\xfe\xff" + text.encode("utf-16-be") if encoding == "utf-16-be-bom" else text.encode(encoding)
    r = parse_prompt_bytes(data, "p.txt")
    assert texts(r) == ["Grüße", "naïve café", "日本語のプロンプト"]
    assert [p.source_line for p in r.prompts] == [1, 3, 4]
    assert r.issues == []


def test_bom_and_crlf_in_jsonl() -> None:
    data = b"\xef\xbb\xbf" + jsonl({"prompt": "a"}, {"prompt": "b"}).replace(b"\n", b"\r\n")
    r = parse_prompt_bytes(data, "p.jsonl")
    assert texts(r) == ["a", "b"]
    assert r.issues == []


def test_truncated_utf16_is_replaced_not_rejected() -> None:
    r = parse_prompt_bytes("hello\nworld".encode("utf-16") + b"\x00", "p.txt")
    assert texts(r)[0] == "hello"
    assert issue_strings(r) == ["not valid UTF-16 at byte 24; unreadable characters replaced"]


def test_utf16_without_bom_is_recognised() -> None:
    r = parse_prompt_bytes("hello\r\nworld\r\n".encode("utf-16-le"), "p.txt")
    assert texts(r) == ["hello", "world"]
    assert issue_strings(r) == ["file has no byte-order mark; read as UTF-16-LE"]


# --- dedupe and ids ---------------------------------------------------------------------------------------------


def test_exact_duplicates_are_removed_keeping_the_first() -> None:
    r = parse_prompt_bytes(b"alpha\n  alpha  \nbeta\nalpha\nAlpha\n", "p.txt")
    assert texts(r) == ["alpha", "beta", "Alpha"]
    assert [p.source_line for p in r.prompts] == [1, 3, 5]
    assert r.duplicates_removed == 2
    assert r.issues == []


def test_repeated_ids_are_made_unique() -> None:
    r = parse_prompt_bytes(jsonl({"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}), "p.jsonl")
    assert [p.prompt_id for p in r.prompts] == ["1", "1-2"]
    assert issue_strings(r) == ["line 2: id '1' is used more than once; renamed to '1-2'"]


# --- samples ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count", "category"),
    [
        ("code.jsonl", 12, "coding"),
        ("prose.txt", 10, None),
        ("summarisation.jsonl", 8, "summarization"),
        ("translation.jsonl", 10, "translation"),
    ],
)
def test_sample_sets_parse_cleanly(name: str, count: int, category: str | None) -> None:
    r = load_prompt_file(SAMPLES / name)
    assert r.issues == []
    assert r.duplicates_removed == 0
    assert len(r.prompts) == count
    assert {p.category for p in r.prompts} == {category}
    assert all(len(p.text) < 600 for p in r.prompts)


# --- files, lengths, summary ------------------------------------------------------------------------------------


def test_load_prompt_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="no such file"):
        load_prompt_file(tmp_path / "missing.txt")
    with pytest.raises(PromptFileError, match="is a directory, not a file"):
        load_prompt_file(tmp_path)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a\n" * 100)
    with pytest.raises(PromptFileError, match="file is 200 bytes; the limit is 50 bytes"):
        load_prompt_file(big, max_bytes=50)


def test_load_prompt_file_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked.txt"
    locked.write_text("hi\n")

    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", deny)
    with pytest.raises(PromptFileError, match="locked.txt: permission denied"):
        load_prompt_file(locked)


def test_check_prompt_lengths() -> None:
    prompts = [Prompt("one two three", None, 1, "a"), Prompt("one", None, 2, "b"), Prompt("boom", None, 3, "c")]

    def count(text: str) -> int:
        if text == "boom":
            raise RuntimeError("tokenizer broke")
        return len(text.split())

    assert [str(i) for i in check_prompt_lengths(prompts, count, max_tokens=2)] == [
        "line 1: prompt a is 3 tokens; the limit is 2",
        "line 3: could not count tokens (RuntimeError: tokenizer broke)",
    ]


def test_summarise() -> None:
    r = parse_prompt_bytes(jsonl({"prompt": "ab", "category": "x"}, {"prompt": "abcd", "category": "x"}, "abcdef"), "p")
    s = summarise(r, tokenizer_len=len)
    assert s["count"] == 3
    assert s["categories"] == {"x": 2, "(none)": 1}
    assert s["chars"] == {"min": 2, "max": 6, "mean": 4.0, "median": 4.0, "total": 12}
    assert s["char_lengths"] == [2, 4, 6]
    assert s["token_lengths"] == [2, 4, 6]
    assert "token_lengths" not in summarise(r)
