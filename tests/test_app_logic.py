"""The dashboard's pure helpers: form parsing, escaping, token highlighting, tables, the chapter's numbers."""

from __future__ import annotations

import pytest

from app import data, prompt_upload, render, theory_tables
from app.common import esc, md_escape
from engine.errors import PromptFileError, SettingsError

XSS = "<script>alert(1)</script>"


@pytest.mark.parametrize(
    "text, expected",
    [("1,2,4,8", [1, 2, 4, 8]), (" 8 4; 4 2 ", [2, 4, 8]), ("1-4", [1, 2, 3, 4]), ("3,1-2", [1, 2, 3])],
)
def test_parse_int_list(text, expected):
    assert data.parse_int_list(text) == expected


@pytest.mark.parametrize("text, needle", [("1,x", "'x'"), ("", "no γ"), ("4-1", "backwards"), ("1.5", "'1.5'")])
def test_parse_int_list_errors_name_the_item(text, needle):
    with pytest.raises(SettingsError, match=needle):
        data.parse_int_list(text)


def test_parse_float_list():
    assert data.parse_float_list("0, 0.7 0.7") == [0.0, 0.7]
    with pytest.raises(SettingsError, match="'warm'"):
        data.parse_float_list("0, warm")
    with pytest.raises(SettingsError, match="finite"):
        data.parse_float_list("nan")


def test_parse_refs_keeps_paths_with_spaces():
    assert data.parse_refs("tiny:1~0.1, /models/my draft\nngram") == ["tiny:1~0.1", "/models/my draft", "ngram"]


def test_highlight_tokens_escapes_every_token_and_marks_the_source():
    out = render.highlight_tokens(["<scr", "ipt>", "a&b", "\n", '"x"'], [True, False, True, False])
    assert "<scr" not in out.replace("<span", "").replace("</span", "")
    assert "&lt;scr" in out and "ipt&gt;" in out and "a&amp;b" in out and "&quot;x&quot;" in out
    assert out.count('class="tok-draft"') == 2 and out.count('class="tok-target"') == 3
    assert "↵\n" in out


def test_plain_text_box_escapes():
    assert "&lt;script&gt;" in render.plain_text_box(XSS) and "<script>" not in render.plain_text_box(XSS)


def test_escaping_helpers():
    assert esc(XSS) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    escaped = md_escape("**b** [l](javascript:x) ![i](u) $x$ <b>")
    for raw in ("**", "[l]", "](", "![", "$x$", "<b>"):
        assert raw not in escaped


def test_theory_tables_reproduce_the_chapter():
    ag = theory_tables.alpha_gamma_table()
    assert list(ag["Latency"]) == ["2.18× faster", "2.46× faster", "3.60× faster", "4.16× faster", "3.44× faster",
                                   "5.70× faster"]  # fmt: skip
    assert list(ag["Arithmetic"]) == ["1.84× more", "3.25× more", "2.22× more", "1.92× more", "1.16× more",
                                      "1.40× more"]  # fmt: skip
    cost = theory_tables.cost_table()
    assert list(cost["compute-bound"]) == ["+225%", "+122%", "+40%"]
    cross = theory_tables.crossover_table()
    assert list(cross["Crossover"]) == ["γ=3", "γ=5", "γ=10", "γ=24", "none below γ=32"]
    assert list(cross["Just before it"])[:4] == [
        "γ=2: 1.75× speed, 1.71× ops",
        "γ=4: 2.31× speed, 2.17× ops",
        "γ=9: 3.24× speed, 3.09× ops",
        "γ=23: 4.98× speed, 4.82× ops",
    ]
    paradox = theory_tables.paradox_table()
    predicted = [float(x.rstrip("×")) for x in paradox["Predicted (Thm 3.8)"]]
    assert predicted[2] < predicted[0]  # T5-large: best α, yet slower than T5-small (c went from 2% to 11%)


def test_tables_from_store_dicts_handle_missing_values():
    runs = [
        {"id": 1, "kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.0, "tokens_per_s": 10.0},
        {"id": 2, "kind": "speculative", "draft": "ngram", "gamma": 4, "temperature": 0.0, "speedup_measured": None,
         "speedup_predicted": 1.3},
    ]  # fmt: skip
    frame = data.runs_frame(runs)
    assert list(frame.columns) == data.RUN_COLUMNS and len(frame) == 2
    long = data.speedup_long(runs)
    assert list(long["which"]) == ["predicted"]
    assert data.fidelity_frame(runs, {}).empty
    assert data.category_frame(runs, {}, []).empty
    assert data.utilisation_long([]).empty
    assert data.best_speedup({"summary": None}) is None
    assert data.best_speedup({}, runs) is None


def test_fidelity_and_categories_map_outputs_to_prompts():
    prompts = [{"id": 10, "text": "a", "category": "code"}, {"id": 11, "text": "b", "category": "prose"}]
    runs = [{"id": 1, "kind": "baseline"}, {"id": 2, "kind": "speculative", "draft": "d", "gamma": 2, "temperature": 0}]
    out = {
        1: [{"prompt_index": 0, "prompt_id": "10", "token_ids": [1, 2], "wall_time_s": 2.0, "from_draft": [0, 0]},
            {"prompt_index": 1, "prompt_id": "11", "token_ids": [1, 2], "wall_time_s": 1.0, "from_draft": [0, 0]}],
        2: [{"prompt_index": 0, "prompt_id": "10", "token_ids": [1, 2], "wall_time_s": 1.0, "from_draft": [1, 0],
             "divergence": {"verdict": "bug", "position": 1, "margin": 3.0, "tolerance": 0.5}},
            {"prompt_index": 1, "prompt_id": "zz", "token_ids": [1, 2], "wall_time_s": 1.0, "from_draft": [0, 0],
             "divergence": {"verdict": "identical", "identical": True}}],
    }  # fmt: skip
    fid = data.fidelity_frame(runs, out, prompts)
    assert list(fid["verdict"]) == ["bug", "identical"]
    assert list(fid["category"]) == ["code", "prose"]  # by prompt id, then by position
    cats = data.category_frame(runs, out, prompts).set_index("category")
    assert cats.loc["code", "speedup"] == pytest.approx(2.0) and cats.loc["prose", "speedup"] == pytest.approx(1.0)
    assert cats.loc["code", "draft share"] == pytest.approx(0.5)


def test_prompt_upload_helpers():
    parsed = prompt_upload.parse_pasted('{"prompt": "x", "category": "c"}\n{"prompt": ', "jsonl")
    assert parsed.summary["count"] == 1 and len(prompt_upload.issues_frame(parsed)) == 1
    assert list(prompt_upload.categories_frame(parsed)["category"]) == ["c"]
    assert list(prompt_upload.lengths_frame(parsed).columns) == ["characters"]
    with pytest.raises(PromptFileError, match="nothing pasted"):
        prompt_upload.parse_pasted("   ")
    names = [p.name for p in prompt_upload.sample_files()]
    assert {"code.jsonl", "prose.txt", "summarisation.jsonl", "translation.jsonl"} <= set(names)
    assert prompt_upload.size_limit_text() == "10 MB"
