"""A full disk: the worker backs off and logs once per change, a session's end is spilled whole or not at all, and
readers show a session whose end waits for room as 'stalled' with its cause.

Real SQLite stores in tmp_path. The full disk is injected where the existing disk-full tests inject it: SQLITE_FULL
from the store's writes, ENOSPC from os.fsync; and a real write limit (RLIMIT_FSIZE) in a child process.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.service.worker.loop import WriteBackoff, _tidy
from foundation.paths import default_database_url
from store import Store, open_store
from store.errors import translated
from store.workers import make_worker_id
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]
FULL = "disk full: database spectune.db cannot be written: the disk is full (database or disk is full)"


def _disk_full(*args: Any, **kwargs: Any) -> None:
    """What every write does on a full disk: SQLITE_FULL, as the store reports it."""
    with translated("spectune.db"):
        raise sqlite3.OperationalError("database or disk is full")


@pytest.fixture
def store(home: Path) -> Store:
    opened = open_store(default_database_url())
    yield opened
    opened.close()


def running_session(store: Store) -> int:
    """A session claimed by this (live) process, as a worker's is while it decodes."""
    store_session(store, T5)
    sid = store.create_session(target="t", drafts=["d"], gammas=[4], temperatures=[0.0], max_new_tokens=8)
    assert store.claim_next_session(make_worker_id())["id"] == sid
    return sid


# --- the worker's back-off --------------------------------------------------------------------------------------


def test_the_wait_doubles_up_to_its_cap_and_comes_back() -> None:
    backoff = WriteBackoff(0.5, cap_s=8.0)
    waits = []
    for _ in range(7):
        backoff.failed("endings", "database x cannot be written: the disk is full")
        waits.append(backoff.wait_s)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert backoff.worked("endings") and backoff.wait_s == 0.5


def test_each_kind_of_write_clears_only_its_own_failure() -> None:
    backoff = WriteBackoff(0.5)
    assert backoff.failed("claim", "the disk is full (1)")  # news: writes worked until now
    assert not backoff.failed("endings", "the disk is full (2)")  # the same state, other words
    assert not backoff.worked("claim")  # the pending ends still wait
    assert backoff.failed("endings", "database x could not be read or written (disk I/O error)")  # a new reason
    assert backoff.worked("endings") and not backoff.worked("endings")


