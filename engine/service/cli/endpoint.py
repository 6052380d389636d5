"""Endpoint commands: `serve` (a managed llama-server in the foreground) and `probe` (a concurrency sweep
against a running OpenAI-compatible endpoint); endpoint sessions are engine.service.endpoint_sessions.

    python -m engine serve --engine llamacpp --target NAME [--draft NAME|ngram] [--gamma G] [--parallel N] [--port P]
    python -m engine probe --url URL [--model NAME] [--api-key-env VAR] --prompts FILE --concurrency 1,2,4 \
        [--max-requests N] [--max-new-tokens N] --json OUT

`probe` exits 0 when every level ran, 1 when the sweep was stopped (the JSON then holds what was measured
until then and the message under "stopped"), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from engine.errors import SettingsError
from engine.service.outputs import check_output, output_file, write_output


def add_commands(sub: Any) -> None:
    """Register `serve` and `probe` on the main parser."""
    serve = sub.add_parser("serve", help="start a managed llama-server on 127.0.0.1 in the foreground")
    serve.add_argument("--engine", choices=("llamacpp",), default="llamacpp")
    serve.add_argument("--target", default="qwen2.5-coder-1.5b", help="bundled model name or .gguf path")
    serve.add_argument("--draft", default="none", help="bundled draft name, .gguf path, 'ngram' or 'none'")
    serve.add_argument("--gamma", type=int, default=4, help="tokens drafted per step")
    serve.add_argument("--parallel", type=int, default=1, help="slots (concurrent requests), 1 to 64")
    serve.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    serve.add_argument("--threads", type=int, default=None)
    serve.add_argument("--ctx-size", type=int, default=2048, help="context per slot (tokens)")

    probe = sub.add_parser("probe", help="sweep a running OpenAI-compatible endpoint over concurrency levels")
    probe.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://host:8000 (or …/v1)")
    probe.add_argument("--model", default="", help="model name to request (default: the first at /v1/models)")
    probe.add_argument("--api-key-env", default="", help="NAME of the environment variable holding the API key")
    probe.add_argument("--prompts", required=True, help="plain text (one prompt a line) or JSONL")
    probe.add_argument("--concurrency", default="1,2,4", help="levels, e.g. 1,2,4,8 (each at most 64)")
    probe.add_argument("--max-requests", type=int, default=16, help="requests per level (cap)")
    probe.add_argument("--max-duration-s", type=float, default=120.0, help="seconds per level (cap)")
    probe.add_argument("--max-new-tokens", type=int, default=64)
    probe.add_argument("--temperature", type=float, default=0.0)
    probe.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    probe.add_argument("--api", choices=("completions", "chat"), default="completions")
    probe.add_argument(
        "--kind",
        choices=("auto", "vllm", "sglang", "llama.cpp", "openai"),
        default="auto",
        help="engine behind the URL (default: detected)",
    )
    probe.add_argument("--baseline-url", default="", help="the same model served without speculation (optional)")
    probe.add_argument("--ignore-eos", action="store_true", help="ask for exactly --max-new-tokens tokens")
    probe.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the first level")
    probe.add_argument("--ttft-slo", type=float, default=0.0, help="latency target: time to first token (s)")
    probe.add_argument("--tpot-slo", type=float, default=0.0, help="latency target: time per output token (s)")
    probe.add_argument("--json", dest="json_out", required=True, type=output_file, help="where to write the results")


# --------------------------------------------------------------------------------------------------------------
# serve


class _Terminated(Exception):
    """SIGTERM arrived: leave the foreground loop and stop the server."""


def server_config(args: argparse.Namespace) -> Any:
    from engine.core.policy import FixedGamma
    from engine.engines.llamacpp.launch import server_for_draft
    from engine.models.bundled import gguf_for

    if not 1 <= args.parallel <= 64:
        raise SettingsError(f"--parallel {args.parallel}: 1 to 64 slots")
    if not 1 <= args.gamma <= 64:
        raise SettingsError(f"--gamma {args.gamma}: 1 to 64")
    if not 0 <= args.port <= 65535:
        raise SettingsError(f"--port {args.port}: 0 to 65535")
    if not 256 <= args.ctx_size <= 131072:
        raise SettingsError(f"--ctx-size {args.ctx_size}: 256 to 131072")
    if args.threads is not None and not 1 <= args.threads <= 1024:
        raise SettingsError(f"--threads {args.threads}: 1 to 1024, or leave it out for llama-server's default")
    target = gguf_for(args.target, "target")
    common = {"ctx_size": args.ctx_size * args.parallel, "parallel": args.parallel, "threads": args.threads}
    return server_for_draft(target, (args.draft or "none").strip(), FixedGamma(args.gamma), gguf_for, **common)


def cmd_serve(args: argparse.Namespace) -> int:
    from engine.engines.llamacpp.server import ManagedServer

    config = server_config(args)

    def _term(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, _term)
    server = ManagedServer(config, port=args.port)
    try:
        server.start()
        print(f"llama-server ready: {server.url}  (OpenAI API at {server.url}/v1; Ctrl-C stops it)", flush=True)
        while server.alive():
            time.sleep(0.5)
        server.check_alive()  # it exited by itself: say why
        return 1
    except (_Terminated, KeyboardInterrupt):
        print("stopping llama-server", file=sys.stderr, flush=True)
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------------------------
# probe


def _prompt_texts(path: str) -> list[str]:
    from engine.prompts import load_prompt_file

    if not Path(path).is_file():
        raise SettingsError(f"--prompts {path}: file not found")
    result = load_prompt_file(Path(path))
    for issue in result.issues:
        where = f"line {issue.line}: " if issue.line else ""
        print(f"warning: {path}: {where}{issue.message}", file=sys.stderr)
    texts = [p.text for p in result.prompts]
    if not texts:
        raise SettingsError(f"--prompts {path}: no prompts in the file")
    return texts


def probe_entry(endpoint: dict[str, Any]) -> dict[str, Any]:
    """One endpoint of a sweep report in the probe JSON's shape."""
    return {key: endpoint[key] for key in ("url", "model", "api", "engine", "server_version", "warnings", "levels")}


