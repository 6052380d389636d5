"""Store schema, migrations and failure modes, on real databases (no mocks).

Tests taking `store` / `store_url` run on a fresh SQLite file and on a fresh PostgreSQL database (tests/conftest.py).
Those marked sqlite_only are about SQLite files themselves: pragmas, garbage or damaged files, read-only
files, file locks and the default database path.
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the project is not installed; let `pytest tests/...` import it from any cwd
    sys.path.insert(0, str(ROOT))

from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from sqlalchemy import inspect, text  # noqa: E402

from store import Store, StoreError, make_engine, open_store  # noqa: E402
from store.migrate import current_revision, head_revision, upgrade  # noqa: E402
from store.models import Base  # noqa: E402

TABLES = {
    "prompt_sets",
    "prompts",
    "sessions",
    "runs",
    "steps",
    "outputs",
    "utilisation_samples",
    "recommendations",
    "exports",
    "endpoint_requests",
    "decisions",
    "watch_windows",
    "alembic_version",
}
HEAD = "0009"  # the newest migration in store/migrations/versions
SETTINGS = {"target": "tiny", "drafts": ["ngram", "none"], "gammas": [2, 4], "temperatures": [0.0], "max_new_tokens": 8}


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_open_store_migrates_empty_database_to_head(store_url: str, store_backend: str) -> None:
    store = open_store(store_url)
    try:
        assert store.engine.dialect.name == store_backend
        assert set(inspect(store.engine).get_table_names()) == TABLES
        assert current_revision(store.engine) == head_revision() == HEAD
        step_indexes = {ix["name"]: ix["column_names"] for ix in inspect(store.engine).get_indexes("steps")}
        assert step_indexes["ix_steps_run_id_step_index"] == ["run_id", "step_index"]
        fks = {fk["referred_table"]: fk["options"] for fk in inspect(store.engine).get_foreign_keys("steps")}
        assert fks["runs"].get("ondelete") == "CASCADE"
    finally:
        store.close()
    again = open_store(store_url)  # already at head: a no-op
    try:
        assert current_revision(again.engine) == head_revision()
    finally:
        again.close()


@pytest.mark.sqlite_only
def test_sqlite_pragmas_on_every_connection(store: Store) -> None:
    results: list[tuple[str, int, int]] = []

    def check() -> None:  # pragmas are per connection: look from a second thread's connection too
        with store.engine.connect() as conn:
            results.append(
                (
                    conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
                    conn.exec_driver_sql("PRAGMA foreign_keys").scalar(),
                    conn.exec_driver_sql("PRAGMA busy_timeout").scalar(),
                )
            )

    with store.engine.connect():
        thread = threading.Thread(target=check)
        thread.start()
        thread.join()
    check()
    assert results == [("wal", 1, 10000)] * 2


def test_models_match_migrations(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []  # migrations build exactly the models


def test_migrate_from_0001_keeps_rows(store_url: str) -> None:
    engine = make_engine(store_url)
    upgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    old = "2024-01-01 00:00:00"
    with engine.begin() as conn:  # bound parameters: the same rows on SQLite and PostgreSQL
        assert "notes" not in {c["name"] for c in inspect(conn).get_columns("sessions")}
        conn.execute(
            text(
                "INSERT INTO prompt_sets (id, name, content_hash, created_at, n_prompts) "
                "VALUES (1, 'old', 'h', :old, 1)"
            ),
            {"old": old},
        )
        conn.execute(
            text(
                "INSERT INTO sessions (id, name, target, drafts, gammas, temperatures, max_new_tokens, "
                "prompt_set_id, status, cancel_requested, created_at, progress_done, progress_total, summary) "
                "VALUES (7, 'legacy', 'tiny', :drafts, :gammas, :temps, 32, 1, 'done', :no, :old, 3, 3, :summary)"
            ),
            {
                "drafts": '["ngram"]',
                "gammas": "[4]",
                "temps": "[0.0]",
                "no": False,
                "old": old,
                "summary": '{"speedup": 1.7}',
            },
        )
        conn.execute(
            text(
                "INSERT INTO runs (id, session_id, draft, gamma, temperature, kind, status, created_at) "
                "VALUES (5, 7, 'ngram', 4, 0.0, 'speculative', 'done', :old)"
            ),
            {"old": old},
        )
        for i in range(3):
            conn.execute(
                text(
                    "INSERT INTO steps (run_id, prompt_index, step_index, gamma, accepted, accept_mask, beta, "
                    "draft_time_s, verify_time_s, draft_forwards, emitted, t) "
                    "VALUES (5, 0, :i, 4, 2, :mask, :beta, 0.0, 0.1, 0, 3, :t)"
                ),
                {"i": i, "mask": "[true, true, false]", "beta": "[1, 1, 0]", "t": float(i)},
            )
    engine.dispose()

    store = open_store(store_url)
    try:
        assert current_revision(store.engine) == HEAD
        session = store.get_session(7)
        assert session is not None
        assert (session["name"], session["drafts"], session["summary"], session["notes"]) == (
            "legacy",
            ["ngram"],
            {"speedup": 1.7},
            None,
        )
        assert session["created_at"].year == 2024 and session["created_at"].tzinfo is not None
        assert store.run_progress(5)["steps"] == 3
        assert store.per_position_acceptance(5)[0] == {"position": 0, "evaluated": 3, "accepted": 3, "rate": 1.0}
        store.set_notes(7, "migrated")
        assert store.get_session(7)["notes"] == "migrated"  # type: ignore[index]
    finally:
        store.close()


def test_concurrent_first_open_migrates_once(store_url: str) -> None:
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []
    stores: list[Store] = []

    def opener() -> None:
        barrier.wait()
        try:
            stores.append(open_store(store_url))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert [current_revision(s.engine) for s in stores] == [HEAD] * 3
    finally:
        for s in stores:
            s.close()


def test_newer_schema_is_refused(store: Store, store_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(StoreError, match="schema revision 9999, newer"):
        open_store(store_url)


# --- SQLite files themselves ----------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_garbage_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    garbage = random.Random(0).randbytes(8192)
    path.write_bytes(garbage)
    with pytest.raises(StoreError) as info:
        open_store(url(path))
    message = str(info.value)
    assert "file is not a database" in message and str(path) in message and "\n" not in message
    assert path.read_bytes() == garbage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.db"]


@pytest.mark.sqlite_only
def test_damaged_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    store = open_store(url(path))
    store.create_session(**SETTINGS)
    store.close()
    data = bytearray(path.read_bytes())
    data[100:4096] = random.Random(1).randbytes(4096 - 100)  # page 1 after the header: the schema b-tree
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        open_store(url(path))
    assert path.read_bytes() == bytes(data)


@pytest.mark.sqlite_only
def test_read_only_file_reads_but_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    store = open_store(url(path))
    store.create_session(**SETTINGS)
    store.close()
    before = path.read_bytes()
    os.chmod(path, 0o444)
    try:
        store = open_store(url(path))
        try:
            assert store.read_only
            assert [s["target"] for s in store.list_sessions()] == ["tiny"]
            with pytest.raises(StoreError) as info:
                store.create_session(**SETTINGS)
            message = str(info.value)
            assert "read-only" in message and str(path) in message and "\n" not in message
        finally:
            store.close()
        assert path.read_bytes() == before
    finally:
        os.chmod(path, 0o644)


@pytest.mark.sqlite_only
def test_locked_database_gives_clear_error_and_reads_still_work(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = open_store(url(path), busy_timeout_s=0.2)
    try:
        store.create_session(**SETTINGS)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(StoreError, match="is locked by another process"):
                store.create_session(**SETTINGS)
            assert len(store.list_sessions()) == 1
        finally:
            other.execute("ROLLBACK")
            other.close()
        store.create_session(**SETTINGS)
        assert len(store.list_sessions()) == 2
    finally:
        store.close()


@pytest.mark.sqlite_only
def test_works_from_any_cwd_and_honours_spectune_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path / "home"))
    store = open_store()
    try:
        assert (tmp_path / "home" / "spectune.db").exists()
        assert current_revision(store.engine) == HEAD
    finally:
        store.close()
    nested = open_store("sqlite:///relative/dir/x.db")  # relative to cwd; missing folders are created
    nested.close()
    assert (elsewhere / "relative" / "dir" / "x.db").exists()


def test_migrate_from_0006_keeps_tokens_per_call(store_url: str) -> None:
    """0007 renames runs.mean_acceptance_length (it held tokens ÷ target calls) to tokens_per_call; values stay."""
    engine = make_engine(store_url)
    upgrade(engine, "0006")
    old = "2024-01-01 00:00:00"
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO prompt_sets (id, name, content_hash, created_at, n_prompts) "
                          "VALUES (1, 'old', 'h', :old, 1)"), {"old": old})  # fmt: skip
        conn.execute(text(
            "INSERT INTO sessions (id, name, target, drafts, gammas, temperatures, max_new_tokens, prompt_set_id, "
            "status, cancel_requested, created_at, progress_done, progress_total) "
            "VALUES (7, 'legacy', 'tiny', '[\"ngram\"]', '[4]', '[0.0]', 32, 1, 'done', :no, :old, 1, 1)"
        ), {"no": False, "old": old})  # fmt: skip
        conn.execute(text(
            "INSERT INTO runs (id, session_id, draft, gamma, temperature, kind, status, created_at, "
            "mean_acceptance_length) VALUES (5, 7, 'ngram', 4, 0.0, 'speculative', 'done', :old, 2.5)"
        ), {"old": old})  # fmt: skip
    engine.dispose()
    store = open_store(store_url)
    try:
        assert current_revision(store.engine) == HEAD
        assert store.list_runs(7)[0]["tokens_per_call"] == 2.5
    finally:
        store.close()
