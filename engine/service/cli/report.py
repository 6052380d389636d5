"""`python -m engine report`: the shareable HTML report of a session (engine.service.report.document).

python -m engine report --session ID [--session ID …] [--objective O] [--batch-size B] --html FILE
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.analysis.recommend import OBJECTIVES
from engine.engines.registry import engine_from_cli, sweep_cli_choices
from engine.service.outputs import check_output, output_file, write_output
from engine.service.report.document import session_report_html


def add_commands(sub: Any) -> None:
    """Register `report` on the main parser."""
    rep = sub.add_parser("report", help="one self-contained HTML report of a session: runs, charts, exports")
    rep.add_argument("--session", type=int, action="append", required=True, help="session id (repeatable)")
    rep.add_argument("--html", required=True, type=output_file, help="where to write the report")
    rep.add_argument("--objective", default="latency", choices=OBJECTIVES)
    rep.add_argument("--budget", type=float, default=None, help="max cost-per-token increase, e.g. 0.2 = +20%%")
    rep.add_argument("--batch-size", type=int, default=1)
    rep.add_argument("--temperature", type=float, default=None, help="default: each temperature the sessions measured")
    rep.add_argument("--price", type=float, default=None, help="accelerator price per hour")
    rep.add_argument("--regime", choices=["memory-bound", "compute-bound"], default=None, help="override")
    rep.add_argument("--engine", choices=sweep_cli_choices(), default=None, help="whose measurements to use")


def cmd_report(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store

    out = Path(args.html)
    check_output(out, "--html")
    store = open_app_store()
    html = session_report_html(
        store,
        args.session,
        args.objective,
        args.budget,
        args.batch_size,
        args.price,
        args.regime,
        engine_from_cli(args.engine) if args.engine else None,
        args.temperature,
    )
    write_output(out, html, "--html")
    print(f"wrote {out} ({len(html.encode('utf-8')) // 1024} KiB)")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"report": cmd_report}
