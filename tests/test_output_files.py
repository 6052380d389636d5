"""No command overwrites the store or silently replaces a file, and a SPECTUNE_HOME that cannot be a folder is one
line on every command.

Every output option (recommend --out and --policy-out, report --html, run --json, policies --json, probe --json) is
checked in one place (engine.service.outputs): refused with one line and exit 2 when it resolves to the store's
database or its -wal/-shm/-journal file (through a symlink or a hard link too), to a folder, or into a missing folder;
an existing file is replaced by a rename, never rewritten in place; a full disk or a permission error is one line.
Real SQLite stores in tmp_path (SPECTUNE_HOME points there), the real CLI: main() in-process and a real subprocess.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.service import outputs
from foundation.paths import default_database_url
from store import open_store
from tests.cli_calls import cli, one_line
from tests.cli_calls import prompts as prompts  # noqa: F401 - a fixture
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder: the database is $SPECTUNE_HOME/spectune.db."""
    path = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    return path


@pytest.fixture
def finished(home: Path) -> int:
    """A finished session with known numbers (recommendable, reportable) in the private store."""
    store = open_store(default_database_url())
    try:
        return store_session(store, T5)
    finally:
        store.close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def writers(sid: int, prompts: Path) -> dict[str, list[str]]:
    """Each command that writes a file, less its output path (appended by the test)."""
    return {
        "recommend --out": ["recommend", "--session", str(sid), "--export", "vllm", "--out"],
        "report --html": ["report", "--session", str(sid), "--html"],
        "policies --json": ["policies", "--session", str(sid), "--json"],
        "run --json": [
            "run",
            "--target",
            TARGET,
            "--draft",
            DRAFT,
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "8",
            "--dtype",
            "float32",
            "--no-chat-template",
            "--json",
        ],  # fmt: skip
        "probe --json": ["probe", "--url", "http://127.0.0.1:1", "--prompts", str(prompts), "--json"],
    }


WRITERS = ("recommend --out", "report --html", "policies --json", "run --json", "probe --json")


@pytest.mark.parametrize("writer", WRITERS)
def test_no_output_may_name_the_store_s_files(writer, home, finished, prompts, tmp_path, capsys):
    db = home / "spectune.db"
    before = sha256(db)
    symlink = tmp_path / "innocent.json"
    symlink.symlink_to(db)
    hard = tmp_path / "hard.json"
    os.link(db, hard)
    for target in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal"), symlink, hard):
        code, out, err = cli([*writers(finished, prompts)[writer], str(target)], capsys)
        assert code == 2, (writer, target, out, err)
        assert "spectune's database" in one_line(err) and "choose another file" in err, err
        assert "wrote" not in out
    assert sha256(db) == before
    assert not Path(f"{db}-journal").exists() or Path(f"{db}-journal").stat().st_size == 0
    store = open_store(default_database_url())  # every session is still there
    assert [s["id"] for s in store.list_sessions()] == [finished]
    store.close()


