"""Damage in the database is found on open and warned about; `python -m engine backup` copies it while in use."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from store import Store, StoreError, open_store
from store.health import _checked, backup_to, check_on_open

ROOT = Path(__file__).resolve().parents[1]


def _filled(path: Path) -> Store:
    """A store at ``path`` holding a few hundred prompts (dozens of pages)."""
    store = open_store(f"sqlite:///{path}")
    store.add_prompt_set("p", None, [{"text": f"prompt {i} " * 50} for i in range(200)])
    return store


def _wreck_a_page(path: Path) -> None:
    """Overwrite one page near the end of the file (not the schema): the file still opens, the data is malformed."""
    data = bytearray(path.read_bytes())
    page = len(data) // 4096 - 2
    data[page * 4096 : (page + 1) * 4096] = bytes((i * 37 + 11) % 256 for i in range(4096))
    path.write_bytes(bytes(data))


def test_a_sound_database_opens_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spectune.store"):
        store = _filled(tmp_path / "db.sqlite")
    store.close()
    assert store.damage is None and "damaged" not in caplog.text


def test_a_damaged_page_is_warned_about_on_every_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "db.sqlite"
    _filled(path).close()
    _wreck_a_page(path)
    _checked.clear()
    for _ in range(2):  # the second open reuses the check made a moment ago, and warns again
        with caplog.at_level(logging.WARNING, logger="spectune.store"):
            store = open_store(f"sqlite:///{path}")
        store.close()
        assert store.damage and "malformed" in store.damage
    warnings = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(warnings) == 2 and "python -m engine backup" in warnings[0]


def test_the_check_runs_at_most_once_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import store.health as health

    calls: list[int] = []
    store = _filled(tmp_path / "db.sqlite")
    monkeypatch.setattr(health, "quick_check", lambda engine: calls.append(1))
    _checked.clear()
    try:
        for now in (1000.0, 1030.0, 1059.0, 1061.0):
            check_on_open(store.engine, now=now)
    finally:
        store.close()
    assert len(calls) == 2


def test_backup_copies_a_database_in_use(tmp_path: Path) -> None:
    store = _filled(tmp_path / "db.sqlite")
    try:
        written = backup_to(store.engine, tmp_path / "copy.sqlite")
        (tmp_path / "copy.sqlite").write_bytes(b"an older backup")  # replaced whole, not appended to
        written = backup_to(store.engine, tmp_path / "copy.sqlite")
    finally:
        store.close()
    with sqlite3.connect(written) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM prompts").fetchone()[0] == 200
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


@pytest.mark.parametrize("where", ["the database", "its WAL", "a folder", "a missing folder"])
def test_backup_refuses_the_database_itself_and_folders(tmp_path: Path, where: str) -> None:
    path = tmp_path / "db.sqlite"
    store = _filled(path)
    destination = {
        "the database": path,
        "its WAL": tmp_path / "db.sqlite-wal",
        "a folder": tmp_path,
        "a missing folder": tmp_path / "nowhere" / "copy.sqlite",
    }[where]
    store.close()  # the WAL checkpointed into the file: its bytes are what must stay
    before = path.read_bytes()
    with pytest.raises(StoreError):
        backup_to(store.engine, destination)
    assert path.read_bytes() == before


def test_backup_command(tmp_path: Path) -> None:
    import os

    _filled(tmp_path / "spectune.db").close()
    env = {**os.environ, "SPECTUNE_HOME": str(tmp_path)}
    env.pop("SPECTUNE_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "engine", "backup", "--out", str(tmp_path / "b.db")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "backed up" in done.stdout and (tmp_path / "b.db").stat().st_size > 0
    refused = subprocess.run(
        [sys.executable, "-m", "engine", "backup", "--out", str(tmp_path / "spectune.db")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "own file" in refused.stderr