def cmd_probe(args: argparse.Namespace) -> int:
    from engine.service.endpoint_sessions import probe_endpoint

    out_path = Path(args.json_out)
    check_output(out_path, "--json")
    settings = {
        "url": args.url,
        "model": args.model,
        "api_key_env": args.api_key_env,
        "kind": args.kind,
        "api": args.api,
        "baseline_url": args.baseline_url,
        "concurrency": args.concurrency,
        "max_requests": args.max_requests,
        "max_duration_s": args.max_duration_s,
        "request_timeout_s": args.timeout_s,
        "ignore_eos": args.ignore_eos,
        "ttft_slo_s": args.ttft_slo,
        "tpot_slo_s": args.tpot_slo,
        "warmup_requests": args.warmup,
    }
    prompts = _prompt_texts(args.prompts)

    def phase(name: str, done: int, total: int) -> None:
        print(f"[{done + 1}/{total}] {name}", file=sys.stderr, flush=True)

    report = probe_endpoint(settings, prompts, args.max_new_tokens, args.temperature, phase)
    endpoints = {e["label"]: e for e in report["endpoints"]}
    tested = endpoints.get("speculative")
    doc: dict[str, Any] = (probe_entry(tested) if tested else {"levels": []}) | {"stopped": report["stopped"]}
    if "baseline" in endpoints:
        doc["baseline"] = probe_entry(endpoints["baseline"])
        doc["comparison"] = report["comparison"]
    doc["latency_target"] = report["latency_target"]
    write_output(out_path, json.dumps(doc, indent=2), "--json")
    for level in doc["levels"]:
        print(_level_line(level))
    if report.get("comparison"):
        print(report["comparison"]["verdict"])
    if report["stopped"]:
        print(f"error: {report['stopped']} (what was measured is in {args.json_out})", file=sys.stderr)
        return 1
    return 0


def _level_line(level: dict[str, Any]) -> str:
    def f(value: Any, digits: int = 3) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    return (
        f"concurrency {level['concurrency']}: {level['requests']} requests, {level['errors']} errors, "
        f"{f(level['tokens_per_s'], 2)} tok/s, TTFT p50 {f(level['ttft_p50_s'])} s, ITL p50 {f(level['itl_p50_s'])} s, "
        f"acceptance {f(level['draft_acceptance_rate'])}, mean acceptance length {f(level['mean_acceptance_length'])}"
    )


COMMANDS = {"serve": cmd_serve, "probe": cmd_probe}

__all__ = ["COMMANDS", "add_commands"]
