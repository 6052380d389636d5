"""`python -m engine check-export`: argparse and printing over engine.service.export_check.

`check-export FILE --session N` queues a vLLM session that launches the export FILE (`recommend --export vllm`
wrote it) beside the target alone and its fixed γ, at session N's concurrency levels and on its prompts; the worker
runs it. `check-export --show M` prints what the finished check M measured, one line per level.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import SettingsError


def add_commands(sub: Any) -> None:
    """Register `check-export` on the main parser."""
    check = sub.add_parser("check-export", help="measure a vLLM export as it is, beside its fixed γ and the target")
    check.add_argument("file", nargs="?", default=None, help="the vLLM export (JSON) to launch")
    check.add_argument("--session", type=int, default=None, help="the vLLM session whose prompts and levels to use")
    check.add_argument("--name", default=None)
    check.add_argument("--show", type=int, default=None, metavar="M", help="print the finished check session M")


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def cmd_check_export(args: argparse.Namespace) -> int:
    from engine.service.export_check import export_check_rows, submit_export_check
    from engine.service.jobs import open_app_store

    store = open_app_store()
    if args.show is not None:
        rows = export_check_rows(store, args.show)
        if not rows:
            raise SettingsError(f"session {args.show} has no finished runs to show")
        print(f"{'level':>5}  {'target alone':>13}  {'fixed γ':>8}  {'schedule':>8}  winner")
        for r in rows:
            base = "—" if r.baseline_tokens_per_s is None else f"{r.baseline_tokens_per_s:.2f} tok/s"
            print(f"{r.level:>5}  {base:>13}  {_fmt(r.fixed):>8}  {_fmt(r.schedule):>8}  {r.winner()}")
        return 0
    if args.file is None or args.session is None:
        raise SettingsError("check-export needs the export FILE and --session N (or --show M)")
    path = Path(args.file)
    if not path.is_file():
        raise SettingsError(f"{path}: no such file")
    sid = submit_export_check(store, args.session, path.read_text(encoding="utf-8", errors="replace"), args.name)
    print(
        f"queued session {sid}: {path.name} as exported, beside its fixed γ and the target alone "
        f"(run the worker; then check-export --show {sid})"
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"check-export": cmd_check_export}
