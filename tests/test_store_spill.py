"""A session spilled from a database deleted under its worker is replayed into the next database at that path.

Real SQLite stores in tmp_path. A half-measured session (a finished baseline, a speculative run cut off mid-prompt,
steps, outputs and utilisation samples) is held open while its file is deleted; the file's saved copy is spilled
into the endings folder, and whatever opens the path next (a new database, or a backup put in place) gets the
session back, interrupted and ready to requeue, exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from engine.core.records import PromptOutput, StepRecord
from foundation.paths import default_database_url
from store import Store, open_store
from store.leftovers import set_aside
from store.spill import endings_folder, spill_path


def open_here() -> Store:
    return open_store(default_database_url())


def half_measured(store: Store) -> int:
    """A running session: its baseline finished over 3 prompts, its draft run cut off in the second prompt."""
    set_id, _, _ = store.add_prompt_set("p3", "p3.txt", [{"text": f"prompt {i}", "category": "c"} for i in range(3)])
    sid = store.create_session(name="half", target="t", drafts=["ngram"], gammas=[2], temperatures=[0.0],
                               max_new_tokens=4, prompt_set_id=set_id, n_prompts=3)  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    _decode(store, base, prompts=3, steps=4, gamma=0)
    store.finish_run(base, {"tokens_per_s": 10.0}, tokens_per_s=10.0)
    draft = store.create_run(sid, "ngram", 2, 0.0, "speculative")
    _decode(store, draft, prompts=1, steps=2, gamma=2, cut_off_steps=1)
    store.add_utilisation_samples(sid, [{"t": 1.0 + i, "source": "cpu", "metrics": {"cpu_pct": 50.0}} for i in
                                        range(2)], run_id=draft)  # fmt: skip
    return sid


def _decode(store: Store, run_id: int, prompts: int, steps: int, gamma: int, cut_off_steps: int = 0) -> None:
    with store.step_writer(run_id) as writer:
        for prompt in range(prompts + (1 if cut_off_steps else 0)):
            done = prompt < prompts
            for step in range(steps if done else cut_off_steps):
                writer.add(StepRecord(prompt, step, gamma, min(gamma, 1), [True] * min(gamma, 1), [1.0] * gamma,
                                      0.001, 0.002, gamma, 1 + min(gamma, 1)))  # fmt: skip
            if done:
                ids = list(range(steps))
                store.add_output(run_id, PromptOutput(prompt, str(prompt), 3, ids, "text", [False] * steps, 0.01,
                                                      steps))  # fmt: skip


def measured(store: Store, session_id: int) -> dict[str, object]:
    """What a session holds, without ids: its runs' configurations, steps, outputs and samples."""
    with store.engine.connect() as conn:

        def rows(sql: str) -> list[tuple]:
            return [tuple(r) for r in conn.execute(text(sql), {"s": session_id})]

        return {
            "runs": rows("SELECT draft, gamma, kind, status FROM runs WHERE session_id = :s ORDER BY id"),
            "steps": rows("SELECT r.draft, s.prompt_index, s.step_index, s.accepted, s.accept_mask FROM steps s "
                          "JOIN runs r ON r.id = s.run_id WHERE r.session_id = :s ORDER BY s.id"),
            "outputs": rows("SELECT r.draft, o.prompt_index, o.token_ids FROM outputs o JOIN runs r ON "
                            "r.id = o.run_id WHERE r.session_id = :s ORDER BY o.id"),
            "samples": rows("SELECT u.t, u.metrics, r.draft FROM utilisation_samples u LEFT JOIN runs r ON "
                            "r.id = u.run_id WHERE u.session_id = :s ORDER BY u.id"),
        }  # fmt: skip


def delete_and_spill(home: Path, store: Store, session_id: int) -> Path:
    """Delete the database under ``store``, save what it held and spill the session, as the worker does."""
    os.unlink(home / "spectune.db")
    saved = store.save_open_copy()
    assert saved is not None
    spill = store.spill_from_copy(saved, session_id)
    assert spill == spill_path(home / "spectune.db", session_id) and spill.is_file()
    return saved


def test_a_spilled_session_is_replayed_into_a_new_database_once_and_requeues(home: Path) -> None:
    old = open_here()
    sid = half_measured(old)
    before = measured(old, sid)
    assert len(before["steps"]) == 3 * 4 + 2 + 1 and len(before["outputs"]) == 4 and len(before["samples"]) == 2
    delete_and_spill(home, old, sid)
    assert old.replay_spills() == []  # the store that holds the deleted file never replays into it
    old.close()
    fresh = open_here()  # a new database at the path: the spill goes in as it opens
    try:
        ended = fresh.get_session(sid)
        assert ended["status"] == "interrupted" and ended["name"] == "half"
        assert f"replayed here from session-{sid}.spill.json (session {sid} there)" in ended["error"]
        assert f"requeue --session {sid}" in ended["error"]
        after = measured(fresh, sid)
        assert after["steps"] == before["steps"] and after["outputs"] == before["outputs"]
        assert after["samples"] == before["samples"]
        assert after["runs"] == [("none", 0, "baseline", "done"), ("ngram", 2, "speculative", "cancelled")]
        assert [p["text"] for p in fresh.get_prompts(ended["prompt_set_id"])] == ["prompt 0", "prompt 1", "prompt 2"]
        assert not any(endings_folder(home / "spectune.db").iterdir())
        assert fresh.requeue_session(sid)
    finally:
        fresh.close()
    again = open_here()
    try:
        assert [s["id"] for s in again.list_sessions()] == [sid] and measured(again, sid)["steps"] == before["steps"]
    finally:
        again.close()


