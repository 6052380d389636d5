"""spectune's eager loop against its compiled loop and transformers' `generate` (eager, and static cache + compile),
the target alone, ms per token side by side in one run; and the A/A measurement floor of a few sessions.

Usage:
    python bench/bench_loops.py [--target qwen2.5-coder-1.5b] [--dtypes float32,bfloat16] [--tokens 64]
        [--floor-sessions 3] [--out bench/results/loops.json]

Each figure is the fastest of 3 decodes after an untimed one (and after the compile, for the compiled ones); the
ratios are taken within one dtype, measured back to back. The floor sessions are n-gram sessions in the eager loop
on 4 prompts of samples/prose.txt: each reports target ÷ target (median and spread)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_session_check import generate_ms_per_token, ms_per_token  # noqa: E402

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402


def loops_row(ref: str, dtype: str, tokens: int, prompt: str) -> dict[str, Any]:
    """One dtype's row: every way of decoding the target alone, ms per token, and the ratios to the eager loop."""
    from engine.core.compiled import use_compiled, use_eager
    from engine.models.chat import encode_prompt
    from engine.models.pool import ModelPool

    model = ModelPool().get(ref, dtype, "cpu")
    ids = encode_prompt(model.tokenizer, prompt, True)
    use_eager(model)
    ms_per_token(model, ids, 4, rounds=1)
    row: dict[str, Any] = {"dtype": dtype, "eager_loop_ms": ms_per_token(model, ids, tokens)}
    started = time.perf_counter()
    use_compiled(model, len(ids) + tokens + 16, 9).compile([1])
    row["compile_s"] = time.perf_counter() - started
    ms_per_token(model, ids, 4, rounds=1)
    row["compiled_loop_ms"] = ms_per_token(model, ids, tokens)
    use_eager(model)
    row["generate_eager_ms"], _ = generate_ms_per_token(model, ids, tokens, static=False)
    row["generate_static_compiled_ms"], row["generate_first_call_s"] = generate_ms_per_token(
        model, ids, tokens, static=True
    )
    row["eager_loop_ms_again"] = ms_per_token(model, ids, tokens)  # the first figure re-measured: drift shows here
    base = row["eager_loop_ms"]
    others = ("compiled_loop_ms", "generate_eager_ms", "generate_static_compiled_ms")
    row["ratios_to_eager_loop"] = {k: round(base / row[k], 2) for k in others}
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def floor_sessions(ref: str, dtype: str, sessions: int, tokens: int) -> list[dict[str, Any]]:
    """`sessions` n-gram sessions: each one's measurement floor (the A/A check) and its n-gram speedup."""
    from engine.engines import registry
    from engine.engines.spectune.options import LoopOptions
    from engine.models.pool import ModelPool
    from engine.prompts import load_prompt_file
    from engine.session.runner import PromptText
    from engine.session.spec import SessionSpec

    root = Path(__file__).resolve().parent.parent
    parsed = load_prompt_file(root / "samples" / "prose.txt").prompts[:4]
    prompts = [PromptText(p.prompt_id, p.text, p.category) for p in parsed]
    pool = ModelPool()
    out = []
    for index in range(sessions):
        spec = SessionSpec(target=ref, drafts=["ngram"], gammas=[3], max_new_tokens=tokens, dtype=dtype,
                           device="cpu", engine_options=LoopOptions("eager"))  # fmt: skip
        report = registry.sweep(spec, prompts, pool=pool).to_dict()
        run = report["runs"][0]
        out.append({"session": index + 1, "floor": report["measurement_floor"]["spread"],
                    "holds": report["measurement_floor"]["holds"], "threads": report.get("threads"),
                    "ngram_tokens_per_call": run["tokens_per_call"], "ngram_speedup": run["speedup_measured"],
                    "ngram_noisy": run["speedup_noisy"]})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--floor-sessions", type=int, default=3)
    parser.add_argument("--floor-target", default=None, help="the floor sessions' target (default: --target)")
    parser.add_argument("--out", type=output_file, default="bench/results/loops.json", help="the JSON report to write")
    args = parser.parse_args(argv)
    out = Path(args.out)
    from engine.measure.hardware import describe_hardware

    prompt = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
    report: dict[str, Any] = {"hardware": describe_hardware()["label"], "python": platform.python_version(),
                              "target": args.target, "tokens": args.tokens, "loops": []}  # fmt: skip
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        row = loops_row(args.target, dtype, args.tokens, prompt)
        report["loops"].append(row)
        print(json.dumps(row), flush=True)
        write_output(out, json.dumps(report, indent=1) + "\n", "--out")  # each row kept as soon as it is measured
    if args.floor_sessions:
        report["floor"] = floor_sessions(args.floor_target or args.target, "float32", args.floor_sessions, 32)
        for row in report["floor"]:
            print(json.dumps(row), flush=True)
    write_output(out, json.dumps(report, indent=1) + "\n", "--out")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    run_command(main)
