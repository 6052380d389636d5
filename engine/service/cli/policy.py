"""`python -m engine policies` and `run --policy`: argparse and printing over engine.service.decide.policies.

`python -m engine policies --session ID [--json OUT] [--prove N]` prints the replay of every policy of the grid
from the session's recorded draft trace beside what the session ran live; `--prove N` queues a session that runs
the best N policies (and the best fixed γ) for real on the same prompts. `run --policy SPEC` runs one policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.analysis.recommend import OBJECTIVES
from engine.core.policy import FixedGamma, parse_policy
from engine.core.policy import grammar as policy_grammar
from engine.errors import SpectuneError
from engine.service.decide.decisions import DecisionQuery, decided
from engine.service.decide.policies import PolicyReport, prove
from engine.service.outputs import check_output, output_file, write_output


def add_commands(sub: Any) -> None:
    """Register `policies` on the main parser."""
    pol = sub.add_parser("policies", help="replay every speculation policy from a session; live figures beside")
    pol.add_argument("--session", type=int, action="append", required=True, help="session id (repeatable)")
    pol.add_argument(
        "--json", dest="json_out", default=None, type=output_file, help="also write the whole table as JSON here"
    )
    pol.add_argument("--objective", default="latency", choices=OBJECTIVES)
    pol.add_argument("--budget", type=float, default=None, help="max cost-per-token increase, e.g. 0.2 = +20%%")
    pol.add_argument("--batch-size", type=int, default=1)
    pol.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="the temperature you deploy at (default: the sessions' single one)",
    )
    pol.add_argument("--regime", choices=["memory-bound", "compute-bound"], default=None, help="override")
    pol.add_argument("--top", type=int, default=15, help="rows to print per draft (live ones always shown)")
    pol.add_argument(
        "--prove",
        type=int,
        default=None,
        metavar="N",
        help="queue a session running the best N policies and the best fixed γ live",
    )


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def print_table(report: PolicyReport, top: int = 15, out: Any = None) -> None:
    out = out or sys.stdout
    for d in report.drafts:
        cm = d.cost
        print(
            f"\n{d.draft} at T={d.temperature:g}: c={cm.c:.3f} (calibrated where measured), "
            f"v(k) {'measured' if cm.verify_cost else 'assumed 1'}, {cm.regime}",
            file=out,
        )
        print(
            f"{'#':>3} {'policy':<30} {'setting':<34} {'tok/call':>8} {'calls/st':>8} {'speedup':>8} "
            f"{'cost':>7} {'basis':<9} {'live tok/call':>13} {'live speedup':>12}",
            file=out,
        )
        for row in d.rows():
            if row["rank"] > top and not row["live"] and not row["best_fixed"]:
                continue
            mark = " ←best fixed γ" if row["best_fixed"] else ""
            if not row["feasible"]:
                mark += f" (not recommended: {row['why_not']})"
            if row["live_flag"]:
                mark += f" [live: {row['live_flag']}]"
            print(
                f"{row['rank']:>3} {row['policy'][:30]:<30} {row['setting'][:34]:<34} {row['tokens_per_call']:>8.3f} "
                f"{row['draft_calls_per_step']:>8.2f} {row['predicted_speedup']:>7.2f}× {row['cost_multiplier']:>7.3f} "
                f"{row['basis']:<9} {_fmt(row['live_tokens_per_call'], '.3f'):>13} "
                f"{_fmt(row['live_speedup']):>11}{'×' if row['live_speedup'] else ' '}{mark}",
                file=out,
            )
        for note in d.notes:
            print(f"note: {note}", file=out)
    best, fixed = report.best, report.best_fixed
    if best is not None and fixed is not None:
        gain = report.chosen.comparison.gain
        print(
            f"\nbest for {report.objective}: {report.chosen.draft} {best.policy} ({best.setting}): "
            f"{best.tokens_per_call:.2f} tokens per call, {best.predicted_speedup:.2f}× predicted; best fixed "
            f"{fixed.policy}: {fixed.predicted_speedup:.2f}× — gain {gain * 100:+.1f}%",
            file=out,
        )
    for note in report.notes:
        print(f"note: {note}", file=out)
    print(
        "exact: tokens per call and draft calls at temperature 0; predicted: speed and cost (c, v(k)); "
        "estimated: everything at temperature > 0",
        file=out,
    )


def cmd_policies(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store

    if args.json_out:
        check_output(args.json_out, "--json")
    store = open_app_store()
    query = DecisionQuery(args.objective, args.batch_size, args.temperature, args.budget, None, args.regime)
    report = decided(store, args.session, query)[1].policies  # the report the stored decision was made from
    if not report.drafts:
        raise SpectuneError("; ".join(report.notes) or "no replayable trace in these sessions")
    print_table(report, args.top)
    if args.json_out:
        path = Path(args.json_out)
        write_output(path, json.dumps(_jsonable(report.to_dict()), indent=2), "--json")
        print(f"wrote {path}")
    if args.prove:
        new_id, specs = prove(store, report, args.prove)
        print(
            f"queued session {new_id} running {', '.join(specs)} live; when it is done: "
            f"python -m engine policies --session {new_id}"
        )
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------------ `run`


def add_run_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None, help=f"{policy_grammar()} (default: fixed at --gamma)")


def run_policy(args: argparse.Namespace) -> tuple[str | None, list[int]]:
    """(the policy to run besides fixed γs or None, the fixed γs) for `run --policy`; SpectuneError if bad."""
    text = getattr(args, "policy", None)
    if not text:
        return None, [args.gamma]
    try:
        policy = parse_policy(text, args.gamma)
    except ValueError as exc:
        raise SpectuneError(f"--policy {text}: {exc}") from None
    if (gamma := policy.fixed_gamma()) is not None:
        return None, [gamma]
    # validate() refuses what the engine cannot run (llama.cpp: engine.engines.llamacpp.policy_flags)
    return policy.spec(), []


def flatten_policy(flat: dict[str, Any], report: dict[str, Any], spec: str | None) -> dict[str, Any]:
    """`run`'s JSON for a policy run: its live figures at top level, the replayed prediction beside them."""
    runs = report.get("runs") or []
    run = next((r for r in runs if r.get("policy") == spec), None) if spec else (runs[0] if runs else None)
    flat["policy"] = spec or (FixedGamma(int(flat["gamma"])).spec() if run else None)
    flat["mean_drafted_per_step"] = run.get("mean_drafted_per_step") if run else None
    flat["draft_calls"] = run.get("draft_calls") if run else None
    if run is None or spec is None:
        return flat
    live = run.get("policy_live") or {}
    flat |= {
        "gamma": None,
        "alpha": live.get("alpha"),
        "tokens_per_call": live.get("tokens_per_call"),
        "speedup_measured": live.get("speedup_measured"),
        "speedup_measured_spread": live.get("speedup_spread"),
        "draft_calls_per_step": live.get("draft_calls_per_step"),
        "speedup_predicted": (live.get("replayed") or {}).get("speedup"),
        "replayed": live.get("replayed"),  # what the replay of this run's own trace predicted for the policy
    }
    return flat


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"policies": cmd_policies}
