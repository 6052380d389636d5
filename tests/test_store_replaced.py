"""A database deleted, moved or replaced under a running process is noticed by inode, and never silently recreated.

Real SQLite stores in tmp_path, the file removed or swapped with os.unlink/os.rename while a Store holds it open:
the store names what happened and refuses new work; no command starts a new empty database where the old one's WAL
is still in use; the worker stops and says why (and a session it runs ends interrupted in the file it holds);
every dashboard page shows a banner, and follows a file put back in its place.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.service.cli.main import main
from engine.service.worker import store_hooks
from engine.service.worker.loop import _stopped, serve
from engine.service.worker.store_hooks import StoreHooks
from foundation.paths import default_database_url
from store import DamagedStoreError, Store, StoreError, open_store
from store.recovery import integrity_problem
from store.workers import make_worker_id
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]
PAGES = [None, "pages/1_Prompts.py", "pages/2_Run.py", "pages/3_Sessions.py", "pages/4_Theory.py",
         "pages/5_Recommend.py", "pages/6_Endpoints.py", "pages/7_Policies.py", "pages/8_Watch.py"]  # fmt: skip


@pytest.fixture
def store(home: Path) -> Store:
    """An open store holding a finished session, its WAL in use (as a worker's is)."""
    opened = open_store(default_database_url())
    store_session(opened, T5)
    yield opened
    opened.close()


def queue_one(store: Store) -> int:
    return store.create_session(target="t", drafts=["d"], gammas=[4], temperatures=[0.0], max_new_tokens=8)


def test_the_store_names_a_deleted_moved_or_replaced_file(home: Path, store: Store) -> None:
    db = home / "spectune.db"
    assert store.replaced() is None
    os.rename(db, home / "moved.db")
    assert store.replaced() == f"database {db} was deleted or moved while in use"
    shutil.copyfile(home / "moved.db", db)  # same bytes, another file
    assert store.replaced() == f"database {db} was replaced by another file while in use"
    os.unlink(db)
    os.rename(home / "moved.db", db)  # the very file back in its place
    assert store.replaced() is None


def test_new_work_is_refused_once_the_file_is_gone(home: Path, store: Store) -> None:
    os.unlink(home / "spectune.db")
    for attempt in (lambda: queue_one(store), lambda: store.add_prompt_set("p", None, [{"text": "x"}])):
        with pytest.raises(DamagedStoreError, match="deleted or moved while in use") as refused:
            attempt()
        assert "python -m engine restore" in str(refused.value)


def test_no_new_database_is_made_where_the_old_one_s_wal_is_in_use(home: Path, store: Store) -> None:
    db = home / "spectune.db"
    wal = Path(f"{db}-wal")
    assert wal.exists()
    os.unlink(db)
    wal_bytes = wal.read_bytes()
    with pytest.raises(StoreError, match="is missing but its -wal and -shm file is still there"):
        open_store(default_database_url())
    env = {**os.environ, "SPECTUNE_HOME": str(home)}
    listing = subprocess.run([sys.executable, "-m", "engine", "sessions"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    lines = [line for line in listing.stderr.splitlines() if line.strip()]
    assert listing.returncode == 2 and len(lines) == 1 and "nothing was created" in lines[0], listing.stderr
    assert not db.exists() and wal.read_bytes() == wal_bytes  # the worker's writes are where it left them
    store.close()  # no process has the deleted file open now: what it left is set aside, and a new one starts
    fresh = open_store(default_database_url())
    try:
        assert fresh.list_sessions() == []
        aside = sorted(p.name.split(".left-")[0] for p in home.iterdir() if ".left-" in p.name)
        assert aside == ["spectune.db-shm", "spectune.db-wal"]
    finally:
        fresh.close()


def test_an_open_store_never_creates_a_new_file_at_its_path(home: Path, store: Store) -> None:
    db = home / "spectune.db"
    store.close()  # the WAL checkpointed and removed: nothing but the file
    os.unlink(db)
    with pytest.raises(StoreError, match="cannot be opened"):
        store.list_sessions()  # a new connection of the same store
    assert not db.exists()
    fresh = open_store(default_database_url())  # a new database where nothing is left is fine
    try:
        assert fresh.list_sessions() == []
    finally:
        fresh.close()


def test_the_worker_stops_says_why_and_saves_what_the_deleted_file_held(
    home: Path, store: Store, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    queued = queue_one(store)
    os.unlink(home / "spectune.db")
    with caplog.at_level(logging.ERROR, logger="spectune.worker"):
        assert serve(store, once=False) == 0  # returns at once, not polling an empty queue
    stops = [r.getMessage() for r in caplog.records if "the worker stops" in r.getMessage()]
    assert len(stops) == 1 and "deleted or moved while in use" in stops[0] and "engine restore" in stops[0]
    saved = [p for p in home.iterdir() if p.name.startswith("spectune.db.saved-") and not p.name.endswith("-wal")]
    assert len(saved) == 1 and str(saved[0]) in stops[0]
    store.close()  # the worker exits: the deleted file is gone for good, but not what it held
    assert integrity_problem(saved[0]) is None and not Path(f"{saved[0]}-wal").exists()  # one whole file
    assert main(["restore", str(saved[0])]) == 0, capsys.readouterr().err
    back = open_store(default_database_url())
    try:
        assert sorted(s["id"] for s in back.list_sessions()) == [1, queued]
    finally:
        back.close()


def test_a_file_renamed_over_the_open_one_leaves_what_the_open_one_held_saved(
    home: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Another database moved over the path (not a restore: the worker still runs) replaces the file the worker
    writes to. The worker stops, and what the file it held had, the session it queued included, is saved for
    `restore`; the file now at the path is left as it is."""
    queued = queue_one(store)
    other = home / "other.db"
    sqlite3.connect(other).close()  # an empty database of someone else's
    os.rename(other, home / "spectune.db")
    before = (home / "spectune.db").read_bytes()
    with caplog.at_level(logging.ERROR, logger="spectune.worker"):
        assert serve(store, once=False) == 0
    stops = [r.getMessage() for r in caplog.records if "the worker stops" in r.getMessage()]
    assert len(stops) == 1 and "replaced by another file while in use" in stops[0], stops
    saved = [p for p in home.iterdir() if p.name.startswith("spectune.db.saved-") and not p.name.endswith("-wal")]
    assert len(saved) == 1 and str(saved[0]) in stops[0]
    assert (home / "spectune.db").read_bytes() == before  # the other file, untouched
    store.close()
    assert integrity_problem(saved[0]) is None
    with sqlite3.connect(saved[0]) as copy:
        assert queued in {row[0] for row in copy.execute("SELECT id FROM sessions")}


def test_a_running_session_stops_within_one_heartbeat_and_ends_interrupted(
    home: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = queue_one(store)
    worker = make_worker_id()
    assert store.claim_next_session(worker)["id"] == sid
    hooks = StoreHooks(store, sid, worker)
    os.rename(home / "spectune.db", home / "elsewhere.db")
    monkeypatch.setattr(store_hooks, "HEARTBEAT_S", 0.0)
    hooks._beat_loop()  # one beat: it finds the file gone and stops beating
    assert hooks.replaced and hooks.should_stop()
    assert _stopped(store, sid, hooks) == "interrupted"
    os.rename(home / "elsewhere.db", home / "spectune.db")  # the file back: the session's end is in it
    ended = store.get_session(sid)
    assert ended["status"] == "interrupted" and "deleted or moved while in use" in ended["error"]
    assert "requeue --session" in ended["error"]


def test_a_session_whose_file_is_deleted_after_its_last_step_is_spilled_not_ended_done(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The file deleted after the session decoded, before its end and before any heartbeat looked: the session is
    not ended `done` into the deleted file; it ends cut short, and is spilled for the next database."""
    from engine.service.worker import loop
    from tests.test_worker import open_db, queue

    opened = open_db(home)
    sid = queue(opened)
    monkeypatch.setattr(store_hooks, "HEARTBEAT_S", 3600.0)  # no beat looks at the file during the session
    summarised = loop._session_summary

    def deleted_then_summarised(*args: Any) -> dict[str, Any]:
        os.unlink(home / "spectune.db")
        return summarised(*args)

    monkeypatch.setattr(loop, "_session_summary", deleted_then_summarised)
    try:
        with caplog.at_level(logging.INFO, logger="spectune.worker"):
            assert serve(opened, once=True) == 1
    finally:
        opened.close()
    said = [r.getMessage() for r in caplog.records]
    assert f"session {sid}: interrupted" in said, said
    stops = [line for line in said if "the worker stops" in line]
    assert len(stops) == 1 and f"Session {sid}, which it was running, is spilled to" in stops[0], stops
    assert not (home / "spectune.db").exists()


def test_every_page_shows_a_banner_and_follows_a_restored_file(home: Path, store: Store) -> None:
    from streamlit.testing.v1 import AppTest

    db = home / "spectune.db"

    def run(page: str | None) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60)
        if page:
            at.switch_page(page)
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        return at

    run(None)  # the dashboard opens the database
    os.rename(db, home / "aside.db")
    for page in PAGES:
        banners = [str(e.value).replace("\\", "") for e in run(page).error if "deleted or moved" in str(e.value)]
        assert len(banners) == 1 and "python -m engine restore" in banners[0], page
    shutil.copyfile(home / "aside.db", db)  # a file put back in its place, as a restore does
    at = run("pages/3_Sessions.py")
    assert any("now show the file at that path" in str(e.value).replace("\\", "") for e in at.info)
    assert not [e for e in at.error if "deleted or moved" in str(e.value)]
    assert not [e for e in run(None).error if "deleted or moved" in str(e.value)]


def test_a_real_worker_whose_database_is_deleted_mid_session(home: Path) -> None:
    """The reported loss: the worker kept writing the deleted file and logged `session 1: done`, and the next command
    made a new empty database over the path. Now the worker stops, the session it ran is spilled, and the next
    command's new database gets it back (each measured prompt once), ready to requeue and finish."""
    from tests.test_worker import open_db, queue_long, start_worker, worker_log
    from tests.test_worker_recovery import _outputs, _step_keys

    first = open_db(home)
    sid = queue_long(first)
    first.close()
    db = home / "spectune.db"
    env = {**os.environ, "SPECTUNE_HOME": str(home)}
    worker = subprocess.Popen([sys.executable, "-m", "engine", "worker", "--once"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        while not session_figure(db, sid, STEPS_SQL):  # the session has measured steps (a state, not a duration)
            assert worker.poll() is None, worker.stderr.read()
            time.sleep(0.05)
        os.unlink(db)
        _, log = worker.communicate(timeout=300)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 2, log
    assert f"session {sid}: interrupted" in log and "the worker stops: database" in log
    assert f"Session {sid}, which it was running, is spilled to" in log
    assert not db.exists()  # nothing made a new file at the path
    saved = next(p for p in home.iterdir() if p.name.startswith("spectune.db.saved-") and not p.name.endswith("-wal"))
    measured = session_figure(saved, sid, STEPS_SQL)
    assert measured > 0

    listing = subprocess.run([sys.executable, "-m", "engine", "sessions"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert listing.returncode == 0, listing.stderr  # a new database, the old one's leftovers set aside
    back = open_store(default_database_url())
    try:
        ended = back.get_session(sid)
        assert ended["status"] == "interrupted" and "deleted or moved while in use" in ended["error"]
        assert "replayed here from" in ended["error"] and "interrupted" in listing.stdout
        assert len(_step_keys(back, sid)) == measured
        kept = set(_outputs(back, sid))
        assert back.requeue_session(sid)
        second = start_worker(home, "--once", log_name="worker2.out")
        assert second.wait(300) == 0, worker_log(home)
        resumed = back.get_session(sid)
        assert resumed["status"] == "done", resumed["error"]
        outputs = _outputs(back, sid)
        assert kept <= set(outputs) and len(outputs) == len(set(outputs))  # what it measured, reused, none twice
    finally:
        back.close()


STEPS_SQL = "SELECT count(*) FROM steps JOIN runs ON runs.id = steps.run_id WHERE runs.session_id = ?"


def session_figure(db: Path, session_id: int, sql: str = "SELECT status FROM sessions WHERE id = ?") -> Any:
    """The session's stored status (or what ``sql`` asks of it), read without writing; None while the file cannot
    be read."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = conn.execute(sql, (session_id,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return None if row is None else row[0]