def test_recommend_and_report_to_the_database_in_a_real_process_lose_nothing(home, finished):
    """The reported loss: `recommend --export vllm --out $SPECTUNE_HOME/spectune.db` printed "wrote …", exit 0, and
    every later command called the database corrupt."""
    db = home / "spectune.db"
    before = sha256(db)
    env = dict(os.environ, SPECTUNE_HOME=str(home))
    for args in (["recommend", "--session", str(finished), "--export", "vllm", "--out", str(db)],
                 ["report", "--session", str(finished), "--html", str(db)]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2 and "wrote" not in done.stdout, (done.stdout, done.stderr)
        assert "spectune's database" in one_line(done.stderr)
    assert sha256(db) == before
    listed = subprocess.run([sys.executable, "-m", "engine", "sessions", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0 and [s["id"] for s in json.loads(listed.stdout)] == [finished], listed.stderr


@pytest.mark.parametrize("writer", WRITERS)
def test_a_folder_or_a_missing_folder_is_refused_with_one_line(writer, home, finished, prompts, tmp_path, capsys):
    code, _, err = cli([*writers(finished, prompts)[writer], str(tmp_path)], capsys)
    assert code == 2 and "is a folder" in one_line(err)
    missing = tmp_path / "no such folder" / "out.txt"
    code, _, err = cli([*writers(finished, prompts)[writer], str(missing)], capsys)
    assert code == 2 and f"folder {missing.parent} does not exist" in one_line(err)
    under_a_file = prompts / "out.txt"
    code, _, err = cli([*writers(finished, prompts)[writer], str(under_a_file)], capsys)
    assert code == 2 and "is not a folder" in one_line(err)
    assert not missing.parent.exists()


def test_policy_out_must_be_a_folder_and_its_files_are_checked_too(home, finished, tmp_path, capsys):
    args = ["recommend", "--session", str(finished), "--policy-export", "all", "--policy-out"]
    code, _, err = cli([*args, str(tmp_path / "missing")], capsys)
    assert code == 2 and "folder does not exist" in one_line(err)
    code, _, err = cli([*args, str(home / "spectune.db")], capsys)
    assert code == 2 and "not a folder" in one_line(err)
    with pytest.raises(outputs.OutputError, match="spectune's database"):  # each file it writes in the folder
        outputs.write_output(home / "spectune.db", "x", "--policy-out")


def test_an_existing_file_is_replaced_by_a_rename_with_its_mode_kept(home, finished, tmp_path, capsys):
    out = tmp_path / "exports" / "vllm.json"
    out.parent.mkdir()
    out.write_text("the user's old file\n")
    out.chmod(0o640)
    inode = out.stat().st_ino
    code, stdout, err = cli(["recommend", "--session", str(finished), "--export", "vllm", "--out", str(out)], capsys)
    assert code == 0, err
    assert f"wrote {out} (vllm)" in stdout
    assert "speculative_config" in json.loads(out.read_text())
    assert out.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten in place
    assert out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in out.parent.iterdir()) == ["vllm.json"]  # no temporary file left beside it
    real = tmp_path / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real)
    code, _, err = cli(["report", "--session", str(finished), "--html", str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and real.read_text().startswith("<!DOCTYPE html>")  # written where the link points


def test_a_full_disk_is_one_line_and_the_old_file_survives(home, finished, tmp_path, capsys, monkeypatch):
    old = tmp_path / "report.html"
    old.write_text("the report that was there")

    def full(fd: int) -> None:  # the disk fills while the new file is flushed (SQLITE_FULL's twin for files)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs.os, "fsync", full)
    code, _, err = cli(["report", "--session", str(finished), "--html", str(old)], capsys)
    assert code == 2 and "the disk is full" in one_line(err)
    assert old.read_text() == "the report that was there"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report.html")] == []


def test_permission_denied_is_one_line(home, finished, tmp_path, capsys):
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        target = locked / "out.json"
        readonly = tmp_path / "readonly.json"
        readonly.write_text("keep me")
        readonly.chmod(0o444)
        code, _, err = cli(["recommend", "--session", str(finished), "--export", "vllm", "--out", str(readonly)],
                           capsys)  # fmt: skip
        assert code == 2 and "read-only" in one_line(err) and readonly.read_text() == "keep me"
    elif Path("/sys/kernel").is_dir():  # root passes mode bits; sysfs refuses a new file even to root
        target = Path("/sys/kernel/spectune-test-output.json")
    else:
        pytest.skip("running as root with no folder that refuses root a new file")
    code, out, err = cli(["recommend", "--session", str(finished), "--export", "vllm", "--out", str(target)], capsys)
    assert code == 2 and "wrote" not in out
    line = one_line(err)
    assert "cannot be written" in line and ("permission denied" in line or "read-only" in line), line
    assert not target.exists()


def test_run_json_to_a_full_disk_is_one_line(home, prompts, tmp_path, capsys, monkeypatch):
    def full(fd: int) -> None:  # the disk fills while the report is flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs.os, "fsync", full)
    code, _, err = cli([*writers(0, prompts)["run --json"], str(tmp_path / "run.json")], capsys)
    assert code == 2
    assert "the disk is full" in one_line(err)
    assert not (tmp_path / "run.json").exists()


# --- SPECTUNE_HOME -----------------------------------------------------------------------------------------------


def home_commands(tmp_path: Path, prompts: Path) -> list[list[str]]:
    """Every command that opens the store."""
    return [
        ["sessions"],
        ["submit", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--dtype", "float32"],
        ["recommend", "--session", "1"],
        ["report", "--session", "1", "--html", str(tmp_path / "r.html")],
        ["policies", "--session", "1"],
        ["requeue", "--session", "1"],
        ["cancel", "--session", "1"],
        ["worker", "--once"],
        ["check-export", "--show", "1"],
    ]


@pytest.mark.parametrize("kind", ["a file", "under a file", "impossible"])
def test_a_spectune_home_that_cannot_be_a_folder_is_one_line_on_every_command(
    kind, tmp_path, prompts, monkeypatch, capsys
):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    bad = {"a file": a_file, "under a file": a_file / "home", "impossible": Path("/proc/spectune/home")}[kind]
    monkeypatch.setenv("SPECTUNE_HOME", str(bad))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    for args in home_commands(tmp_path, prompts):
        code, _, err = cli(args, capsys)
        assert code == 2, (args, err)
        line = one_line(err)
        assert line.startswith(f"error: SPECTUNE_HOME={bad}") and "set SPECTUNE_HOME to a folder" in line, line
    assert a_file.read_text() == "x"


def test_a_spectune_home_that_is_a_file_in_a_real_process(tmp_path):
    a_file = tmp_path / "home"
    a_file.write_text("x")
    env = dict(os.environ, SPECTUNE_HOME=str(a_file))
    env.pop("SPECTUNE_DB_URL", None)
    done = subprocess.run([sys.executable, "-m", "engine", "sessions"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert (
        one_line(done.stderr) == f"error: SPECTUNE_HOME={a_file} is a file, not a folder: set SPECTUNE_HOME to a folder"
    )


def test_the_dashboard_says_the_same_line(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    a_file = tmp_path / "home"
    a_file.write_text("x")
    monkeypatch.setenv("SPECTUNE_HOME", str(a_file))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [str(e.value).replace("\\", "") for e in at.error]  # as the page shows it, without markdown escapes
    assert any(f"SPECTUNE_HOME={a_file} is a file, not a folder" in line for line in shown), shown