def test_the_worker_logs_a_full_disk_once_and_once_more_when_it_has_room(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backoff = WriteBackoff(0.5, cap_s=60.0)
    monkeypatch.setattr(Store, "settle_endings", _disk_full)
    with caplog.at_level(logging.INFO, logger="spectune.worker"):
        for _ in range(600):  # five minutes of twice-a-second polls
            _tidy(store, backoff)
        assert backoff.wait_s == 60.0
        monkeypatch.undo()
        for _ in range(5):
            _tidy(store, backoff)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "refuses writes" in lines[0] and "the disk is full" in lines[0]
    assert lines[1] == "the database takes writes again" and backoff.wait_s == 0.5


# --- the spill file ---------------------------------------------------------------------------------------------


def test_the_spill_is_not_written_at_all_when_the_disk_fills_while_it_is(
    home: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = running_session(store)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    store.record_ending(sid, "failed", FULL)
    monkeypatch.undo()
    endings = home / "spectune.db-endings"
    assert list(endings.iterdir()) == []  # neither an empty file nor a temporary one
    assert store.pending_ending(sid) == ("failed", FULL)  # this process still knows it


def test_the_spill_is_whole_or_absent_under_a_real_write_limit(home: Path, store: Store) -> None:
    sid = running_session(store)
    store.close()
    child = f"""
import resource, signal, sys
from store import open_store
store = open_store({default_database_url()!r})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
store.record_ending({sid}, "failed", "disk full: " + "x" * 5000)  # longer than any file may grow
store.record_ending({sid + 100}, "failed", "disk full: short")
"""
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    endings = home / "spectune.db-endings"
    assert sorted(p.name for p in endings.iterdir()) == [f"{sid + 100}.json"]  # the long one: absent, not cut
    assert json.loads((endings / f"{sid + 100}.json").read_text()) == {"status": "failed", "error": "disk full: short"}


def test_a_complete_spill_replaces_an_older_one(home: Path, store: Store) -> None:
    sid = running_session(store)
    store.record_ending(sid, "failed", "disk full: first")
    store.record_ending(sid, "failed", FULL)
    spill = home / "spectune.db-endings" / f"{sid}.json"
    assert json.loads(spill.read_text()) == {"status": "failed", "error": FULL}
    assert [p.name for p in spill.parent.iterdir()] == [spill.name]


# --- readers --------------------------------------------------------------------------------------------------------


def test_readers_show_a_session_whose_end_waits_as_stalled_with_its_cause(home: Path, store: Store) -> None:
    sid = running_session(store)
    store.record_ending(sid, "failed", FULL)  # its worker could not write the end: the disk is full
    store.close()
    db = home / "spectune.db"
    db.chmod(0o444)  # a reader that cannot write either (opened read-only), as while the disk stays full
    try:
        reader = open_store(default_database_url())
        try:
            assert reader.read_only
            shown = reader.get_session(sid)
            assert shown["status"] == "stalled" and shown["error"].startswith(FULL)
            assert [s["status"] for s in reader.list_sessions()] == ["stalled", "done"]
        finally:
            reader.close()
        env = {**os.environ, "SPECTUNE_HOME": str(home)}
        listing = subprocess.run([sys.executable, "-m", "engine", "sessions"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        assert listing.returncode == 0, listing.stderr
        row = next(line for line in listing.stdout.splitlines() if line.split()[:1] == [str(sid)])
        assert row.split()[1] == "stalled" and f"error: {FULL}" in listing.stdout
    finally:
        db.chmod(0o644)


def test_once_writes_work_the_pending_end_is_written(home: Path, store: Store) -> None:
    sid = running_session(store)
    store.record_ending(sid, "failed", FULL)
    store.close()
    later = open_store(default_database_url())  # another process, with room on the disk
    try:
        ended = later.get_session(sid)
        assert ended["status"] == "failed" and ended["error"] == FULL
    finally:
        later.close()
    assert not list((home / "spectune.db-endings").iterdir())


def test_every_page_says_which_session_is_stalled_and_why(home: Path, store: Store) -> None:
    from streamlit.testing.v1 import AppTest

    sid = running_session(store)
    store.record_ending(sid, "failed", FULL)
    store.close()
    (home / "spectune.db").chmod(0o444)  # the dashboard cannot write the end either
    try:
        for page in (None, "pages/3_Sessions.py", "pages/4_Theory.py"):
            at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60)
            if page:
                at.switch_page(page)
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            shown = [str(w.value).replace("\\", "") for w in at.warning if "is stalled" in str(w.value)]
            assert len(shown) == 1 and shown[0].startswith(f"Session {sid} is stalled: {FULL}"), page
    finally:
        (home / "spectune.db").chmod(0o644)


def test_the_run_page_watching_a_stalled_session_says_why_not_a_phase(home: Path, store: Store) -> None:
    from tests.test_app_pages import page

    sid = running_session(store)
    store.record_ending(sid, "failed", FULL)
    store.close()
    (home / "spectune.db").chmod(0o444)  # the dashboard cannot write the end either
    try:
        at = page("pages/2_Run.py", {"session": str(sid)})
    finally:
        (home / "spectune.db").chmod(0o644)
    assert not at.exception, [e.value for e in at.exception]
    said = "\n".join(str(m.value).replace("\\", "") for m in [*at.markdown, *at.caption])
    assert "⚠ **stalled**" in said and f"Stalled: {FULL}" in said, said
