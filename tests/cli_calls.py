"""The CLI as the shell sees it, in process: exit code and output of `main(args)`, its one-line refusals, and a
small prompt file to submit."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.service.cli.main import main


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(args) as the shell sees it: (exit code, stdout, stderr); argparse's refusals exit through SystemExit."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    """The one line a refusal prints (warnings aside), asserted to be one line with no traceback."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    """A two-line prompt file in the test's folder."""
    path = tmp_path / "prompts.txt"
    path.write_text("hello world, this is\nabc abc abc abc ab\n")
    return path
