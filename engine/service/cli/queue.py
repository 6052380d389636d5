"""CLI commands that talk to the store: worker, submit, requeue, sessions.

They let a headless GPU box be tuned without a browser: queue a session, run the worker, list what
happened; `recommend` (engine.service.cli.recommend) then exports the recommended config.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.policy import grammar as policy_grammar
from engine.errors import SettingsError, SpectuneError
from engine.service.cli import budget as budget_cli
from engine.service.run_options import spec_from_args
from engine.service.sizing.pace_probe import PROBE_TOKENS
from engine.session.runner import PromptText
from engine.session.spec import MODES


def add_commands(sub: Any, add_run_options: Callable[[argparse.ArgumentParser, bool], None]) -> None:
    """Register the queue commands on the main parser."""
    worker = sub.add_parser("worker", help="run queued sessions (long-lived; keeps models loaded)")
    worker.add_argument("--once", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--max-sessions", type=int, default=None)

    submit = sub.add_parser(
        "submit", help="queue a session (same options as run; repeat --draft/--gamma/--temperature)"
    )
    add_run_options(submit, True)
    submit.add_argument("--name", default=None)
    submit.add_argument("--serving-batch", type=int, default=1, help="batch size for regime detection")
    submit.add_argument("--no-regime", action="store_true", help="skip the batch sweep after the session")
    submit.add_argument(
        "--sample",
        choices=["first", "stratified"],
        default=None,
        help="which --max-prompts prompts: the first in file order, or stratified by category "
        "(default: stratified when the file names two or more categories)",
    )
    submit.add_argument(
        "--estimate",
        action="store_true",
        help="print the estimated time and memory (as the Run page's Estimate) and queue nothing",
    )
    submit.add_argument(
        "--probe",
        action="store_true",
        help="with --estimate: first time the target alone on the first prompt (its load and "
        f"{PROBE_TOKENS} tokens, in a child process) and estimate from that when no comparable "
        "session has run here (as the Run page's Probe)",
    )
    budget_cli.add_options(submit)
    submit.add_argument(
        "--mode",
        choices=MODES,
        default="quick",
        help="quick (default): the target alone and each draft once at the widest --gamma, every γ and policy "
        "predicted from that pass, the best confirmed live; full: every draft × γ × policy measured",
    )
    submit.add_argument(
        "--no-confirm",
        action="store_true",
        help="full mode: do not run the recommended configuration live when the grid did not measure it "
        "(by default a full session ends by confirming an extrapolated headline beside the target alone)",
    )
    submit.add_argument(
        "--policy",
        action="append",
        default=None,
        help=f"a speculation policy also run live (full mode) or predicted (quick): {policy_grammar()} (repeatable)",
    )

    requeue = sub.add_parser(
        "requeue",
        help="continue an interrupted session (or one whose worker died): every configuration × prompt "
        "it measured is reused, only the missing ones run",
    )
    requeue.add_argument("--session", type=int, required=True)

    cancel = sub.add_parser(
        "cancel",
        help="cancel a session (as the Run page's Cancel): a queued one at once, a "
        "running one at its worker's next step, what it measured kept",
    )
    cancel.add_argument("--session", type=int, required=True)

    sessions = sub.add_parser("sessions", help="list sessions")
    sessions.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _defaults(values: list | None, default: Any) -> list:
    """Repeatable options: the values given, or the single default."""
    return list(values) if values else [default]


def cmd_worker(args: argparse.Namespace) -> int:
    from engine.service.worker.loop import main_worker

    return main_worker(once=args.once, max_sessions=args.max_sessions)


def cmd_submit(args: argparse.Namespace) -> int:
    from engine.measure.hardware import describe_hardware
    from engine.prompts import load_prompt_file
    from engine.service.jobs import check_prompts_fit, open_app_store, submit_session, validate_submission
    from engine.session.sampling import has_categories, sample_indices

    hardware = describe_hardware()
    why = budget_cli.engine_choice(args, hardware)
    drafts = _defaults(args.draft, "qwen2.5-coder-0.5b")
    gammas = _defaults(args.gamma, 4)
    temps = _defaults(args.temperature, 0.0)
    settings = budget_cli.defaulted(
        args,
        why,
        lambda: spec_from_args(
            args,
            drafts=drafts,
            gammas=gammas,
            temperatures=temps,
            serving_batch=args.serving_batch,
            detect_regime=not args.no_regime,
            mode=args.mode,
            confirm=args.mode == "full" and not args.no_confirm,
            policies=list(args.policy or []),
        ),
    )
    if args.probe and not args.estimate:
        raise SettingsError("--probe goes with --estimate: it times the target for the estimate, and queues nothing")
    parsed = load_prompt_file(Path(args.prompts))
    for issue in parsed.issues:
        print(f"warning: {args.prompts}: {issue}", file=sys.stderr)
    settings.prompt_sample = args.sample or (
        "stratified" if has_categories([p.category for p in parsed.prompts]) else "first"
    )
    if args.max_prompts is not None and args.max_prompts < 1:
        raise SettingsError(f"--max-prompts {args.max_prompts}: must be at least 1")
    settings.time_budget_s = budget_s = budget_cli.budget_of(args, hardware)  # kept with the session
    # the prompts the session decodes, each with its number in the file: only these are stored
    categories = [p.category for p in parsed.prompts]
    picked = sample_indices(categories, args.max_prompts, settings.prompt_sample)
    chosen = [parsed.prompts[i] for i in picked]
    count = len(chosen)
    validate_submission(settings, count)  # refuse before anything is stored
    check_prompts_fit(
        settings, [(f"prompt {i + 1} (line {parsed.prompts[i].source_line})", parsed.prompts[i].text) for i in picked]
    )
    store = open_app_store()
    if args.estimate and args.probe:
        from engine.service.sizing.estimate import estimate_with_probe

        first = chosen[0]
        done = estimate_with_probe(store, settings, count, PromptText("0", first.text, first.category))
        print(
            "not probed: a finished session on this machine gives the pace"
            if done.probe_s is None
            else f"probed the target alone in {done.probe_s:.0f} s"
        )
    sized = budget_cli.fit(store, settings, count, budget_s, args.keep_plan)
    if sized.cuts:  # the stratified sample of the sized count, from the same file
        settings, picked = sized.spec, sample_indices(categories, sized.n_prompts, settings.prompt_sample)
        chosen, count = [parsed.prompts[i] for i in picked], len(picked)
        validate_submission(settings, count)
    budget_cli.warn_if_over(sized)  # said before the session is queued, never after
    if args.estimate:
        from engine.service.sizing.estimate import estimate_for

        print("\n".join(estimate_for(store, settings, count).sentences()))
        return 0
    set_id, added, dupes = store.add_prompt_set(
        Path(args.prompts).name,
        Path(args.prompts).name,
        [{"text": p.text, "category": p.category} for p in chosen],
    )
    session_id = submit_session(store, settings, set_id, count, args.name)
    print(f"queued session {session_id} (prompt set {set_id}: {added} new prompts, {dupes} already stored)")
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store

    if not open_app_store().requeue_session(args.session):
        raise SpectuneError(
            f"session {args.session} is not interrupted: only an interrupted session (or one whose "
            "worker died) can be re-queued"
        )
    print(f"session {args.session} queued again")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store

    store = open_app_store()
    session = store.get_session(args.session)
    if session is None:
        raise SpectuneError(f"session {args.session} does not exist")
    if not store.request_cancel(args.session):
        raise SpectuneError(
            f"session {args.session} is {session['status']}: only a queued or running session can be cancelled"
        )
    now = store.get_session(args.session)["status"]
    print(
        f"session {args.session} cancelled"
        if now == "cancelled"
        else f"cancel requested for session {args.session}: its worker stops it at the next step"
    )
    return 0


def cmd_sessions(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store
    from engine.service.sizing.budget import budget_outcome
    from engine.session.summarise import best_speedup, stored_speedup_flag

    rows = open_app_store().list_sessions()
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    head = f"{'id':>4}  {'status':<10} {'progress':>9}  {'target':<22} {'drafts':<30} {'gammas':<12}"
    print(f"{head} {'best':>6}  created")
    for s in rows:
        progress = f"{s.get('progress_done') or 0}/{s.get('progress_total') or 0}"
        runs = [r for r in (s.get("summary") or {}).get("runs") or [] if isinstance(r, dict)]
        best = best_speedup(runs)
        print(
            f"{s['id']:>4}  {s['status']:<10} {progress:>9}  {s['target'][:22]:<22} "
            f"{','.join(s['drafts'])[:30]:<30} {','.join(map(str, s['gammas']))[:12]:<12} "
            f"{best.text() if best else '—':>6}  {str(s['created_at'])[:19]}"
        )
        if s.get("error"):
            print(f"      error: {s['error']}")
        if (budget := budget_outcome(s)) is not None:
            print(f"      time budget {budget}")
        for run in runs:
            if flag := stored_speedup_flag(run):
                print(f"      impossible, not a result: {_run_name(run)}: {flag}")
    return 0


def _run_name(run: dict[str, Any]) -> str:
    how = f"policy {run['policy']}" if run.get("policy") else f"γ={run.get('gamma')}"
    return f"{run.get('draft')} {how} T={float(run.get('temperature') or 0.0):g}"


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "worker": cmd_worker,
    "submit": cmd_submit,
    "sessions": cmd_sessions,
    "requeue": cmd_requeue,
    "cancel": cmd_cancel,
}
