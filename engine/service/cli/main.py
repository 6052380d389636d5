"""`python -m engine …`: run, theory, crossover, prepare, and the worker/queue commands.

Every user error (bad argument, missing file, unknown model, out-of-range setting) is one clear
line on stderr and exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from pathlib import Path
from typing import Any

from engine.engines import registry
from engine.errors import SpectuneError
from engine.service.cli import endpoint as endpoint_cli
from engine.service.cli import export_check as export_check_cli
from engine.service.cli import policy as policy_cli
from engine.service.cli import recommend as recommend_cli
from engine.service.cli import report as report_cli
from engine.service.cli import store as store_cli
from engine.service.cli import watch as watch_cli
from engine.service.outputs import os_error_reason, output_file
from engine.service.run_options import spec_from_args

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line: 'spectune: error: …' and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _dtype(value: str) -> str:
    if value not in ("float32", "bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"'{value}' is not one of float32, bfloat16, float16")
    return value


def _levels(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a comma-separated list of whole numbers") from None


def _add_run_options(p: argparse.ArgumentParser, multi: bool) -> None:
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="bundled name, .gguf path, model dir or id")
    p.add_argument(
        "--draft",
        default=None if multi else "qwen2.5-coder-0.5b",
        action="append" if multi else "store",
        help="draft model reference, 'ngram', 'suffix[:DEPTH[:SPEC_FACTOR[:MIN_PROB[:CACHED]]]]', or 'none' "
        "(target alone)" + (" (repeatable)" if multi else ""),
    )
    p.add_argument("--prompts", required=True, help="plain text (one prompt a line) or JSONL with prompt/turns")
    p.add_argument("--gamma", type=int, default=None if multi else 4, action="append" if multi else "store")
    p.add_argument("--temperature", type=float, default=None if multi else 0.0, action="append" if multi else "store")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dtype",
        type=_dtype,
        default=None,
        help="default: bfloat16 on a GPU or a CPU with bf16 instructions, else float32 (as the Run page)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts raw, without the chat template")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the checkpoint (off)")
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=None,
        help="requests in flight, e.g. 1,2,4,8 (the default for vLLM, which batches; 1 elsewhere)",
    )
    registry.add_engine_arguments(p)
    p.add_argument(
        "--engine",
        choices=registry.sweep_cli_choices(),
        default=None if multi else "spectune",
        help="spectune: the PyTorch loop (exact β per position); llamacpp: a llama-server per configuration"
        + (
            " (default: llamacpp on a machine without a GPU where it is installed and the target has a GGUF, "
            "else spectune)"
            if multi
            else ""
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="spectune engine: measure speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="decode prompts with a target and a draft; write a JSON report")
    _add_run_options(run, multi=False)
    run.add_argument("--json", dest="json_out", required=True, type=output_file, help="where to write the report")
    policy_cli.add_run_option(run)  # --policy fixed:G | confidence:P[:NMAX[:NMIN]] | heuristic:START | adaptive

    theory = sub.add_parser("theory", help="Theorem 3.8 speedup and Theorem 3.11 operations multiplier")
    theory.add_argument("--alpha", type=float, required=True)
    theory.add_argument("--gamma", type=int, required=True)
    theory.add_argument("--c", type=float, default=0.0)
    theory.add_argument("--c-hat", type=float, default=None, help=C_HAT_HELP)

    cross = sub.add_parser("crossover", help="the γ at which the operations multiplier overtakes the speedup")
    cross.add_argument("--alpha", type=float, required=True)
    cross.add_argument("--c", type=float, default=0.0)
    cross.add_argument("--c-hat", type=float, default=None, help=C_HAT_HELP)
    cross.add_argument("--max-gamma", type=int, default=32)

    prep = sub.add_parser("prepare", help="assemble, verify and convert the bundled models")
    prep.add_argument("models", nargs="*", help="bundled model names (default: all)")

    from engine.service.cli import queue as queue_cli

    queue_cli.add_commands(sub, _add_run_options)
    recommend_cli.add_commands(sub)  # recommend: the draft, γ and policy to serve with; exports
    endpoint_cli.add_commands(sub)  # serve (a managed llama-server), probe (sweep a running endpoint)
    policy_cli.add_commands(sub)  # policies (replay every speculation policy)
    report_cli.add_commands(sub)  # report (one shareable HTML file of a session)
    export_check_cli.add_commands(sub)  # check-export (a vLLM export measured as it is)
    store_cli.add_commands(sub)  # backup (checked, or --recover), restore
    watch_cli.add_commands(sub)  # watch (a running deployment, window by window)
    return parser


def _load_prompts(path: str, limit: int | None) -> list[Any]:
    from engine.prompts import load_prompt_file
    from engine.session.runner import PromptText

    result = load_prompt_file(Path(path))
    for issue in result.issues:
        where = f"line {issue.line}: " if issue.line else ""
        print(f"warning: {path}: {where}{issue.message}", file=sys.stderr)
    prompts = [PromptText(p.prompt_id, p.text, p.category) for p in result.prompts]
    if limit is not None:
        if limit < 1:
            raise SpectuneError(f"--max-prompts {limit}: must be at least 1")
        prompts = prompts[:limit]
    return prompts


def cmd_run(args: argparse.Namespace) -> int:
    from engine.service.outputs import write_output

    draft = args.draft
    policy, gammas = policy_cli.run_policy(args) if draft != "none" else (None, [1])
    settings = spec_from_args(
        args,
        drafts=[draft],
        gammas=gammas,
        policies=[policy] if policy else [],
        temperatures=[args.temperature],
        measure_verify_cost=True,
    )
    registry.validate(settings)
    out_path = Path(args.json_out)
    prompts = _load_prompts(args.prompts, args.max_prompts)
    report = registry.sweep(settings, prompts).to_dict()
    if report["failed"]:
        raise SpectuneError(report["failed"][0]["error"])
    flat = policy_cli.flatten_policy(flatten_report(report, gammas[0] if gammas else 0), report, policy)
    write_output(out_path, json.dumps(flat, indent=2), "--json")
    print(
        f"{flat['draft']} {policy or 'γ=' + str(flat['gamma'])} T={flat['temperature']}: α={_fmt(flat['alpha'])} "
        f"tokens per call={_fmt(flat['tokens_per_call'])} c={_fmt(flat['c'])} "
        f"{flat['tokens_per_s']:.2f} tok/s vs {flat['baseline_tokens_per_s']:.2f} baseline "
        f"(speedup {_fmt(_shown_speedup(flat))}× measured over the whole run{_verdict(flat)}, "
        f"{_fmt(flat['speedup_predicted'])}× predicted){_prompt_band(flat)}"
    )
    for line in run_judgement(flat):
        print(line)
    return 0


def _verdict(flat: dict[str, Any]) -> str:
    """', too noisy to tell' (or the spread's verdict) after a measured speedup, as the pages say it."""
    spread = flat.get("speedup_measured_spread") or {}
    if flat.get("speedup_noisy"):
        return ", too noisy to tell"
    return f", {spread['verdict']}" if spread.get("verdict") in ("faster", "slower") else ""


def _shown_speedup(flat: dict[str, Any]) -> float | None:
    """The run's one speedup, as the pages show it: over the whole run (the median of its prompts without a run)."""
    whole = flat.get("speedup_whole_run")
    return whole if whole is not None else flat.get("speedup_measured")


def _prompt_band(flat: dict[str, Any]) -> str:
    """'; prompts 0.91–1.12× (median 1.02×)': the per-prompt spread, where the median lives."""
    spread = flat.get("speedup_measured_spread") or {}
    if spread.get("min") is None or spread.get("max") is None:
        return ""
    return f"; prompts {spread['min']:.2f}–{spread['max']:.2f}× (median {_fmt(spread.get('median'))}×)"


def run_judgement(flat: dict[str, Any]) -> list[str]:
    """What a session would say of this run beside its speedup: its bound check, the measurement floor, the loop
    and threads it was measured with."""
    lines = []
    if flat.get("speedup_flag"):
        lines.append(f"flag: {flat['speedup_flag']}")
    floor = flat.get("measurement_floor") or {}
    if floor.get("sentence"):
        lines.append(str(floor["sentence"]))
    if (flat.get("measurement_overhead") or {}).get("sentence"):
        lines.append(str(flat["measurement_overhead"]["sentence"]))
    if flat.get("loop"):
        threads = f"; threads {flat['threads_basis']}" if flat.get("threads_basis") else ""
        lines.append(f"loop: {flat['loop_basis'] and flat['loop'] + ' (' + flat['loop_basis'] + ')'}{threads}")
    return lines


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def flatten_report(report: dict[str, Any], gamma: int) -> dict[str, Any]:
    """The CLI contract: one draft, one γ — the speculative run's figures at top level."""
    base = report["baseline"]
    run = report["runs"][0] if report["runs"] else None
    src = run or base
    outputs = src["outputs"]
    divergences = (
        run["divergences"]
        if run
        else [{"prompt_id": o["prompt_id"], "identical": True, "verdict": "identical"} for o in outputs]
    )
    return {
        "target": report["target"],
        "draft": run["draft"] if run else "none",
        "gamma": gamma if run else 0,
        "temperature": run["temperature"] if run else 0.0,
        "dtype": report["dtype"],
        "device": report["device"],
        "alpha": src.get("alpha"),
        "alpha_from_acceptance_length": src.get("alpha_from_acceptance_length"),
        "tokens_per_call": src.get("tokens_per_call"),
        # renamed keys kept for one release (docs/cli.md: the `run --json` contract); read the new names
        "alpha_from_mean_accepted": src.get("alpha_from_acceptance_length"),
        "mean_accepted_tokens": src.get("tokens_per_call"),
        "draft_acceptance_rate": src.get("draft_acceptance_rate"),
        "per_position_acceptance": src.get("per_position_acceptance", []),
        "c": src.get("c"),
        "verify_cost": report["verify_cost"],
        "tokens_per_s": src["tokens_per_s"],
        "baseline_tokens_per_s": base["tokens_per_s"],
        "speedup_measured": src.get("speedup_measured"),
        # per-prompt speedups measured side by side: median (= speedup_measured), min, max, n and a verdict
        "speedup_measured_spread": run.get("speedup_spread") if run else None,
        "speedup_noisy": run.get("speedup_noisy") if run else None,
        # the bound check a session applies (engine.session.summarise.speedup_flag): None when the speedup stands
        "speedup_flag": run.get("speedup_flag") if run else None,
        "speedup_whole_run": run.get("speedup_whole_run") if run else None,
        "speedup_predicted": src.get("speedup_predicted"),
        "measurement_floor": report.get("measurement_floor"),  # the A/A check: target ÷ target, side by side
        "measurement_overhead": report.get("measurement_overhead"),  # the prime's and the A/A's cost beside decoding
        "loop": report.get("loop"),  # spectune's loop: eager or compiled, and why
        "loop_basis": report.get("loop_basis"),
        "compile_s": report.get("compile_s"),
        "threads": report.get("threads"),  # the CPU intra-op threads every configuration decoded with
        "threads_basis": report.get("threads_basis"),
        "machine_load": report.get("machine_load"),
        "machine_note": report.get("machine_note"),
        "agreement_runs": src.get("agreement_runs", []),
        "outputs": [
            {"prompt_id": o["prompt_id"], "text": o["text"], "token_ids": o["token_ids"], "from_draft": o["from_draft"]}
            for o in outputs
        ],
        "divergences": divergences,
        "settings": report["settings"],
        "engine": report.get("engine", "spectune"),
        "llama_cpp": report.get("llama_cpp"),  # the llama-server build, for llama.cpp runs
        "unavailable": report.get("unavailable", []),  # fields this engine cannot measure (null above)
        "suffix_cache": report.get("suffix_cache"),  # suffix runs: the prompts' order, each one's cache warm or cold
        "vllm": report.get("vllm"),  # the vLLM install, its CPU kernel and start-up times, for vLLM runs
        "levels": _levels_table(report),  # per concurrency level (an engine that batches), else []
    }


LEVEL_FIELDS = ("draft", "gamma", "temperature", "concurrency", "tokens_per_s", "speedup_measured", "speedup_noisy",
                "tokens_per_call", "draft_acceptance_rate", "ttft_p50_s", "itl_p50_s")  # fmt: skip


def _levels_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each run at each concurrency, the baselines included, when the engine measured more than one level."""
    runs = [*report["baselines"], *report["runs"]]
    if len({r.get("concurrency", 1) for r in runs}) < 2:
        return []
    return [{k: r.get(k) for k in LEVEL_FIELDS} for r in runs]


C_HAT_HELP = "draft arithmetic ÷ target arithmetic (default: c, the draft's time share; 0 reproduces the chapter)"


def _c_hat(args: argparse.Namespace) -> float:
    """ĉ as given, else c (a memory-bound forward's time follows the bytes streamed, i.e. the parameters); said."""
    if args.c_hat is not None:
        return float(args.c_hat)
    if args.c:
        print(f"c_hat not given: taken as c = {args.c} (pass --c-hat to set the draft's arithmetic share)")
    return float(args.c)


def cmd_theory(args: argparse.Namespace) -> int:
    from engine.analysis import theory

    args.c_hat = _c_hat(args)
    speed = theory.walltime_improvement(args.alpha, args.gamma, args.c)
    ops = theory.operations_multiplier(args.alpha, args.gamma, args.c_hat)
    tokens = theory.expected_tokens_per_call(args.alpha, args.gamma)
    print(f"alpha={args.alpha} gamma={args.gamma} c={args.c} c_hat={args.c_hat}")
    print(f"expected tokens per target call: {tokens:.2f}")
    print(f"walltime improvement (Theorem 3.8): {speed:.2f}x")
    print(f"operations multiplier (Theorem 3.11): {ops:.2f}x")
    print(f"cost per token, memory-bound: {100 * (1 / speed - 1):+.0f}%; compute-bound: {100 * (ops - 1):+.0f}%")
    return 0


def cmd_crossover(args: argparse.Namespace) -> int:
    from engine.analysis import theory

    c_hat = _c_hat(args)
    g = theory.crossover_gamma(args.alpha, c=args.c, c_hat=c_hat, max_gamma=args.max_gamma)
    if g is None:
        print(f"alpha={args.alpha}: no crossover below gamma={args.max_gamma}")
        return 0
    print(f"alpha={args.alpha}: crossover at gamma={g}")
    if g > 1:
        speed = theory.walltime_improvement(args.alpha, g - 1, args.c)
        ops = theory.operations_multiplier(args.alpha, g - 1, c_hat)
        print(f"just before it, gamma={g - 1}: {speed:.2f}x speed, {ops:.2f}x ops")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from engine.models.bundled import BUNDLED
    from engine.models.loading import prepare_bundled

    names = args.models or list(BUNDLED)
    for name in names:
        if name not in BUNDLED:
            raise SpectuneError(f"unknown bundled model '{name}'; known: {', '.join(BUNDLED)}")
        print(f"{name}: {prepare_bundled(name)}", flush=True)
    return 0


COMMANDS = {"run": cmd_run, "theory": cmd_theory, "crossover": cmd_crossover, "prepare": cmd_prepare,
            **recommend_cli.COMMANDS, **endpoint_cli.COMMANDS, **policy_cli.COMMANDS,
            **report_cli.COMMANDS, **export_check_cli.COMMANDS, **store_cli.COMMANDS, **watch_cli.COMMANDS}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A reader that stops reading (``| head -1``) ends it quietly with 0."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # now, while a closed pipe can still be told from a bug
        return code
    except BrokenPipeError as exc:
        if not _stdout_closed():
            return _unexpected(exc)
        _silence_stdout()
        return 0


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (the kernel reports POLLERR on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so what is still buffered is dropped at exit instead of raising again."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from engine.service.cli import queue as queue_cli

    handler = COMMANDS.get(args.command) or queue_cli.COMMANDS[args.command]
    try:
        return handler(args)
    except SpectuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # out-of-domain numbers (e.g. α outside [0, 1]) from the theory module
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if _stdout_closed():
            raise  # the reader has gone: main() ends quietly
        return _unexpected(exc)
    except Exception as exc:
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    """A bug, not a user error: one line, the traceback only on request; a full disk or no permission is exit 2."""
    if os.environ.get("SPECTUNE_DEBUG"):
        raise exc
    if isinstance(exc, OSError) and (reason := os_error_reason(exc)):
        print(f"error: {str(exc.filename) + ': ' if exc.filename else ''}{reason}", file=sys.stderr)
        return EXIT_USAGE
    first = str(exc).splitlines()[0] if str(exc) else ""
    hint = "(set SPECTUNE_DEBUG=1 for the traceback)"
    print(f"internal error: {type(exc).__name__}: {first} {hint}", file=sys.stderr)
    return 1
