"""Endpoint sessions through the store and the worker, on SQLite and PostgreSQL (tests/conftest.py's `store`).

Requests go only to stand-in servers started here on 127.0.0.1 (engine.engines.endpoint.standin).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError

from engine.engines.endpoint.standin import StandIn
from engine.errors import SettingsError
from engine.models.pool import ModelPool
from engine.service.endpoint_sessions import endpoint_spec, submit_endpoint_session
from engine.service.worker.loop import run_session
from engine.session.spec import SessionSpec

WORKER = "testhost:4242"


def prompt_set(store: Any, n: int = 4) -> int:
    set_id, _, _ = store.add_prompt_set("ep", "ep.txt", [{"text": f"prompt {i}", "category": None} for i in range(n)])
    return set_id


def settings(url: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, "concurrency": [1, 2], "max_requests": 4, "request_timeout_s": 5.0} | extra


def run_claimed(store: Any) -> str:
    session = store.claim_next_session(WORKER)
    return run_session(store, session, ModelPool(), WORKER)


def row(**overrides: Any) -> dict[str, Any]:
    return {"endpoint": "speculative", "concurrency": 1, "request_index": 0, "prompt_index": 0,
            "started_at": time.time(), "ok": True, "ttft_s": 0.1, "itl_s": [0.01, 0.02], "output_tokens": 3,
            "duration_s": 0.2, "draft_n": 6, "draft_n_accepted": 4} | overrides  # fmt: skip


def test_requests_are_stored_read_back_and_deleted_with_their_session(store: Any) -> None:
    sid = store.create_session(target="m", drafts=["http://127.0.0.1:1"], gammas=[], temperatures=[0.0],
                               max_new_tokens=8)  # fmt: skip
    assert store.add_endpoint_requests(sid, [row(request_index=i, concurrency=c) for c in (2, 1) for i in (1, 0)]) == 4
    assert store.add_endpoint_requests(sid, []) == 0
    rows = store.list_endpoint_requests(sid)
    assert [(r["concurrency"], r["request_index"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert rows[0]["itl_s"] == [0.01, 0.02] and rows[0]["ok"] is True and rows[0]["retries"] == 0
    assert store.list_endpoint_requests(sid, "baseline") == [] and store.count_endpoint_requests(sid) == 4
    with pytest.raises(TypeError, match="unknown fields"):
        store.add_endpoint_requests(sid, [row(api_key="x")])
    with pytest.raises(TypeError, match="missing fields"):
        store.add_endpoint_requests(sid, [{"endpoint": "speculative"}])
    with pytest.raises(IntegrityError):
        store.add_endpoint_requests(sid + 99, [row()])  # no such session: the foreign key refuses it
    store.finish_session(sid, "done")
    assert store.delete_session(sid) and store.count_endpoint_requests(sid) == 0


def test_an_endpoint_session_runs_in_the_worker_and_every_request_is_stored(store: Any) -> None:
    with StandIn(flavor="vllm") as spec, StandIn(flavor="openai") as base:
        sid = submit_endpoint_session(store, settings(spec.url, baseline_url=base.url, ttft_slo_s=5.0),
                                      prompt_set(store), max_new_tokens=8)  # fmt: skip
        session = store.get_session(sid)
        assert session["options"]["engine"] == "endpoint" and session["drafts"] == [spec.url, base.url]
        assert SessionSpec.from_row(session).engine_options.url == spec.url
        assert run_claimed(store) == "done"
    done = store.get_session(sid)
    report = done["summary"]["endpoint"]
    rows = store.list_endpoint_requests(sid)
    levels = [lv for e in report["endpoints"] for lv in e["levels"]]
    assert len(rows) == sum(lv["requests"] for lv in levels) == 2 * 2 * 4  # 2 endpoints × 2 levels × 4
    assert {(r["endpoint"], r["concurrency"]) for r in rows} == {(e, c) for e in ("speculative", "baseline")
                                                                 for c in (1, 2)}  # fmt: skip
    assert all(r["ok"] and r["output_tokens"] == 8 and r["ttft_s"] is not None for r in rows)
    assert report["endpoints"][0]["engine"] == "vllm" and levels[0]["drafts"] > 0
    assert report["comparison"]["points"] and report["comparison"]["verdict"]
    assert done["hardware"].startswith("remote endpoint: ")
    runs = store.list_runs(sid)  # the one driver's runs: each (endpoint, level), each measured side by side
    assert sorted((r["kind"], r["status"]) for r in runs) == [("baseline", "done")] * 2 + [("speculative", "done")] * 2
    assert all(r["speedup_measured"] > 0 for r in runs if r["kind"] == "speculative")


def test_a_stopped_sweep_fails_the_session_and_keeps_its_requests(store: Any) -> None:
    with StandIn(mode="garbage") as server:
        sid = submit_endpoint_session(store, settings(server.url), prompt_set(store), max_new_tokens=8)
        assert run_claimed(store) == "failed"
    session = store.get_session(sid)
    assert "sent a stream event that is not JSON" in session["error"]
    assert store.count_endpoint_requests(sid) == 3  # the run of errors that stopped it, each with its message
    assert session["summary"]["endpoint"]["stopped"] == session["error"]


def test_a_cancel_ends_an_endpoint_session_and_keeps_what_it_measured(store: Any) -> None:
    with StandIn(tokens=4, delay_s=0.05) as server:
        sid = submit_endpoint_session(store, settings(server.url, max_requests=200), prompt_set(store),
                                      max_new_tokens=4)  # fmt: skip
        session = store.claim_next_session(WORKER)
        store.request_cancel(sid)
        assert run_session(store, session, ModelPool(), WORKER) == "cancelled"
    assert store.get_session(sid)["status"] == "cancelled" and store.count_endpoint_requests(sid) < 200


def test_the_api_key_is_never_stored(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_TEST_KEY", "sk-very-secret-value")
    with StandIn(flavor="llama.cpp", api_key="sk-very-secret-value") as server:
        sid = submit_endpoint_session(store, settings(server.url, api_key_env="SPECTUNE_TEST_KEY"), prompt_set(store),
                                      max_new_tokens=8)  # fmt: skip
        assert run_claimed(store) == "done"
        assert set(server.auth_headers) == {"Bearer sk-very-secret-value"}
    dump = json.dumps([store.get_session(sid), store.list_endpoint_requests(sid)], default=str)
    assert "SPECTUNE_TEST_KEY" in dump and "sk-very-secret-value" not in dump


def test_bad_endpoint_sessions_are_refused_before_queueing(store: Any) -> None:
    set_id = prompt_set(store)
    refused = [
        ({"url": "http://u:p@h"}, "credentials"),
        ({"url": "http://h", "concurrency": [128]}, "out of range"),
        ({"url": "http://h", "api_key": "x"}, "unknown endpoint settings"),
    ]
    for endpoint, needle in refused:
        with pytest.raises(SettingsError, match=needle):
            submit_endpoint_session(store, endpoint, set_id)
    with pytest.raises(SettingsError, match="does not exist"):
        submit_endpoint_session(store, {"url": "http://h"}, set_id + 99)
    assert store.list_sessions() == []
    assert endpoint_spec({"url": "http://h/v1"}).drafts == ["http://h"]
