"""The dashboard's pure helpers: form parsing, escaping, token highlighting, tables, the paper's numbers."""

from __future__ import annotations

import pandas as pd
import pytest

from app import data, prompt_upload, render, run_view, sessions_view, theory_tables
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


def test_theory_tables_reproduce_the_paper():
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


def test_the_best_speedup_is_a_clear_one_and_a_noisy_best_says_so():
    """Seen in a walk on a llama.cpp session: History and `engine sessions` showed "best 1.05×", n-gram γ=2's
    per-prompt median (0.19–1.12× across prompts, too noisy to tell; 0.57× over the whole run) at 1.00 tokens per
    call, above a clear win. A clear speedup beats any too noisy to tell; a noisy best, when no run is clear, is
    said noisy, on the page and in the CLI alike."""
    from engine.session.summarise import best_speedup

    noisy = {
        "kind": "speculative",
        "speedup_measured": 1.05,
        "speedup_flag": None,
        "speedup_spread": {"median": 1.05, "min": 0.19, "max": 1.12, "n": 6, "verdict": "too noisy to tell"},
    }
    clear = {
        "kind": "speculative",
        "speedup_measured": 1.02,
        "speedup_flag": None,
        "summary": {"speedup_spread": {"median": 1.02, "min": 1.0, "max": 1.04, "n": 6, "verdict": "faster"}},
    }
    assert best_speedup([noisy, clear]).text() == "1.02×"  # a runs row and a summary run, read alike
    assert best_speedup([noisy]).text() == "1.05× (too noisy to tell)"
    frame = data.sessions_frame([{"id": 7}], {7: data.best_speedup({"summary": {"runs": [noisy]}})})
    assert frame["best speedup"].tolist() == ["1.05× (too noisy to tell)"]


