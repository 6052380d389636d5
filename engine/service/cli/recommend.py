"""`python -m engine recommend`: the recommended draft and γ from finished sessions, the best speculation policy
beside it, and the exports (engine.service.decide.recommendations, the same chain the Recommend page runs).

    python -m engine recommend --session ID [--objective O] [--export FORMAT [--out FILE]] \
        [--vllm-version X.Y.Z] [--policy-export FORMAT|all [--policy-out DIR]]

With `--export` and no `--out` the export is printed to stdout byte for byte, and nothing follows it.
`--vllm-version` names the vLLM the vLLM export is written for (default: the one spectune checked against); a
malformed or unknown one is refused with one line before anything is computed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.analysis.export import VLLM_VERSION, check_vllm_version, format_names
from engine.analysis.recommend import OBJECTIVES
from engine.engines.registry import engine_from_cli, sweep_cli_choices
from engine.service.decide.policies import PolicyReport, export_best, policy_verdict
from engine.service.decide.recommendations import Recommended, recommend_and_export
from engine.service.outputs import check_output_folder, output_file, output_folder, write_output


def add_commands(sub: Any) -> None:
    """Register `recommend` on the main parser."""
    rec = sub.add_parser("recommend", help="recommend γ and draft from finished sessions; export configs")
    rec.add_argument("--session", type=int, action="append", required=True, help="session id (repeatable)")
    rec.add_argument("--objective", default="latency", choices=OBJECTIVES)
    rec.add_argument("--budget", type=float, default=None, help="max cost-per-token increase, e.g. 0.2 = +20%%")
    rec.add_argument("--batch-size", type=int, default=1)
    rec.add_argument("--temperature", type=float, default=None, help=TEMPERATURE_HELP)
    rec.add_argument("--price", type=float, default=None, help="accelerator price per hour")
    rec.add_argument("--regime", choices=["memory-bound", "compute-bound"], default=None, help="override")
    rec.add_argument("--export", choices=format_names(), default=None, help="print the config in this format")
    rec.add_argument("--out", default=None, type=output_file, help="write the export to this file instead of stdout")
    rec.add_argument(
        "--vllm-version",
        default=None,
        metavar="X.Y.Z",
        help=f"the vLLM you deploy, for the vLLM export (default: {VLLM_VERSION}, the one spectune "
        "checks against); its keys follow that version",
    )
    rec.add_argument(
        "--engine",
        choices=sweep_cli_choices(),
        default=None,
        help="whose measurements to use (default: llama.cpp's for a llama.cpp export when the sessions "
        "include any, else spectune's loop)",
    )
    rec.add_argument(
        "--policy-export",
        choices=[*format_names(), "all"],
        default=None,
        help="write the best speculation policy for this engine (all: every engine)",
    )
    rec.add_argument(
        "--policy-out", default=".", type=output_folder, help="folder for --policy-export files (default: here)"
    )


TEMPERATURE_HELP = "the temperature you deploy at (default: the sessions' only one; needed when several were measured)"


def cmd_recommend(args: argparse.Namespace) -> int:
    """The recommendation (or its export), then the best speculation policy (and its export with --policy-export)."""
    from engine.service.jobs import open_app_store

    vllm_version = check_vllm_version(args.vllm_version) if args.vllm_version is not None else None
    store = open_app_store()
    result = recommend_and_export(
        store,
        args.session,
        args.objective,
        args.budget,
        args.batch_size,
        args.price,
        args.regime,
        engine_from_cli(args.engine) if args.engine else None,
        formats=(args.export,) if args.export else (),
        save=bool(args.export),
        temperature=args.temperature,
        vllm_version=vllm_version,
    )
    if args.export:
        write_export(result, args.export, args.out)
        if args.out is None:
            return 0  # the export went to stdout: nothing may follow it
    else:
        print_decision(result)
        print_recommendation(result)
    print_policy(store, args, result)
    return 0


def print_decision(result: Recommended) -> None:
    """The stored decision for this query (engine.service.decide.decisions, read by recommend_and_export): the one
    answer
    every page shows; nothing where there was nothing to decide."""
    decision = result.decision
    if decision is None:
        return
    print(f"decision: {decision.headline()}")
    if decision.runner_up:
        print(
            f"runner-up: {decision.runner_up['configuration']}, predicted "
            f"{decision.runner_up['predicted_speedup']:.2f}×"
        )
    if decision.floor and not decision.floor["holds"]:
        print(f"floor: {decision.floor['sentence']}")


def write_export(result: Recommended, fmt: str, out: str | None) -> None:
    if fmt in result.failed:
        raise result.failed[fmt]
    _, text = result.files[fmt]
    if out:
        write_output(out, text, "--out")
        print(f"wrote {out} ({fmt})")
    else:
        sys.stdout.write(text)  # byte for byte what the page shows and stores


def print_recommendation(result: Recommended) -> None:
    rec, report = result.recommendation, result.regime
    print(
        f"regime: {rec.regime} (batch {rec.batch_size}); objective: {rec.objective}; temperature: {rec.temperature:g}"
    )
    print(report.source)
    if rec.off:
        print("recommendation: speculation OFF")
    else:
        print(
            f"recommendation: {rec.draft_name} ({rec.method}) with γ={rec.gamma}: "
            f"{rec.headline_speedup:.2f}× {'measured' if rec.prefers_measurement else 'predicted'}, "
            f"ops ×{rec.ops_multiplier:.2f}, cost per token {rec.cost_change:+.0%}"
        )
        if measured := rec.measured_sentence():
            print(f"measured: {measured}")
    print(rec.explanation)
    print(f"{'draft':<24} {'α':>6} {'c':>6} {'best γ':>7} {'speedup':>8} {'crossover':>9}")
    for row in rec.comparison:
        cross = rec.crossover.get(row.name)
        print(
            f"{row.name[:24]:<24} {row.alpha:>6.3f} {row.c:>6.3f} {row.best_gamma:>7} "
            f"{row.best_speedup:>7.2f}× {('none' if cross is None else cross):>9}"
        )
    if rec.schedule:
        measured = f" (measured at {', '.join(map(str, rec.schedule_measured))})" if rec.schedule_measured else ""
        print("γ by batch size: " + ", ".join(f"{b}→{g}" for b, g in rec.schedule.items()) + measured)
    for note in rec.notes:
        print(f"note: {note}")


def print_policy(store: Any, args: argparse.Namespace, result: Recommended) -> None:
    """The best speculation policy for the objective and its gain over the best fixed γ; --policy-export files."""
    report = result.policies  # the policy report the decision was made from
    best, fixed = report.best, report.best_fixed
    if best is None or fixed is None:
        print("policy: no replayable trace in these sessions (sessions from before policies were recorded)")
        return
    verdict, _ = policy_verdict(report)
    print(f"policy: {verdict.replace('**', '')}")
    for note in report.chosen.comparison.notes:
        print(f"policy note: {note}")
    if args.policy_export:
        version = check_vllm_version(args.vllm_version) if args.vllm_version is not None else None
        write_policy_exports(report, args.policy_export, args.policy_out, version)


def write_policy_exports(report: PolicyReport, fmt: str, folder_arg: str, vllm_version: str | None = None) -> None:
    folder = Path(folder_arg)
    check_output_folder(folder, "--policy-out")
    for one in format_names() if fmt == "all" else (fmt,):
        exported = export_best(report, one, vllm_version)
        path = folder / ("policy-" + exported.filename)
        write_output(path, exported.text, "--policy-out")
        status = "exact" if exported.exact else f"closest: {exported.runs}; lost: {'; '.join(exported.lost)}"
        print(f"wrote {path} ({one}: {status})")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"recommend": cmd_recommend}
