"""The target alone in three engines, side by side: vLLM (CPU build, a managed server), llama.cpp (llama-server on the
bundled GGUF) and spectune's PyTorch loop, on the same target and prompts.

Usage:  python bench/bench_vllm.py [--target smollm2-135m] [--prompts samples/code.jsonl] [--max-prompts 6]
                                   [--max-new-tokens 32] [--json bench/results/vllm.json]

Every engine is started once through its session Runner (engine/engines/), then the prompts are decoded one at a
time, interleaved: for prompt i every engine decodes it in turn, the order rotating per prompt, so each per-prompt
ratio compares neighbouring measurements and a load change between minutes cannot make one. Printed: each engine's
median tokens/s, and per pair the median per-prompt ratio with its lowest–highest spread and the noise verdict.
What each engine's seconds cover: llama.cpp's server timings (decode only), vLLM's request wall time (prefill
included: it reports no decode-only time), spectune's decode loop. Takes a few minutes (one vLLM start included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.engines import registry
from engine.measure import noise
from engine.prompts import load_prompt_file
from engine.service.outputs import output_file, run_command, write_output
from engine.session.runner import DecodeContext, PromptText, RunKey
from engine.session.spec import SessionSpec

ENGINES = ("vllm", "llama.cpp", "spectune")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", default="samples/code.jsonl")
    parser.add_argument("--max-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", type=output_file, default=None, help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    parsed = load_prompt_file(Path(args.prompts)).prompts[: args.max_prompts]
    prompts = [PromptText(str(i), p.text, p.category) for i, p in enumerate(parsed)]
    ctx = DecodeContext(on_step=lambda r: None, should_stop=lambda: False, phase=lambda *a: None)
    key = RunKey("none", 0, 0.0)
    runners: dict[str, Any] = {}
    rates: dict[str, list[float]] = {name: [] for name in ENGINES}
    try:
        for name in ENGINES:
            spec = SessionSpec(target=args.target, drafts=["none"], gammas=[1], max_new_tokens=args.max_new_tokens,
                               dtype="float32", engine=name)  # fmt: skip
            runners[name] = registry.runner_for(spec)
            print(f">> starting {name}", flush=True)
            runners[name].start(spec, prompts, [key], ctx)
            runners[name].warm_up([key])
        for index in range(len(prompts)):
            order = list(ENGINES[index % len(ENGINES) :] + ENGINES[: index % len(ENGINES)])
            for name in order:
                decoded = runners[name].decode(key, index, ctx, reference=False)
                tokens = decoded.tokens if decoded.tokens is not None else len(decoded.output.token_ids)
                rates[name].append(tokens / decoded.decode_s if decoded.decode_s > 0 else 0.0)
            print(f"prompt {index + 1}: " + ", ".join(f"{n} {rates[n][-1]:.1f} tok/s" for n in ENGINES), flush=True)
    finally:
        for runner in runners.values():
            runner.stop()
    report: dict[str, Any] = {"target": args.target, "prompts": len(prompts), "median_tokens_per_s": {}, "ratios": {}}
    for name in ENGINES:
        report["median_tokens_per_s"][name] = median(rates[name])
        print(f"{name}: {median(rates[name]):.1f} tok/s (median over {len(rates[name])} prompts)")
    for a, b in (("vllm", "llama.cpp"), ("vllm", "spectune"), ("llama.cpp", "spectune")):
        spread = noise.spread_of(noise.ratios(list(zip(rates[b], rates[a], strict=True))))
        if spread is not None:
            report["ratios"][f"{a}/{b}"] = spread.to_dict()
            print(f"{a} ÷ {b}: {spread.median:.2f}× ({spread.min:.2f}–{spread.max:.2f}, {spread.verdict})")
    if args.json:
        write_output(args.json, json.dumps(report, indent=2) + "\n", "--json")
    return 0


if __name__ == "__main__":
    run_command(main, sys.argv[1:])