def test_a_policy_run_shows_its_policy_and_its_live_and_replayed_speedups():
    # a policy run is stored with γ 0 and empty speedup columns (kept from the fixed-γ recommender)
    live = {"policy": "confidence:0.6:8:0", "speedup_measured": 0.56, "replayed": {"speedup": 0.61}}
    runs = [
        {"id": 1, "kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.0, "tokens_per_s": 27.4},
        {"id": 2, "kind": "speculative", "draft": "qwen2.5-coder-0.5b", "gamma": 0, "temperature": 0.0,
         "speedup_measured": None, "speedup_predicted": None,
         "summary": {"policy": "confidence:0.6:8:0", "policy_live": live}},
    ]  # fmt: skip
    row = data.runs_frame(runs).iloc[1]
    assert row["policy"] == "confidence:0.6:8:0" and pd.isna(row["γ"])
    assert (row["speedup measured"], row["speedup predicted"]) == (0.56, 0.61)
    assert data.run_label(runs[1]) == "qwen2.5-coder-0.5b policy confidence:0.6:8:0 T=0"
    long = data.speedup_long(runs)
    assert list(long["which"]) == ["measured", "predicted"] and list(long["speedup"]) == [0.56, 0.61]


def test_a_policy_run_shows_its_live_spread_and_verdict_beside_its_live_speedup():
    # the live figure is measured prompt by prompt beside a fresh target alone: its spread says how far to trust it
    spread = {"min": 0.41, "median": 0.55, "max": 0.74, "verdict": "slower", "n": 6}
    live = {"policy": "confidence:0.6:8:0", "speedup_measured": 0.56, "replayed": {"speedup": 0.61},
            "speedup_spread": spread}  # fmt: skip
    runs = [
        {"id": 1, "kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.0, "tokens_per_s": 27.4},
        {"id": 2, "kind": "speculative", "draft": "qwen2.5-coder-0.5b", "gamma": 0, "temperature": 0.0,
         "summary": {"policy": "confidence:0.6:8:0", "policy_live": live}},
    ]  # fmt: skip
    from app import sessions_view as sv
    from engine.service.report.runs import run_figures

    row = sv.runs_table(runs).iloc[1]
    assert (row["speedup measured"], row["per-prompt spread"], row["verdict"]) == (
        0.56,
        "0.41–0.74× (median 0.55×)",
        "slower (noisy)",
    )
    figures = run_figures(runs, {}, {})[1]
    assert figures.spread == spread and figures.verdict == "slower (noisy)"


def test_the_runs_table_shows_each_speedups_judgement_before_the_wide_columns():
    """The Sessions page's runs table: measured speedup, bound, verdict and prediction side by side, before the
    throughputs and the spread (on a 1400 px screen they are in view unscrolled, tests/test_browser_walk.py);
    a column that is the same on every row (no policy, one temperature) is left out."""
    from app import sessions_view as sv

    spread = {"min": 0.9, "median": 1.1, "max": 1.3, "verdict": "faster", "n": 3}
    runs = [
        {"id": 1, "kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.0, "tokens_per_s": 10.0,
         "status": "done"},
        {"id": 2, "kind": "speculative", "draft": "ngram", "gamma": 3, "temperature": 0.0, "tokens_per_s": 11.0,
         "tokens_per_call": 1.5, "speedup_measured": 1.1, "speedup_predicted": 1.2, "status": "done",
         "summary": {"speedup_spread": spread}},
        {"id": 3, "kind": "speculative", "draft": "ngram", "gamma": 5, "temperature": 0.0, "tokens_per_s": 30.0,
         "tokens_per_call": 1.5, "speedup_measured": 3.0, "speedup_predicted": 1.3, "status": "done",
         "summary": {"speedup_spread": spread, "speedup_flag": "impossible: 3.00× above 1.50 tokens per call"}},
    ]  # fmt: skip
    table = sv.runs_table(runs)
    columns = list(table.columns)
    judged = ["speedup measured", "bound", "verdict", "speedup predicted"]
    assert columns[columns.index("speedup measured") : columns.index("speedup measured") + 4] == judged
    assert columns[-3:] == ["tokens/s", "baseline tokens/s", "per-prompt spread"]
    assert "policy" not in columns and "T" not in columns and "status" not in columns
    assert table.iloc[2]["bound"] == "⚠ impossible" and "impossible" in table.iloc[2]["verdict"]
    runs[2]["temperature"] = 0.7
    assert "T" in sv.runs_table(runs).columns  # two temperatures: the column tells the runs apart


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
    # each speculative run against the target alone it was compared with: at T=0.8 its own baseline, which took
    # twice as long per token as T=0's (seen: every run divided by the session's first baseline)
    hot = [{"id": 3, "kind": "baseline", "temperature": 0.8},
           {"id": 4, "kind": "speculative", "draft": "d", "gamma": 2, "temperature": 0.8}]  # fmt: skip
    out[3] = [dict(o, wall_time_s=o["wall_time_s"] * 2) for o in out[1]]
    out[4] = out[2]
    both = data.category_frame([{**runs[0], "temperature": 0}, runs[1], *hot], out, prompts)
    hot_code = both[(both["run"] == data.run_label(hot[1])) & (both["category"] == "code")]
    assert hot_code["speedup"].iloc[0] == pytest.approx(4.0)
    cold_code = both[(both["run"] == data.run_label(runs[1])) & (both["category"] == "code")]
    assert cold_code["speedup"].iloc[0] == pytest.approx(2.0)


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


def test_run_form_choices():
    from engine.models.bundled import DEFAULT_DRAFT, DEFAULT_TARGET

    assert DEFAULT_TARGET not in run_view.draft_options(DEFAULT_TARGET)
    assert run_view.default_drafts(run_view.draft_options(DEFAULT_DRAFT)) == []
    note = run_view.target_note(DEFAULT_TARGET, "float32")
    assert note == f"{DEFAULT_TARGET}: GGUF Q4_K_M, dequantised to float32 for this engine"
    assert run_view.target_note("/models/x.gguf", "bfloat16") == "GGUF file, dequantised to bfloat16 for this engine"
    assert run_view.target_note("tiny:1:48:2:64", "float32") is None
    assert run_view.prompt_count_limits(6) == (6, 6)
    assert run_view.prompt_count_limits(20) == (20, 8)
    assert run_view.prompt_count_limits(None) == (1, 1)
    assert run_view.effective_target("bundled", "  typed ") == "typed"
    assert run_view.effective_target("bundled", "") == "bundled"


def test_session_spec_from_the_form_state():
    state = {"target_choice": "qwen2.5-coder-1.5b", "target_text": "tiny:1:48:2:64", "drafts_choice": ["ngram"],
             "drafts_text": "tiny:1:48:2:64~0.15, ngram", "gammas_choice": [4, 1], "gammas_text": "",
             "temps_text": "0, 0.7", "max_new": 24, "dtype": "float32", "prompt_set": 3, "n_prompts": 2,
             "measure_verify": False, "unrelated": "ignored"}  # fmt: skip
    spec, set_id, count = run_view.session_spec(run_view.RunForm.from_state(state))
    assert (spec.target, spec.drafts, spec.gammas) == ("tiny:1:48:2:64", ["ngram", "tiny:1:48:2:64~0.15"], [1, 4])
    assert (spec.temperatures, spec.max_new_tokens, spec.measure_verify_cost) == ([0.0, 0.7], 24, False)
    assert (set_id, count) == (3, 2)
    with pytest.raises(SettingsError, match="no prompt set"):
        run_view.session_spec(run_view.RunForm.from_state({**state, "prompt_set": None}))
    with pytest.raises(SettingsError, match="no draft"):
        run_view.session_spec(run_view.RunForm.from_state({**state, "drafts_choice": [], "drafts_text": ""}))


def test_live_view_helpers_number_prompts_from_one():
    sessions = [{"id": 3, "status": "done"}, {"id": 2, "status": "queued"}, {"id": 1, "status": "running"}]
    assert run_view.session_to_watch(sessions) == 1
    assert run_view.session_to_watch(sessions[:2]) == 2
    assert run_view.session_to_watch([]) is None
    run = {"kind": "speculative", "draft": "d", "gamma": 2, "temperature": 0.0}
    assert run_view.output_title(run, {"prompt_index": 0}) == "d γ=2 T=0, prompt 1"
    assert data.prompt_number({"prompt_index": 4}) == 5 and data.prompt_number({}) is None
    assert run_view.speed_delta(150.0, 100.0) == "+50% vs baseline (1.50×)" and run_view.speed_delta(None, 1.0) is None
    progress = {"tokens_per_s": 10.0, "draft_acceptance_rate": 0.5, "tokens_per_call": 1.5, "steps": 4}
    final = run_view.live_numbers({"tokens_per_s": 12.0, "tokens_per_call": None}, progress, final=True)
    assert final == {**progress, "tokens_per_s": 12.0}


def test_sessions_view_helpers():
    facts = dict(sessions_view.facts({"target": "t", "drafts": ["a", "b"], "gammas": [1, 2], "temperatures": [0]}))
    assert facts["drafts"] == "a, b" and facts["T"] == "0"
    assert facts["max new tokens"] == "—" and facts["prompts"] == "— (set #—)"  # never a literal None
    assert sessions_view.hardware_label({"summary": {"hardware": {"label": "H200"}}}) == "H200"
    assert sessions_view.hardware_label({"summary": None}) == "not recorded yet"
    assert sessions_view.regime_details(None) is None
    assert sessions_view.regime_details({"label": "memory-bound", "evidence": "flat"})[1] == ["flat"]
    assert sessions_view.fidelity_message({"bug": 2, "identical": 1})[0] == "error"
    assert sessions_view.fidelity_message({"numerical near-tie": 1})[0] == "info"
    assert sessions_view.fidelity_message({"identical": 3})[0] == "success"
    assert sessions_view.fidelity_message({}) is None
    prompts = [{"id": 7, "text": "hello"}]
    assert sessions_view.output_prompt_text({"prompt_id": "7"}, prompts) == "hello"
    assert "no longer stored" in sessions_view.output_prompt_text({"prompt_id": "9", "prompt_index": 5}, prompts)


def test_prompt_set_tables_number_from_one():
    stored = [{"id": 1, "position": 0, "text": "a", "category": None}, {"id": 2, "position": 1, "text": "b"}]
    frame = prompt_upload.stored_prompts_frame(stored)
    assert list(frame["#"]) == [1, 2] and list(frame["category"]) == ["", ""]
    sets = prompt_upload.sets_frame([{"id": 4, "name": "s", "n_prompts": None}])
    assert sets.iloc[0]["prompts"] == 0 and sets.iloc[0]["file"] == ""
    assert data.prompt_set_label({"id": 4, "name": "x" * 80, "n_prompts": 3}).endswith("… (3 prompts)")
    parsed = prompt_upload.parse_pasted('{"turns": ["q1", "q2"]}', "jsonl")
    assert "multi-turn records: the first user turn is used" in prompt_upload.preview_caption(parsed)


def test_theory_source_is_named():
    assert theory_tables.SOURCE == (
        'Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023'
    )


def test_per_token_text_hides_special_tokens() -> None:
    """Outputs are shown token by token; a chat model's end-of-turn marker must not appear as raw <|im_end|>."""
    from engine.service.jobs import _tokenizer, token_strings

    ref = "qwen2.5-coder-1.5b"
    tok = _tokenizer(ref)
    ids = tok.encode("def f():", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    strings = token_strings(ref, ids)
    assert "".join(strings) == "def f():" and strings[-1] == ""


def test_the_regime_heading_says_when_the_regime_was_assumed():
    from app.recommend_view import regime_heading

    assert regime_heading("compute-bound", "compute-bound") == "Regime: compute-bound"
    assert regime_heading("memory-bound", "unknown") == "Regime: memory-bound (assumed: the evidence says unknown)"
    assert regime_heading("memory-bound", "measurement error").endswith("the evidence says measurement error)")


def test_each_run_is_shown_beside_the_baseline_at_its_own_temperature() -> None:
    from app.data import runs_frame

    runs = [
        {"kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.0, "tokens_per_s": 10.0},
        {"kind": "baseline", "draft": "none", "gamma": 0, "temperature": 0.8, "tokens_per_s": 5.0},
        {"kind": "speculative", "draft": "ngram", "gamma": 2, "temperature": 0.8, "tokens_per_s": 7.5},
        {"kind": "speculative", "draft": "ngram", "gamma": 2, "temperature": 0.0, "tokens_per_s": 12.0},
    ]
    frame = runs_frame(runs)
    assert list(frame["baseline tokens/s"]) == [10.0, 5.0, 5.0, 10.0]


def test_the_engine_is_in_every_session_label_and_in_history() -> None:
    from app.common import session_label
    from app.data import sessions_frame

    torch_run = {"id": 1, "name": "n", "status": "done", "options": {"engine": "spectune"}}
    llama_run = {"id": 2, "name": "n", "status": "done", "options": {"engine": "llama.cpp"}}
    assert session_label(torch_run) != session_label(llama_run)
    assert "llama.cpp" in session_label(llama_run) and "spectune" in session_label({"id": 3, "status": "queued"})
    frame = sessions_frame([torch_run, llama_run], {})
    assert list(frame["engine"]) == ["spectune", "llama.cpp"]
