"""What the pages say reads as words a user knows, not raw ids: labels follow the state they describe, charts of
whole numbers tick at whole numbers, errors name a file once and list its bad lines (issue #21, items 10 and 11).

Pages run under streamlit.testing.v1.AppTest against a temporary database (the env fixture of
tests/test_app_pages.py); endpoint sessions run the real worker code against stand-in servers on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest
from test_app_pages import HOME, add_prompts, assert_clean, env, make_session, page, texts, unescape_md  # noqa: F401

from app import common, data, prompt_upload
from engine.analysis.export import export_formats
from engine.engines.endpoint.standin import StandIn
from engine.errors import PromptFileError
from engine.models.pool import ModelPool
from engine.service.endpoint_sessions import submit_endpoint_session
from engine.service.jobs import submit_session
from engine.service.worker.loop import run_session
from engine.session.spec import SessionSpec

ENDPOINTS = "pages/6_Endpoints.py"
ROOT = Path(__file__).resolve().parents[1]


def endpoint_prompts(store: Any) -> int:
    return add_prompts(store, [("a", None), ("b", None)], name="endpoint prompts")


def finished_endpoint_session(store: Any) -> int:
    with StandIn(flavor="vllm") as spec, StandIn(flavor="openai") as base:
        endpoint = {"url": spec.url, "baseline_url": base.url, "concurrency": [1, 2], "max_requests": 3}
        sid = submit_endpoint_session(store, endpoint, endpoint_prompts(store), max_new_tokens=8)
        run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1")
    return sid


def chart_specs(at: Any) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]


def x_axes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The x axes a chart's layers set (a rule layer sharing the x scale sets none)."""
    layers = spec.get("layer") or [spec]
    return [axis for layer in layers if (axis := (layer.get("encoding", {}).get("x") or {}).get("axis"))]


# ---------------------------------------------------------------------------------------------------------------------
# 10: the Endpoints page


def test_the_picker_and_cancel_follow_a_status_that_changed_while_the_results_polled(env, monkeypatch) -> None:  # noqa: F811
    sid = submit_endpoint_session(env.store, {"url": "http://127.0.0.1:9", "concurrency": [1]},
                                  endpoint_prompts(env.store))  # fmt: skip
    original = type(env.store).get_session
    finished: list[int] = []

    def get_session(self: Any, session_id: int) -> Any:  # the sweep ends just as the results fragment polls
        if session_id == sid and not finished:
            finished.append(session_id)
            env.store.claim_next_session("testhost:1")
            env.store.finish_session(sid, "done")
        return original(self, session_id)

    monkeypatch.setattr(type(env.store), "get_session", get_session)
    at = page(ENDPOINTS, {"session": str(sid)})
    assert_clean(at)
    assert finished == [sid]
    picker = at.selectbox(key="ep_session")
    assert picker.format_func(picker.value).endswith("(done)"), picker.format_func(picker.value)
    assert "ep_cancel" not in [b.key for b in at.button]


def test_check_endpoint_is_a_readable_summary_with_the_raw_answer_folded_away(env) -> None:  # noqa: F811
    with StandIn(flavor="vllm") as server:
        at = page(ENDPOINTS)
        at = at.text_input(key="ep_url").input(server.url).run()
        at = at.button(key="ep_check").click().run()
    assert_clean(at)
    headline = unescape_md(texts(at.success))
    assert "vLLM 0.33.0" in headline and "exposes speculation counters" in headline, headline
    facts = unescape_md(texts(at.markdown))
    assert "**Engine:** vLLM" in facts and "**Speculation counters:** exposed on /metrics" in facts, facts
    (raw,) = [e for e in at.expander if e.label == "Raw answer"]
    assert raw.proto.expanded is False and len(raw.json) == 1
    assert len(at.json) == 1  # no JSON outside the folded expander


def test_concurrency_is_ticked_at_the_measured_levels_as_whole_numbers(env) -> None:  # noqa: F811
    sid = finished_endpoint_session(env.store)
    at = page(ENDPOINTS, {"session": str(sid)})
    assert_clean(at)
    specs = chart_specs(at)
    assert len(specs) == 5
    for spec in specs:
        assert x_axes(spec), spec
        for axis in x_axes(spec):
            assert axis.get("values") == [1, 2] and axis.get("format") == "d", axis


