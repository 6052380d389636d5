"""Suffix decoding on the Run page: offered beside n-gram, queued like any draft, a bad spec one clear error."""

from __future__ import annotations

from test_app_pages import (  # noqa: F401 - env: fixture
    add_prompts,
    assert_clean,
    env,
    fill_run_form,
    page,
    queue_drafts,
    texts,
)


def test_run_page_offers_suffix_beside_ngram_and_queues_it(env):  # noqa: F811
    add_prompts(env.store, [("p1", None), ("p2", None)])
    at = page("pages/2_Run.py")
    at.radio(key="engine").set_value("spectune").run()  # without a GPU, llama.cpp (no suffix decoding) may be default
    options = at.multiselect(key="drafts_choice").options
    assert "ngram" in options and "suffix" in options
    queue_drafts(at, ["suffix"], "suffix:24:1:0.1:0")
    (session,) = env.store.list_sessions()
    assert session["drafts"] == ["suffix", "suffix:24:1:0.1:0"]


def test_run_page_names_a_bad_suffix_spec(env):  # noqa: F811
    add_prompts(env.store, [("p1", None), ("p2", None)])
    for ref, needle in (("suffix:0", "DEPTH"), ("suffix:abc", "bad suffix spec")):
        at = page("pages/2_Run.py")
        fill_run_form(at)
        at.text_input(key="drafts_text").input(ref)
        at.button(key="start_session").click()
        at.run()
        assert_clean(at)
        assert needle in texts(at.error) and "Traceback" not in texts(at.error)
    assert env.store.list_sessions() == []


def test_sessions_view_states_the_order_and_the_cache_warmth() -> None:
    from app import sessions_view

    summary = {"suffix_cache": {"prompt_order": ["p0", "p1", "p2"], "runs": {
        "suffix γ=4 T=0": [{"cached_before": 0, "warm": False}, {"cached_before": 1, "warm": True},
                           {"cached_before": 2, "warm": True}],
        "suffix:24:1:0.1:0 γ=4 T=0": [{"cached_before": 0, "warm": False}] * 3,
    }}}  # fmt: skip
    note = sessions_view.suffix_cache_note({"summary": summary})
    assert "order p0, p1, p2" in note
    assert "suffix γ=4 T=0: warm from prompt 2 (responses cached: 0, 1, 2)" in note
    assert "suffix:24:1:0.1:0 γ=4 T=0: cold throughout" in note
    assert sessions_view.suffix_cache_note({"summary": {}}) is None
