"""No command that writes a file ever replaces, or writes into, anything but a regular file.

A character device (made by the test with the numbers of /dev/null, as root), a FIFO and a socket at an output path
are refused with one line and exit 2 by every command that writes a file, and are still there, as they were,
afterwards; `backup --out` also refuses a hard link to the database. The real CLI runs in-process against a real
SQLite store in tmp_path, and `backup` once more in a real subprocess.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.paths import default_database_url
from store import open_store
from store.files import write_whole
from tests.cli_calls import cli, one_line
from tests.cli_calls import prompts as prompts  # noqa: F401 - a fixture
from tests.t5_sessions import T5, store_session

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder holding one finished session: the database is $SPECTUNE_HOME/spectune.db."""
    path = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    try:
        store_session(store, T5)
    finally:
        store.close()
    return path


@pytest.fixture
def specials() -> Iterator[dict[str, Path]]:
    """A FIFO, a socket and (as root) a character device with /dev/null's numbers, in a short private folder."""
    folder = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))  # a socket's path must stay under 108 bytes
    made = {"a FIFO": folder / "fifo.json"}
    os.mkfifo(made["a FIFO"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(folder / "sock.json"))
    made["a socket"] = folder / "sock.json"
    if os.geteuid() == 0:
        made["a character device"] = folder / "chr.json"
        os.mknod(made["a character device"], stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    try:
        yield made
    finally:
        listener.close()
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


def writers(prompts: Path) -> dict[str, list[str]]:
    """Each command that writes a file, less its output path (appended by the test)."""
    return {
        "backup --out": ["backup", "--out"],
        "recommend --out": ["recommend", "--session", "1", "--export", "vllm", "--out"],
        "report --html": ["report", "--session", "1", "--html"],
        "policies --json": ["policies", "--session", "1", "--json"],
        "run --json": [
            "run",
            "--target",
            "tiny:1:48:2:64",
            "--draft",
            "tiny:1:48:2:64~0.15",
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "8",
            "--dtype",
            "float32",
            "--json",
        ],  # fmt: skip
        "probe --json": ["probe", "--url", "http://127.0.0.1:1", "--prompts", str(prompts), "--json"],
    }


def identity(path: Path) -> tuple[int, int, int]:
    """What must not change about a special file: its inode, its kind and its device numbers."""
    info = os.lstat(path)
    return info.st_ino, stat.S_IFMT(info.st_mode), info.st_rdev


def test_the_test_can_make_a_character_device(specials: dict[str, Path]) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may create a character device")
    assert stat.S_ISCHR(os.stat(specials["a character device"]).st_mode)


@pytest.mark.parametrize("writer", list(writers(Path("p"))))
def test_every_writer_refuses_what_is_not_a_regular_file(writer, home, prompts, specials, capsys):
    for kind, target in specials.items():
        before = identity(target)
        code, out, err = cli([*writers(prompts)[writer], str(target)], capsys)
        assert code == 2, (writer, kind, out, err)
        line = one_line(err)
        assert kind in line and "not a regular file" in line, line
        assert "wrote" not in out and "backed up" not in out
        assert identity(target) == before, (writer, kind)
    folder = next(iter(specials.values())).parent
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left beside


def test_a_symlink_to_a_device_is_refused_too(home, specials, tmp_path, capsys):
    for kind, target in specials.items():
        link = tmp_path / f"link-{kind.split()[-1]}.db"
        link.symlink_to(target)
        before = identity(target)
        code, out, err = cli(["backup", "--out", str(link)], capsys)
        assert code == 2 and kind in one_line(err), err
        assert link.is_symlink() and identity(target) == before


def test_backup_refuses_a_hard_link_to_the_database(home, tmp_path, capsys):
    db = home / "spectune.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    hard = tmp_path / "looks-like-a-backup.db"
    os.link(db, hard)
    code, out, err = cli(["backup", "--out", str(hard)], capsys)
    assert code == 2 and "own file" in one_line(err) and "backed up" not in out
    assert os.path.samefile(hard, db) and hashlib.sha256(db.read_bytes()).hexdigest() == digest
    store = open_store(default_database_url())
    try:
        assert [s["id"] for s in store.list_sessions()] == [1]
    finally:
        store.close()


def test_backup_onto_a_device_in_a_real_process(home, specials):
    """The reported loss: `engine backup --out /dev/full` exited 0 and left a regular file in /dev."""
    env = {**os.environ, "SPECTUNE_HOME": str(home)}
    env.pop("SPECTUNE_DB_URL", None)
    target = specials.get("a character device", specials["a FIFO"])
    before = identity(target)
    done = subprocess.run([sys.executable, "-m", "engine", "backup", "--out", str(target)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "not a regular file" in one_line(done.stderr), done.stderr
    assert identity(target) == before


def test_write_whole_refuses_a_special_file_and_writes_a_regular_one(specials, tmp_path):
    for target in specials.values():
        with pytest.raises(ValueError, match="not a regular file"):
            write_whole(target, b"x")
    plain = tmp_path / "plain.json"
    write_whole(plain, b"one")
    write_whole(plain, b"two")
    assert plain.read_bytes() == b"two" and [p.name for p in tmp_path.iterdir()] == ["plain.json"]
