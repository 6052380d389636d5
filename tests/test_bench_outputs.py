"""The benchmark scripts refuse a bad report path at parse time, with one line and exit 2, and write nothing.

bench/gpu_check.py takes its report as an optional positional path (argparse: --help prints usage and writes
nothing); it and the other scripts check the path through engine.service.outputs. Each case runs the real script in
a subprocess and stops at argument parsing: a folder, a FIFO, a file in a missing folder and the store's database
(SPECTUNE_HOME in tmp_path) are refused, and the database is left byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
DB_BYTES = b"SQLite format 3\x00 not really, but these bytes must survive"

# scripts whose --out is refused before any heavy import or work: output_file at parse time (bench_first_session),
# the folder made then check_output (soak), output_file imported lazily (gpu_session_check)
OUT_SCRIPTS = ["bench_first_session.py", "soak.py", "gpu_session_check.py"]


def run_script(script: str, *args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The script run as a user runs it, with a private SPECTUNE_HOME."""
    env = {k: v for k, v in os.environ.items() if k != "SPECTUNE_DB_URL"} | {"SPECTUNE_HOME": str(home)}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def refusal(result: subprocess.CompletedProcess[str], path: Path) -> str:
    """The one error line of an argparse refusal naming `path` (argparse's usage lines aside), exit 2, no
    traceback."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, result.stderr
    assert ": error: " in lines[0] and str(path) in lines[0], lines[0]
    return lines[0]


def contents(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """SPECTUNE_HOME with a store database in it."""
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "spectune.db").write_bytes(DB_BYTES)
    return folder


def test_gpu_check_help_prints_usage_and_writes_nothing(tmp_path: Path, home: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run_script("gpu_check.py", "--help", cwd=cwd, home=home)
    assert result.returncode == 0, result
    assert result.stdout.startswith("usage: gpu_check.py") and "report" in result.stdout
    assert result.stderr == ""
    assert list(cwd.iterdir()) == []


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "reports"
    folder.mkdir()
    return folder


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def _missing_folder(tmp_path: Path) -> Path:
    return tmp_path / "missing" / "report.json"


def _store(tmp_path: Path) -> Path:
    return tmp_path / "home" / "spectune.db"


@pytest.mark.parametrize(
    ("case", "words"),
    [(_folder, "is a folder"), (_fifo, "FIFO"), (_missing_folder, "does not exist"), (_store, "spectune's database")],
    ids=["folder", "fifo", "missing-folder", "store"],
)
def test_gpu_check_refuses_a_bad_report_path_in_one_line(
    tmp_path: Path, home: Path, case: Callable[[Path], Path], words: str
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    path = case(tmp_path)
    before = contents(tmp_path)
    line = refusal(run_script("gpu_check.py", str(path), cwd=cwd, home=home), path)
    assert words in line
    assert contents(tmp_path) == before  # no report, no temporary file, no folder made
    assert (home / "spectune.db").read_bytes() == DB_BYTES


def test_gpu_check_writes_its_report_on_a_machine_without_a_gpu(tmp_path: Path, home: Path) -> None:
    """Where there is no NVIDIA GPU it has nothing to check: exit 0, and the report says what it found."""
    out = tmp_path / "report.json"
    out.write_text("an older report")
    result = run_script("gpu_check.py", str(out), cwd=tmp_path, home=home)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["ok"] is True and report["problems"] == [] and report["hardware"]["kind"] == "cpu"
    assert contents(tmp_path) == ["home", "home/spectune.db", "report.json"]  # replaced whole, no temporary file


def test_gpu_session_check_imports_without_sqlalchemy() -> None:
    code = "import sys; sys.path.insert(0, 'bench'); import gpu_session_check; print('sqlalchemy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("script", OUT_SCRIPTS)
def test_out_naming_a_folder_is_refused_in_one_line(tmp_path: Path, home: Path, script: str) -> None:
    folder = _folder(tmp_path)
    before = contents(tmp_path)
    line = refusal(run_script(script, "--out", str(folder), cwd=tmp_path, home=home), folder)
    assert "is a folder" in line
    assert contents(tmp_path) == before


@pytest.mark.parametrize("script", OUT_SCRIPTS)
def test_out_naming_the_store_database_is_refused_and_leaves_it_whole(tmp_path: Path, home: Path, script: str) -> None:
    database = home / "spectune.db"
    before = contents(tmp_path)
    line = refusal(run_script(script, "--out", str(database), cwd=tmp_path, home=home), database)
    assert "spectune's database" in line
    assert database.read_bytes() == DB_BYTES
    assert contents(tmp_path) == before


COMMANDS = sorted(
    str(path.relative_to(ROOT))
    for folder in (BENCH, ROOT / "scripts")
    for path in folder.glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_script_answers_help_with_its_usage_and_does_nothing_else(tmp_path: Path, command: str) -> None:
    """`--help` is never taken for a path or ignored: usage, exit 0, nothing made where it ran."""
    result = subprocess.run(
        [sys.executable, str(ROOT / command), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lstrip().startswith("usage:"), result.stdout[:500]
    assert contents(tmp_path) == []
