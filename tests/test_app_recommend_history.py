"""The Recommend page's saved-recommendation history under streamlit.testing.v1.AppTest.

The history lists every saved recommendation, whatever sessions the page has chosen, so each of its download
buttons names whose file it hands out (the recommendation, its configuration and its sessions) and no button on
the page shares a label with another.
"""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest

from engine.analysis.export import format_names
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean
from tests.test_app_pages import page as app_page
from tests.test_app_recommend import env as env  # noqa: F401 - the fixture: a fresh data home, no worker

PAGE = "pages/5_Recommend.py"
NGRAM = {"ngram": (0.6, 0.0, 1.6)}


def saved_on_the_page(sid: int) -> None:
    """Open the Recommend page on session `sid` and press 'Save to history', as a user does."""
    at = app_page(PAGE, {"session": str(sid)})
    at.button(key="rec_save").click()
    at.run()
    assert_clean(at)


def labels(at: AppTest) -> list[str]:
    return [b.proto.label for b in at.get("download_button")]


def history_labels(at: AppTest) -> list[str]:
    return [b.proto.label for b in at.get("download_button") if b.proto.id and "rec_hist_dl_" in b.proto.id]


def saved_gamma(store, rec_id: int) -> int:
    """The γ the saved vLLM file drafts (0 when it turns speculation off)."""
    (vllm,) = [e for e in store.list_exports(rec_id) if e["format"] == "vllm"]
    config = json.loads(vllm["content"])["speculative_config"]
    return 0 if config is None else int(config["num_speculative_tokens"])


def expected_words(store, rec_id: int) -> list[str]:
    """What a download of saved recommendation `rec_id` must name: it, its sessions and its configuration."""
    saved = next(r for r in store.list_recommendations() if r["id"] == rec_id)
    gamma = saved_gamma(store, rec_id)
    config = "speculation OFF" if gamma == 0 else f"{saved['payload']['draft']} γ={gamma}"
    sessions = ", ".join(f"#{s}" for s in saved["session_ids"])
    return [f"saved #{rec_id}:", config, f"session {sessions}"]


def test_each_saved_download_names_its_recommendation_sessions_and_configuration(env):
    store_session(env.store, T5, name="unsaved")  # session ids then differ from the saved recommendations' ids
    t5, ngram = store_session(env.store, T5, name="t5"), store_session(env.store, NGRAM, gamma=3, name="ngram")
    saved_on_the_page(t5)
    saved_on_the_page(ngram)
    by_session = {r["session_ids"][0]: r["id"] for r in env.store.list_recommendations()}
    at = app_page(PAGE, {"session": str(t5)})
    assert_clean(at)
    shown = labels(at)
    assert len(shown) == len(set(shown)), shown  # no two buttons look alike
    history = history_labels(at)
    assert len(history) == len(format_names())
    newest = by_session[ngram]  # the picker opens on the newest saved recommendation: another session's
    for label in history:
        assert all(word in label for word in expected_words(env.store, newest)), label
        assert f"#{t5}" not in label.split("session")[-1]
    at.selectbox(key="rec_history_pick").set_value(by_session[t5]).run()
    assert_clean(at)
    history = history_labels(at)
    assert len(history) == len(format_names())
    for label in history:
        assert all(word in label for word in expected_words(env.store, by_session[t5])), label
    assert saved_gamma(env.store, by_session[t5]) >= 1 and "t5-small γ=" in history[0]
