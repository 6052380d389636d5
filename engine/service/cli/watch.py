"""`python -m engine watch`: one line per window of a running deployment, with its verdict (engine.service.watch).

`watch --metrics-url URL --session N` reads the engine's /metrics itself; `watch --prometheus URL --session N`
asks a Prometheus server that scrapes it (`--match 'job="llama"'` picks the deployment's series). Bad input is one
line and exit 2; a source that goes down is a state line and the watch goes on.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import SettingsError, SpectuneError
from engine.service.outputs import output_folder

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(text: str) -> float:
    """Seconds in '15s', '2m', '500ms' or a bare number of seconds; SettingsError for anything else."""
    match = _DURATION.match(text or "")
    if not match:
        raise SettingsError(f"window {text!r}: write a duration such as 15s, 2m or 30")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds < 1.0:
        raise SettingsError(f"window {text!r}: at least 1 s")
    return seconds


def add_commands(sub: Any) -> None:
    """Register `watch` on the main parser."""
    w = sub.add_parser("watch", help="watch a running deployment: is speculation still paying, window by window")
    source = w.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics-url", default=None, help="the engine's root URL; its /metrics is read directly")
    source.add_argument("--prometheus", default=None, help="a Prometheus server's root URL that scrapes the engine")
    w.add_argument("--session", type=int, required=True, help="the stored session that measured this deployment")
    w.add_argument("--match", default="", help='Prometheus label matchers for the deployment, e.g. job="llama"')
    w.add_argument("--window", default="15s", help="window length (default 15s)")
    w.add_argument("--windows", type=int, default=None, metavar="K", help="stop after K windows (default: never)")
    w.add_argument("--deployment", default=None, help="the name windows are stored under (default: the URL)")
    w.add_argument("--draft", default=None, help="the deployed draft (default: the session's only draft)")
    w.add_argument(
        "--gamma",
        type=int,
        default=None,
        help="the deployed γ (default: as the server's per-position counters say, else the session's recommendation)",
    )
    w.add_argument("--keep-days", type=float, default=None, help="delete stored windows older than this (default 30)")
    w.add_argument(
        "--serve-metrics",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the verdicts as Prometheus metrics on PORT (0: a free one); see docs/watch.md",
    )
    w.add_argument("--serve-host", default="127.0.0.1", help="the address --serve-metrics listens on")
    w.add_argument(
        "--action-dir",
        default=None,
        metavar="DIR",
        type=output_folder,
        help="write the file a 'costing you' or 'acceptance collapsed' verdict offers into DIR",
    )


def _num(x: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "—" if x is None else f"{x:{fmt}}{unit}"


def line(judged: Any) -> str:
    """One window as one line: its end time, verdict, figures and reason."""
    w, v = judged.window, judged.verdict
    when = time.strftime("%H:%M:%S", time.localtime(w.end))
    if v.predicted_speedup is None and v.alpha is None and w.mean_acceptance_length is None:
        return f"{when}  {v.verdict}: {v.why}"
    tpot = "" if w.time_per_output_token_s is None else f", {w.time_per_output_token_s * 1000:.1f} ms per output token"
    figures = (
        f"mean acceptance length {_num(w.mean_acceptance_length)}, draft acceptance rate "
        f"{_num(w.draft_acceptance_rate)}, α {_num(v.alpha)}, requests running {_num(w.requests_running, '.1f')}"
        f"{tpot}"
    )
    tail = f"{v.why}" + (f"; {v.action}" if v.action else "")
    return f"{when}  {v.verdict}  {figures} — {tail}"


def cmd_watch(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    from engine.service.jobs import open_app_store
    from engine.service.watch import RETENTION_DAYS, deployed_gamma, deployment_for, watch
    from engine.watch.exporter import Exporter
    from engine.watch.prometheus import PrometheusSource
    from engine.watch.scrape import MetricsSource

    seconds = duration_s(args.window)
    if args.windows is not None and args.windows < 1:
        raise SettingsError(f"--windows {args.windows}: at least 1")
    if args.serve_metrics is not None and not 0 <= args.serve_metrics <= 65535:
        raise SettingsError(f"--serve-metrics {args.serve_metrics}: a port from 0 to 65535")
    if args.keep_days is not None and args.keep_days <= 0:
        raise SettingsError(f"--keep-days {args.keep_days}: more than 0")
    url = args.metrics_url or args.prometheus
    if not re.match(r"^https?://[^/\s]+", url or ""):
        raise SettingsError(f"{url!r} is not an http(s) URL")
    try:
        source = MetricsSource(url) if args.metrics_url else PrometheusSource(url, args.match)
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    store = open_app_store()
    exporter = Exporter() if args.serve_metrics is not None else None
    try:
        gamma, basis = (args.gamma, "as given") if args.gamma is not None else deployed_gamma(source)
        dep = deployment_for(store, args.session, args.draft, gamma)
        if gamma is None:
            basis = f"the session's recommendation; {basis}"
        name = args.deployment or url
        out(
            f"watching {name}: {dep.measurement.name} at γ={dep.gamma} ({basis}), session {args.session} "
            f"(α measured {dep.alpha_band[0]:.2f}–{dep.alpha_band[1]:.2f}), {seconds:g} s windows"
        )
        if exporter is not None:
            try:
                port = exporter.serve(args.serve_metrics, args.serve_host)
            except OSError as exc:
                raise SettingsError(f"cannot serve metrics on {args.serve_host}:{args.serve_metrics}: {exc}") from exc
            out(f"serving verdicts on http://{args.serve_host}:{port}/metrics")
        keep = RETENTION_DAYS if args.keep_days is None else args.keep_days
        offered: str | None = None
        for judged in watch(store, source, dep, name, seconds, args.windows, keep, exporter=exporter):
            out(line(judged))
            if judged.verdict.verdict != offered:
                offered = offer(store, judged, dep, args.action_dir, out)
            sys.stdout.flush()
    finally:
        if exporter is not None:
            exporter.close()
        source.close()
        store.close()
    return 0


def offer(store: Any, judged: Any, dep: Any, folder: str | None, out: Callable[[str], None]) -> str | None:
    """Say what the file a window's verdict offers does, and write it into `folder` (once per verdict in a row);
    returns the verdict offered (None: nothing offered). A file that cannot be made or written is one line."""
    from engine.service.outputs import write_output
    from engine.service.watch import record
    from engine.service.watch_actions import action_file

    try:
        made = action_file(store, judged.verdict.verdict, record(judged.window, judged.verdict, dep))
    except SpectuneError as exc:
        out(f"  no file offered: {exc}")
        return judged.verdict.verdict
    if made is None:
        return None
    if folder is None:
        out(f"  offered: {made.says} (the Watch page has the file; --action-dir DIR writes it)")
        return made.verdict
    slug = re.sub(r"[^a-z0-9]+", "-", made.verdict.lower()).strip("-")
    try:
        path = write_output(Path(folder) / f"{slug}-{made.filename}", made.text)
    except SpectuneError as exc:
        out(f"  not written: {exc}")
        return made.verdict
    check = f"; measure it first: python -m engine check-export {path} --session {made.session_id}"
    out(f"  wrote {path}: {made.says}" + (check if made.checkable else ""))
    return made.verdict


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"watch": cmd_watch}