def test_a_backup_taken_while_the_session_ran_gets_what_it_measured_since(home: Path) -> None:
    old = open_here()
    sid = half_measured(old)
    other = old.create_session(name="other", target="t", drafts=["ngram"], gammas=[1], temperatures=[0.0],
                               max_new_tokens=4)  # fmt: skip
    backup = home / "backup.db"
    with old.engine.connect() as conn:
        conn.exec_driver_sql(f"VACUUM INTO '{backup}'")  # a backup taken while the session ran
    later = old.create_run(sid, "ngram", 3, 0.0, "speculative")  # measured after the backup was taken
    _decode(old, later, prompts=2, steps=3, gamma=3)
    newest = measured(old, sid)
    assert len(newest["runs"]) == 3
    delete_and_spill(home, old, sid)
    old.close()
    shutil.copyfile(backup, home / "spectune.db")  # the backup put in place
    restored = open_here()
    try:
        assert sorted(s["id"] for s in restored.list_sessions()) == [sid, other]  # the same session, not a second
        got = measured(restored, sid)
        assert got["steps"] == newest["steps"] and got["outputs"] == newest["outputs"]
        assert got["samples"] == newest["samples"]
        assert [r[:3] for r in got["runs"]] == [r[:3] for r in newest["runs"]]
        assert restored.get_session(sid)["status"] == "interrupted"
        assert restored.get_session(other)["status"] == "queued"
    finally:
        restored.close()


def test_a_session_whose_id_is_taken_here_gets_a_new_one_and_shares_the_prompt_set(home: Path) -> None:
    old = open_here()
    sid = half_measured(old)
    before = measured(old, sid)
    delete_and_spill(home, old, sid)
    old.close()
    assert set_aside(home / "spectune.db")  # the deleted file's WAL, as opening the path would set it aside
    fresh = open_store(f"sqlite:///{home / 'elsewhere.db'}")  # another database, built before the spill arrives
    half_measured(fresh)  # its own session 1, on the same prompts
    fresh.close()
    os.rename(home / "elsewhere.db", home / "spectune.db")
    here = open_here()
    try:
        sessions = {s["id"]: s for s in here.list_sessions()}
        assert sorted(sessions) == [sid, sid + 1]
        replayed = sessions[sid + 1]
        assert replayed["status"] == "interrupted" and f"(session {sid} there)" in replayed["error"]
        assert f"requeue --session {sid + 1}" in replayed["error"]
        assert measured(here, sid + 1)["steps"] == before["steps"]
        assert sessions[sid]["status"] == "running" and measured(here, sid)["steps"] == before["steps"]
        assert replayed["prompt_set_id"] == sessions[sid]["prompt_set_id"]  # matched by its prompts' hash
        with here.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM prompt_sets")).scalar_one() == 1
    finally:
        here.close()


def test_a_spill_claimed_by_a_live_process_waits_and_a_dead_one_s_claim_is_taken_back(home: Path) -> None:
    old = open_here()
    sid = half_measured(old)
    delete_and_spill(home, old, sid)
    old.close()
    spill = spill_path(home / "spectune.db", sid)
    live = spill.with_name(f"{spill.name}.replaying-{os.getppid()}")
    os.rename(spill, live)
    fresh = open_here()
    try:
        assert fresh.list_sessions() == [] and live.exists()  # another process replays it
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        os.rename(live, spill.with_name(f"{spill.name}.replaying-{gone.pid}"))
        assert fresh.replay_spills() == [(sid, sid)]  # its claimant died: taken back, and replayed here
        assert not any(endings_folder(home / "spectune.db").iterdir())
    finally:
        fresh.close()


def test_a_spill_that_cannot_be_read_stays_and_the_database_opens(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = endings_folder(home / "spectune.db")
    folder.mkdir()
    broken = folder / "session-3.spill.json"
    broken.write_text('{"format": 1, "tables": {"sessions": [')
    unknown = folder / "session-4.spill.json"
    unknown.write_text(json.dumps({"format": 99, "tables": {}}))
    with caplog.at_level(logging.WARNING, logger="spectune.store"):
        opened = open_here()
    try:
        assert opened.list_sessions() == []
        assert sorted(p.name for p in folder.iterdir()) == [broken.name, unknown.name]  # kept for the next open
        said = [r.getMessage() for r in caplog.records if "could not replay" in r.getMessage()]
        assert len(said) == 2 and any("unknown spill format 99" in line for line in said)
    finally:
        opened.close()