def test_chunk_gaps_and_time_per_output_token_are_named_apart(env) -> None:  # noqa: F811
    sid = finished_endpoint_session(env.store)
    at = page(ENDPOINTS, {"session": str(sid)})
    assert_clean(at)
    levels = next(df.value for df in at.dataframe if "tokens/s" in df.value.columns and "acceptance" in df.value)
    columns = list(levels.columns)
    assert "chunk gap p50 s" in columns and "time per output token p50 s" in columns, columns
    assert not [c for c in columns if c.startswith(("ITL", "TPOT"))], columns
    note = unescape_md(texts(at.caption))
    assert "Chunk gap: the time between two streamed chunks" in note and "not a per-token time" in note
    assert "(last token − first token) ÷ (tokens − 1)" in note
    assert "chunk gap p50" in str(at.get("vega_lite_chart")[2].proto)


# ---------------------------------------------------------------------------------------------------------------------
# 11: raw ids and wording


def test_the_utilisation_legend_speaks_words(env) -> None:  # noqa: F811
    metrics = {"cpu_util_pct": 50.0, "other_cpu_pct": 10.0, "process_cpu_pct": 40.0, "sys_mem_used_pct": 60.0,
               "process_rss_gb": 1.0, "tensor_util_pct": 1.0}  # fmt: skip
    samples = [{"t": 0.0, "metrics": metrics}]
    assert set(data.utilisation_long(samples)["metric"]) == {
        "CPU (all)", "other processes", "this session", "memory used", "GPU tensor cores busy"}  # fmt: skip
    assert data.utilisation_label("new_thing_pct") == "new thing"
    sid = make_session(env.store, "running", name="live")
    at = page("pages/2_Run.py", {"session": str(sid)})
    assert_clean(at)
    utilisation = next(str(c.proto) for c in at.get("vega_lite_chart") if "Utilisation" in str(c.proto))
    assert "CPU (all)" in utilisation and "this session" in utilisation
    assert "cpu_util_pct" not in utilisation and "process_cpu_pct" not in utilisation


def test_a_queued_session_says_how_many_are_ahead_of_it(env, monkeypatch) -> None:  # noqa: F811
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: 4242)
    first = make_session(env.store, "queued", name="first")
    second = make_session(env.store, "queued", name="second")
    third = make_session(env.store, "queued", name="third")
    shown = {sid: unescape_md(texts(page("pages/2_Run.py", {"session": str(sid)}).info))
             for sid in (first, second, third)}  # fmt: skip
    assert "Queued: it is next" in shown[first], shown[first]
    assert "Queued: 1 session ahead of it" in shown[second], shown[second]
    assert "Queued: 2 sessions ahead of it" in shown[third], shown[third]
    assert not any("the sessions before it" in text for text in shown.values())


def test_a_cancelled_session_says_so_once(env) -> None:  # noqa: F811
    sid = make_session(env.store, "cancelled", name="stopped", error="cancelled by the user")
    for path in ("pages/2_Run.py", "pages/3_Sessions.py"):
        at = page(path, {"session": str(sid)})
        assert_clean(at)
        info = unescape_md(texts(at.info))
        assert "Cancelled by the user." in info and "Cancelled. cancelled" not in info, info
    assert data.cancelled_text(None) == "Cancelled."
    assert data.cancelled_text("worker lost") == "Cancelled: worker lost."


def test_a_refused_upload_names_the_file_once_and_lists_its_bad_lines(env) -> None:  # noqa: F811
    body = b"".join(b'{"wrong": %d}\n' % i for i in range(13))
    at = page("pages/1_Prompts.py")
    at.file_uploader(key="prompt_file").set_value(("wrongfield.jsonl", body, "application/json"))
    at.run()
    assert_clean(at)
    (error,) = [unescape_md(e.value) for e in at.error]
    assert error.count("wrongfield.jsonl") == 1, error
    assert error.startswith("Could not read wrongfield.jsonl: no prompts found (13 issues):"), error
    bullets = [line for line in error.splitlines() if line.startswith("- ")]
    assert len(bullets) == 11 and bullets[0].startswith("- line 1:") and bullets[9].startswith("- line 10:")
    assert bullets[-1] == "- and 3 more"


def test_the_refusal_counts_issues_the_parser_stopped_listing() -> None:
    exc = PromptFileError("f.jsonl: no prompts found", tuple(f"line {i}: bad" for i in range(1, 4)), 5000)
    assert str(exc) == "f.jsonl: no prompts found (5,000 issues; first: line 1: bad)"  # the command line's one line
    headline, lines = prompt_upload.refusal(exc, "f.jsonl")
    assert headline == "Could not read f.jsonl: no prompts found (5,000 issues):"
    assert lines == ["line 1: bad", "line 2: bad", "line 3: bad", "and 4,997 more"]
    assert prompt_upload.refusal(PromptFileError("f.txt: file is empty"), "f.txt") == (
        "Could not read f.txt: file is empty", [])  # fmt: skip


