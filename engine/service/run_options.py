"""The run options that belong to one engine or another, set on a spec from `run`'s or `submit`'s arguments."""

from __future__ import annotations

import argparse

from engine.engines import registry
from engine.session.spec import LoopOptions, SessionSpec


def apply_engine_options(settings: SessionSpec, args: argparse.Namespace) -> None:
    """Concurrency levels (an engine that batches), vLLM's threads, and spectune's loop and threads."""
    settings.concurrency = registry.concurrency_for(settings.engine, args.concurrency)
    settings.vllm.threads = args.vllm_threads
    settings.loop = LoopOptions(args.loop, args.threads)
