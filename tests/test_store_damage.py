"""Damage is a state: a database that fails quick_check takes no new work, says so everywhere, and has a way out.

A real SQLite store in tmp_path gets one page overwritten (it still opens, the data is malformed). Then: storing
prompts, queuing, re-queuing and claiming a session are refused with the reason and the way out; the worker stops
(in-process and as a real `python -m engine worker` process, exit 2); every dashboard page shows a banner;
`backup` checks its copy and says plainly when it is damaged too (exit 1, an existing file never replaced by it);
`backup --recover` saves what can be read into a new file; `restore` puts a checked backup in place, keeps the file
it replaces, and refuses a damaged backup, a running worker and a session a live worker writes.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.paths import default_database_url
from store import DamagedStoreError, Store, open_store
from store.health import _checked
from store.recovery import integrity_problem, recover_into
from tests.cli_calls import cli
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]
PAGES = [None, "pages/1_Prompts.py", "pages/2_Run.py", "pages/3_Sessions.py", "pages/4_Theory.py",
         "pages/5_Recommend.py", "pages/6_Endpoints.py", "pages/7_Policies.py", "pages/8_Watch.py"]  # fmt: skip


def wreck_a_page(path: Path) -> None:
    """Overwrite one page near the end of the file (prompts, not the schema): it opens, its data is malformed."""
    data = bytearray(path.read_bytes())
    page = len(data) // 4096 - 2
    data[page * 4096 : (page + 1) * 4096] = bytes((i * 37 + 11) % 256 for i in range(4096))
    path.write_bytes(bytes(data))


def fill(store: Store) -> int:
    """A finished session, a queued one and a few hundred prompts (dozens of pages); the queued session's id."""
    store_session(store, T5)
    store.add_prompt_set("p", None, [{"text": f"prompt {i} " * 50} for i in range(200)])
    return store.create_session(target="t", drafts=["d"], gammas=[4], temperatures=[0.0], max_new_tokens=8)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$SPECTUNE_HOME whose spectune.db holds sessions and is then damaged (closed first: the WAL checkpointed)."""
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    fill(store)
    store.close()
    wreck_a_page(tmp_path / "spectune.db")
    _checked.clear()
    yield tmp_path
    _checked.clear()


def assert_way_out(message: str) -> None:
    assert "damaged" in message and "quick_check" in message, message
    assert "python -m engine backup" in message and "python -m engine restore" in message, message


def subprocess_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "SPECTUNE_HOME": str(home)}
    env.pop("SPECTUNE_DB_URL", None)
    return env


# --- new work refused ------------------------------------------------------------------------------------------------


def test_a_damaged_store_refuses_new_work_with_the_way_out(home: Path) -> None:
    store = open_store(default_database_url())
    try:
        assert store.damage
        before = [(s["id"], s["status"]) for s in store.list_sessions()]
        attempts = {
            "storing prompts": lambda: store.add_prompt_set("new", None, [{"text": "a new prompt"}]),
            "queuing a session": lambda: store.create_session(
                target="t", drafts=["d"], gammas=[4], temperatures=[0.0], max_new_tokens=8
            ),  # fmt: skip
            "re-queuing a session": lambda: store.requeue_session(1),
            "starting a session": lambda: store.claim_next_session("test:1"),
        }
        for what, attempt in attempts.items():
            with pytest.raises(DamagedStoreError) as refused:
                attempt()
            assert str(refused.value).startswith(f"{what} refused"), refused.value
            assert_way_out(str(refused.value))
        assert [(s["id"], s["status"]) for s in store.list_sessions()] == before  # reading still works
    finally:
        store.close()


def test_the_worker_stops_and_says_why(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    from engine.service.worker.loop import serve

    store = open_store(default_database_url())
    try:
        with caplog.at_level(logging.ERROR, logger="spectune.worker"):
            assert serve(store, once=True) == 0
        assert [s["status"] for s in store.list_sessions()] == ["queued", "done"]
    finally:
        store.close()
    stops = [r.getMessage() for r in caplog.records if "the worker stops" in r.getMessage()]
    assert len(stops) == 1 and "starting a session refused" in stops[0]
    assert_way_out(stops[0])


def test_the_worker_process_exits_2_and_submit_is_refused(home: Path) -> None:
    env = subprocess_env(home)
    worker = subprocess.run([sys.executable, "-m", "engine", "worker", "--once"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert worker.returncode == 2, worker.stderr
    assert "the worker stops: starting a session refused" in worker.stderr and "Traceback" not in worker.stderr
    prompts = home / "p.txt"
    prompts.write_text("hello world\n")
    submit = subprocess.run([sys.executable, "-m", "engine", "submit", "--target", "tiny:1:48:2:64", "--draft",
                             "tiny:1:48:2:64~0.15", "--engine", "spectune", "--prompts", str(prompts)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert submit.returncode == 2 and "Traceback" not in submit.stderr, submit.stderr
    error = [line for line in submit.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "refused" in error[0]
    assert_way_out(error[0])
    assert "queued session" not in submit.stdout


def test_every_page_shows_a_banner(home: Path) -> None:
    from streamlit.testing.v1 import AppTest

    for page in PAGES:
        at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60)
        if page:
            at.switch_page(page)
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        banners = [str(e.value).replace("\\", "") for e in at.error if "is damaged" in str(e.value)]
        assert len(banners) == 1, (page, [e.value for e in at.error])
        assert banners[0].startswith("The database") and "python -m engine restore" in banners[0]


# --- backup, recovery, restore ---------------------------------------------------------------------------------------


def test_backup_says_plainly_when_the_copy_is_damaged_too(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = home / "copy.db"
    code, out, err = cli(["backup", "--out", copy], capsys)
    assert code == 1 and "Traceback" not in err
    assert "but the copy is damaged too (integrity_check:" in out and "backup --recover --out NEW" in out
    assert integrity_problem(copy) is not None  # the copy holds the damage as it is: nothing hidden
    older = home / "older.db"
    older.write_bytes(b"an older, good backup")
    code, out, err = cli(["backup", "--out", older], capsys)
    assert code == 2 and "did not replace" in err and older.read_bytes() == b"an older, good backup"


def test_a_sound_backup_says_its_check_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    fill(store)
    store.close()
    code, out, _ = cli(["backup", "--out", tmp_path / "b.db"], capsys)
    assert code == 0 and "(integrity_check: ok)" in out


@pytest.mark.parametrize("use_cli", [False, True], ids=["row by row", "sqlite3 .recover"])
def test_recovery_saves_what_can_be_read_into_a_new_file(home: Path, use_cli: bool) -> None:
    if use_cli and not _sqlite3_recover_works(home):
        pytest.skip("the sqlite3 tool is missing here, or lacks .recover")
    out = home / "recovered.db"
    done = recover_into(home / "spectune.db", out, use_cli=use_cli)
    assert integrity_problem(out) is None
    assert ("sqlite3 .recover" in done.how) == use_cli
    with sqlite3.connect(out) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 2
        assert 0 < conn.execute("SELECT count(*) FROM prompts").fetchone()[0] <= 201
    with pytest.raises(Exception, match="new file only"):
        recover_into(home / "spectune.db", out, use_cli=use_cli)


def _sqlite3_recover_works(folder: Path) -> bool:
    tool = shutil.which("sqlite3")
    if tool is None:
        return False
    probe = folder / "probe.db"
    sqlite3.connect(probe).executescript("CREATE TABLE t(a); INSERT INTO t VALUES (1);").close()
    done = subprocess.run([tool, str(probe), ".recover"], capture_output=True, timeout=60, check=False)
    probe.unlink()
    return done.returncode == 0


def test_recover_then_restore_brings_the_store_back(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    damaged_bytes = (home / "spectune.db").read_bytes()
    code, out, err = cli(["backup", "--recover", "--out", home / "recovered.db"], capsys)
    assert code == 0 and "integrity_check: ok" in out, err
    code, out, err = cli(["restore", home / "recovered.db"], capsys)
    assert code == 0, err
    assert "restored" in out and "the database it replaced is kept as" in out
    kept = [p for p in home.iterdir() if p.name.startswith("spectune.db.before-restore-")]
    assert any(p.read_bytes() == damaged_bytes for p in kept)  # nothing already stored is lost
    store = open_store(default_database_url())
    try:
        assert store.damage is None
        assert len(store.list_sessions()) == 2
        store.add_prompt_set("after", None, [{"text": "new work is taken again"}])
    finally:
        store.close()


def test_restore_refuses_a_damaged_backup_and_changes_nothing(home: Path, capsys) -> None:
    shutil.copyfile(home / "spectune.db", home / "bad.db")
    before = (home / "spectune.db").read_bytes()
    code, _, err = cli(["restore", home / "bad.db"], capsys)
    assert code == 2 and "damaged too" in err and "nothing was restored" in err
    assert (home / "spectune.db").read_bytes() == before
    assert not [p for p in home.iterdir() if "before-restore" in p.name]


def test_restore_refuses_while_a_worker_runs(home: Path, capsys) -> None:
    good = home / "good.db"
    _good_backup(good)
    # a live process whose command line names engine and worker, recorded as this data folder's worker
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "engine", "worker"],
                               stdin=subprocess.PIPE)  # fmt: skip
    try:
        (home / "worker.pid").write_text(str(sleeper.pid))
        before = (home / "spectune.db").read_bytes()
        code, _, err = cli(["restore", good], capsys)
        assert code == 2 and f"a worker is running (pid {sleeper.pid})" in err and "nothing was changed" in err
        assert (home / "spectune.db").read_bytes() == before
    finally:
        sleeper.stdin.close()
        sleeper.wait(timeout=60)
    (home / "worker.pid").unlink()


def test_restore_refuses_while_a_live_worker_writes_a_session(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    queued = fill(store)
    from store.workers import make_worker_id

    store.claim_next_session(make_worker_id())  # this very process: alive, beating now
    store.close()
    good = tmp_path / "good.db"
    _good_backup(good)
    code, _, err = cli(["restore", good], capsys)
    assert code == 2 and f"session {queued} (worker" in err and "being written by a live worker" in err


def _good_backup(path: Path) -> None:
    store = open_store(f"sqlite:///{path}")
    store_session(store, T5)
    store.close()
