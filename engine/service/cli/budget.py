"""`submit --budget`: the session sized to a time budget before it is queued, and its default engine said.

The plan is cut to fit the budget (engine.service.sizing.budget) at the pace the estimate uses; the cuts are printed one
line each, before the estimate or the queued line. `--keep-plan` keeps the plan as given: the budget then only
warns. A session whose estimate exceeds its budget says so on stderr before it is queued.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from engine.engines import registry
from engine.errors import SettingsError
from engine.service.sizing.budget import SizedPlan, default_budget, parse_budget, sized_for
from engine.service.sizing.default_engine import default_engine, own_loop
from engine.session.spec import SessionSpec


def budget_arg(value: str) -> str:
    """--budget as typed, once it parses (one line and exit 2 otherwise)."""
    try:
        parse_budget(value)
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_options(submit: argparse.ArgumentParser) -> None:
    """--budget and --keep-plan on `submit`."""
    submit.add_argument(
        "--budget",
        type=budget_arg,
        default=None,
        help="a time budget, e.g. 600s, 10m or 1.5h (none: no budget); the plan (prompts, new tokens, γs, drafts, "
        "the batch sweep) is cut to fit it at the pace of a finished session or a probe here (default: 10m on a "
        "machine without a GPU, none on a GPU)",
    )
    submit.add_argument(
        "--keep-plan",
        action="store_true",
        help="with a budget: keep the plan as given; a session over its budget is only warned about",
    )


def engine_choice(args: argparse.Namespace, hardware: dict[str, Any]) -> str | None:
    """Set args.engine to this machine's default when none was given; the sentence saying why, if any."""
    if args.engine is not None:
        return None
    chosen = default_engine(args.target, hardware)
    args.engine = registry.get(chosen.engine).cli
    return f"engine: {chosen.why.rstrip('.')}; --engine spectune runs that loop." if chosen.why else None


def defaulted(args: argparse.Namespace, why: str | None, build: Callable[[], SessionSpec]) -> SessionSpec:
    """The spec `build` makes; when its engine is this machine's default (`why` says so) and refuses the session
    (a suffix draft, a policy llama-server cannot run), spectune's loop instead. Either way, one line says which."""
    spec = build()
    if why is None:
        return spec
    try:
        registry.validate(spec)
    except SettingsError as exc:
        args.engine = registry.get(own_loop()).cli
        print(f"engine: spectune's loop, since {registry.get(spec.engine).label} would refuse this session: {exc}")
        return build()
    print(why)
    return spec


def budget_of(args: argparse.Namespace, hardware: dict[str, Any]) -> float | None:
    """The budget in seconds: --budget's, else this machine's default."""
    return parse_budget(args.budget) if args.budget is not None else default_budget(hardware)


def fit(store: Any, spec: SessionSpec, n_prompts: int, budget_s: float | None, keep: bool) -> SizedPlan:
    """The plan sized to the budget (or only checked, when `keep`), what the sizing did printed."""
    sized = sized_for(store, spec, n_prompts, budget_s, fit=not keep)
    if sized.fitted or not sized.over:  # a kept plan over its budget: warn_if_over says it
        for line in sized.sentences():
            print(f"budget: {line}")
    return sized


def warn_if_over(sized: SizedPlan) -> None:
    """One line on stderr, before the session is queued, when its estimate exceeds its budget."""
    if (line := sized.warning()) is not None:
        print(f"warning: {line}", file=sys.stderr)
