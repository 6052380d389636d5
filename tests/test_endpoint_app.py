"""The Endpoints page under streamlit.testing.v1.AppTest, against a temporary database.

Finished sessions are produced by the real worker code against stand-in servers on 127.0.0.1; the worker
process itself is replaced by a recorder (as in tests/test_app_pages.py). Every other page must still render
with an endpoint session in the database.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from engine.engines.endpoint.standin import StandIn
from engine.models.pool import ModelPool
from engine.service.endpoint_sessions import submit_endpoint_session
from engine.service.worker.loop import run_session
from foundation.paths import default_database_url
from store import open_store

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "app" / "Home.py"
PAGE = "pages/6_Endpoints.py"
OTHER_PAGES = ["pages/1_Prompts.py", "pages/2_Run.py", "pages/3_Sessions.py", "pages/4_Theory.py",
               "pages/5_Recommend.py"]  # fmt: skip


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    import engine.service.api

    calls: list[int] = []

    def ensure_worker() -> str:
        calls.append(1)
        return "worker running (pid 4242)"

    monkeypatch.setattr(engine.service.api, "ensure_worker", ensure_worker)
    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    store = open_store(default_database_url())
    yield SimpleNamespace(store=store, worker_calls=calls)
    store.close()


def page(path: str | None = PAGE, query: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(HOME), default_timeout=30)
    if query:
        at.query_params.update(query)
    if path:
        at.switch_page(path)
    return at.run()


def clean(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements).replace("\\", "")


def add_prompts(store) -> int:
    set_id, _, _ = store.add_prompt_set("demo", "demo.txt", [{"text": t, "category": None} for t in ("a", "b")])
    return set_id


def finished_session(store, **extra) -> int:
    with StandIn(flavor="vllm") as spec, StandIn(flavor="openai") as base:
        endpoint = {"url": spec.url, "baseline_url": base.url, "concurrency": [1, 2], "max_requests": 3} | extra
        sid = submit_endpoint_session(store, endpoint, add_prompts(store), max_new_tokens=8)
        run_session(store, store.claim_next_session("testhost:1"), ModelPool(), "testhost:1")
    return sid


def test_the_page_renders_empty(env) -> None:
    at = clean(page())
    assert "No endpoint sessions yet" in texts(at.info) and "no prompt set yet" in texts(at.info)


def test_queue_an_endpoint_session_from_the_form(env) -> None:
    add_prompts(env.store)
    at = clean(page())
    at.text_input(key="ep_url").input("http://127.0.0.1:8000/v1")
    at.text_input(key="ep_model").input("Qwen/Qwen2.5-Coder-7B-Instruct")
    at.text_input(key="ep_key_env").input("VLLM_API_KEY")
    at.text_input(key="ep_baseline").input("http://127.0.0.1:8001")
    at.text_input(key="ep_levels").input("8,1,2")
    at = clean(at.button(key="ep_queue").click().run())
    assert "Queued as session" in texts(at.success) and env.worker_calls == [1]
    (session,) = env.store.list_sessions()
    options = session["options"]["engine_options"]
    assert session["options"]["engine"] == "endpoint" and session["target"] == "Qwen/Qwen2.5-Coder-7B-Instruct"
    assert options["url"] == "http://127.0.0.1:8000" and options["baseline_url"] == "http://127.0.0.1:8001"
    assert options["concurrency"] == [1, 2, 8] and options["api_key_env"] == "VLLM_API_KEY"


@pytest.mark.parametrize(("url", "levels", "needle"), [
    ("http://user:pw@host:8000", "1,2", "credentials in the URL are refused"),
    ("http://host:8000", "1,128", "concurrency 128 is out of range: 1 to 64"),
    ("host:8000", "1", "must start with http"),
])  # fmt: skip
def test_bad_settings_are_one_clear_error(env, url: str, levels: str, needle: str) -> None:
    add_prompts(env.store)
    at = page()
    at.text_input(key="ep_url").input(url)
    at.text_input(key="ep_levels").input(levels)
    at = clean(at.button(key="ep_queue").click().run())
    assert needle in texts(at.error) and env.store.list_sessions() == []


def test_check_endpoint_names_engine_version_and_metrics(env) -> None:
    with StandIn(flavor="vllm") as server:
        at = page()
        at = at.text_input(key="ep_url").input(server.url).run()  # the button is enabled once a URL is there
        at = clean(at.button(key="ep_check").click().run())
    shown = str(at.json[0].value)
    assert "vllm" in shown and "0.33.0" in shown and "speculation counters found" in shown


def test_finished_session_shows_levels_charts_and_the_measured_flip(env) -> None:
    sid = finished_session(env.store, ttft_slo_s=5.0)
    at = clean(page(query={"session": str(sid)}))
    frames = [df.value for df in at.dataframe]
    levels = next(f for f in frames if "tokens/s" in f.columns and "acceptance" in f.columns)
    assert sorted(zip(levels["endpoint"], levels["concurrency"], strict=True)) == [
        ("baseline", 1), ("baseline", 2), ("speculative", 1), ("speculative", 2)]  # fmt: skip
    assert levels[levels["endpoint"] == "speculative"]["acceptance"].notna().all()
    assert any(w in texts(at.markdown) for w in ("stops paying", "paid at every", "did not pay"))
    charts = at.get("vega_lite_chart")
    assert len(charts) == 5  # throughput, TTFT, ITL, goodput, speedup
    speedup = str(charts[-1].proto)  # its data travels as Arrow: the series names are in there
    assert "predicted (memory-bound theory)" in speedup and "measured speedup" in speedup


def test_running_and_failed_sessions_show_what_was_measured(env) -> None:
    with StandIn(mode="garbage") as server:
        sid = submit_endpoint_session(env.store, {"url": server.url, "concurrency": [1]}, add_prompts(env.store))
        run_session(env.store, env.store.claim_next_session("testhost:1"), ModelPool(), "testhost:1")
    at = clean(page(query={"session": str(sid)}))
    assert "Stopped:" in texts(at.error) and "not JSON" in texts(at.error)
    live = submit_endpoint_session(env.store, {"url": "http://127.0.0.1:9", "concurrency": [1, 2]},
                                   add_prompts(env.store))  # fmt: skip
    env.store.claim_next_session("testhost:2")
    env.store.add_endpoint_requests(live, [
        {"endpoint": "speculative", "concurrency": 1, "request_index": i, "prompt_index": i, "started_at": 100.0 + i,
         "ok": True, "ttft_s": 0.1, "itl_s": [0.02], "output_tokens": 4, "duration_s": 0.5, "tpot_s": 0.1}
        for i in range(3)])  # fmt: skip
    at = clean(page(query={"session": str(live)}))
    assert "3 requests so far" in texts(at.info)
    assert any("tokens/s" in df.value.columns for df in at.dataframe)


@pytest.mark.parametrize("path", [None, *OTHER_PAGES])
def test_every_other_page_renders_with_an_endpoint_session(env, path: str | None) -> None:
    finished_session(env.store)
    clean(page(path))


def test_the_page_is_layout_only() -> None:
    text = (ROOT / "app" / PAGE).read_text(encoding="utf-8")
    assert text.count("\n") <= 200 and "sys.path" not in text
