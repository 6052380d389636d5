"""On SIGTERM the worker finishes the current step, marks the session interrupted and exits within seconds.

The claim of docs/engines.md (llama.cpp's section), checked on a real worker process decoding a tiny model (the
llama.cpp case is in tests/test_llamacpp.py)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from store import Store
from tests.test_worker import open_db, queue_long, start_worker, step_count, store, wait_for  # noqa: F401

WITHIN_S = 10.0


def test_the_worker_exits_within_seconds_of_sigterm(home: Path, store: Store) -> None:  # noqa: F811
    sid = queue_long(store)
    worker = start_worker(home)
    try:
        wait_for(lambda: step_count(store, sid) >= 5, 180, "the session to log steps")
        assert (home / "worker.pid").read_text().strip() == str(worker.pid)
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        # seen: a session queued while the worker finished its step was told "worker running" and then waited for
        # a worker that never claimed it; a stopping worker is no longer the one the dashboard finds
        wait_for(lambda: not (home / "worker.pid").exists(), 5, "the stopping worker to give up its pid file")
        worker.wait(timeout=120)
        took = time.monotonic() - sent
        print(f"worker exited {took:.2f} s after SIGTERM (code {worker.returncode})")
        assert worker.returncode == 0
        assert took < WITHIN_S, f"{took:.1f} s"
        session = open_db(home).get_session(sid)
        assert session["status"] == "interrupted" and "requeue" in session["error"]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_stopping_worker_leaves_another_workers_pid_file(home: Path, monkeypatch) -> None:  # noqa: F811
    from engine.service.worker.control import release_pid_file, worker_pid_path

    monkeypatch.setenv("SPECTUNE_HOME", str(home))
    worker_pid_path().write_text("4242")
    release_pid_file(4243)
    assert worker_pid_path().read_text() == "4242"
    release_pid_file(4242)
    assert not worker_pid_path().exists()


# --- llama.cpp: a stop does not wait for what is running (a SIGTERM during v(k) took 74 s to exit) -------------


def test_llama_bench_is_killed_as_soon_as_the_session_stops() -> None:
    from engine.engines.llamacpp.bench import _run
    from engine.errors import SpectuneError

    started = time.monotonic()
    try:
        _run(["sleep", "30"], 600.0, lambda: time.monotonic() > started + 0.5)
    except SpectuneError as exc:
        assert "stopped" in str(exc)
    else:
        raise AssertionError("llama-bench was not stopped")
    assert time.monotonic() - started < 3.0


def test_a_request_in_flight_is_cut_short_by_a_stop() -> None:
    import pytest

    from engine.core.records import Cancelled
    from engine.engines.llamacpp.runner import LlamaCppRunner

    stopped = threading.Event()  # a stopped server drops its connection: the request ends with an error

    def request() -> None:
        stopped.wait(30.0)
        raise ConnectionResetError("the server went away")

    server = type("Server", (), {"stop": lambda self, timeout_s=5.0: stopped.set()})()
    runner = LlamaCppRunner()
    started = time.monotonic()
    runner.should_stop = lambda: time.monotonic() > started + 0.5
    with pytest.raises(Cancelled):
        runner._until_stopped(server, request)  # type: ignore[arg-type, return-value]
    assert time.monotonic() - started < 2.0
    runner.servers = {"config": server}  # type: ignore[dict-item]
    runner.stop()  # what the sweep does next: the server goes, and the request with it
    assert stopped.is_set() and runner.servers == {}
    runner.should_stop = lambda: False
    assert runner._until_stopped(server, lambda: "done") == "done"  # type: ignore[arg-type, comparison-overlap]
