"""The run options that belong to one engine or another, set on a spec from `run`'s or `submit`'s arguments."""

from __future__ import annotations

import argparse
from typing import Any

from engine.engines import registry
from engine.measure.hardware import machine_dtype
from engine.session.spec import SessionSpec


def spec_from_args(args: argparse.Namespace, **settings: Any) -> SessionSpec:
    """The spec `run` and `submit` decode with: the target and decoding options they share, `settings` for the
    rest (drafts, γ, temperatures, …), and the engine's own options applied."""
    spec = SessionSpec(
        target=args.target,
        max_new_tokens=args.max_new_tokens,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        dtype=args.dtype or machine_dtype(),
        device=args.device,
        chat_template=not args.no_chat_template,
        trust_remote_code=args.trust_remote_code,
        engine=registry.engine_from_cli(args.engine),
        **settings,
    )
    apply_engine_options(spec, args)
    return spec


def apply_engine_options(settings: SessionSpec, args: argparse.Namespace) -> None:
    """Concurrency levels (an engine that batches) and the engine's own options, from their flags."""
    settings.concurrency = registry.concurrency_for(settings.engine, args.concurrency)
    settings.engine_options = registry.options_from_values(settings.engine, vars(args))