def test_home_lists_every_page(env) -> None:  # noqa: F811
    at = page(None)
    assert_clean(at)
    links = [link.proto.page for link in at.get("page_link")]
    assert links == ["Prompts", "Run", "Sessions", "Theory", "Recommend", "Endpoints", "Policies", "Watch"], links


def test_the_prompt_length_histogram_counts_in_whole_prompts(env) -> None:  # noqa: F811
    at = page("pages/1_Prompts.py")
    at.file_uploader(key="prompt_file").set_value(("two.txt", b"one prompt\nanother, longer prompt\n", "text/plain"))
    at.run()
    assert_clean(at)
    histogram = next(s for s in chart_specs(at) if "Prompt length" in json.dumps(s.get("title")))
    axis = histogram["encoding"]["y"]["axis"]
    assert axis.get("tickMinStep") == 1 and axis.get("format") == "d", axis


# ---------------------------------------------------------------------------------------------------------------------
# 11: the Policies page's exports


@pytest.fixture(scope="module")
def policy_session(tmp_path_factory):
    """One finished session with a recorded draft pass, in a SPECTUNE_HOME of its own."""
    from foundation.paths import default_database_url
    from store import open_store

    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECTUNE_HOME", str(home))
    mp.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    set_id, _, _ = store.add_prompt_set("p", None, [{"text": t} for t in ("hello world, this is", "abc abc abc ab")])
    spec = SessionSpec(target="tiny:1:48:2:64", drafts=["tiny:1:48:2:64~0.15"], gammas=[2], max_new_tokens=16,
                       dtype="float32", device="cpu", chat_template=False, detect_regime=False)  # fmt: skip
    sid = submit_session(store, spec, set_id, 2)
    assert run_session(store, store.claim_next_session("w1"), ModelPool(), "w1") == "done"
    yield sid
    store.close()
    mp.undo()


def test_policy_exports_are_named_by_their_engine_in_sentences(policy_session) -> None:
    st.cache_data.clear()
    at = AppTest.from_file(str(HOME), default_timeout=60)
    at.query_params.update({"session": str(policy_session)})
    at.switch_page("pages/7_Policies.py")
    at.run()
    assert_clean(at)
    buttons = [b.proto.label for b in at.get("download_button")]
    labels = [f.label for f in export_formats()]
    assert buttons and all(label.removeprefix("⬇ ") in labels for label in buttons), buttons
    assert "⬇ vLLM" in buttons and "⬇ llama.cpp" in buttons and "⬇ spectune record" in buttons, buttons
    captions = [unescape_md(e.label) for e in at.expander]
    exports = [c for c in captions if c.startswith(tuple(f.label for f in export_formats()))]
    assert exports and all(c.endswith(".") and " — " not in c for c in exports), captions
    assert not [c for c in captions if c.startswith(("vllm", "llamacpp"))], captions
    support = unescape_md(texts(at.caption))
    assert "llama.cpp: fixed γ" in support and "llamacpp:" not in support


# Characters a browser draws only with a colour-emoji font (Debian's Chromium has none: it drew boxes): pictographs,
# the dingbat and symbol emoji without a text glyph, and the emoji presentation selector.
EMOJI_ONLY = re.compile("[\U0001f000-\U0001faff\u2705\u26d4\u274c\u23e9-\u23fa\u231b\ufe0f]")  # ⏩..⏺: no text font


def test_no_page_needs_an_emoji_font() -> None:
    sources = [*sorted((ROOT / "app").rglob("*.py")), ROOT / "engine" / "service" / "report" / "document.py"]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sources
             for n, line in enumerate(path.read_text().splitlines(), 1) if EMOJI_ONLY.search(line)]  # fmt: skip
    assert not found, "use Streamlit's :material/…: icons (app.common.ICONS) or a text glyph:\n" + "\n".join(found)


def test_every_icon_is_one_of_streamlits_material_symbols() -> None:
    from streamlit.material_icon_names import ALL_MATERIAL_ICONS

    names = [icon.removeprefix(":material/").removesuffix(":") for icon in common.ICONS.values()]
    assert all(icon.startswith(":material/") for icon in common.ICONS.values())
    assert [n for n in names if n not in ALL_MATERIAL_ICONS] == []


def test_home_draws_its_links_with_material_icons(env) -> None:  # noqa: F811
    at = page(None)
    assert_clean(at)
    icons = [link.proto.icon for link in at.get("page_link")]
    assert icons and all(str(icon).startswith(":material/") for icon in icons), icons
