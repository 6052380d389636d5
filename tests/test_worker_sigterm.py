"""The README's claim: on SIGTERM the worker finishes the current step, marks the session interrupted and exits
within seconds. Checked on a real worker process decoding a tiny model (the llama.cpp case is in
tests/test_llamacpp.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from store import Store
from tests.test_worker import home, open_db, queue_long, start_worker, step_count, store, wait_for  # noqa: F401

WITHIN_S = 10.0


def test_the_worker_exits_within_seconds_of_sigterm(home: Path, store: Store) -> None:  # noqa: F811
    sid = queue_long(store)
    worker = start_worker(home)
    try:
        wait_for(lambda: step_count(store, sid) >= 5, 180, "the session to log steps")
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
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
