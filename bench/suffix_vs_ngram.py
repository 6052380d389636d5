"""Suffix decoding vs n-gram lookup vs the 0.5B draft model, per Spec-Bench category and on a repetitive set.

For each prompt, in order, the target alone and every draft decode it greedily in spectune's loop, side by side,
the order rotated from one prompt to the next (each speedup is a ratio of neighbouring measurements, and no method
always runs first): n-gram lookup, the 0.5B draft, suffix decoding cold (no global tree: the prompt tree only) and
suffix decoding warm (one global tree over all the prompts so far, in the order printed). The repetitive set is
built from the same Spec-Bench prompts: each asked again (the warm cache then holds the first answer), and asked
again with a follow-up line. Tokens per target call and the measured speedup per prompt, each method's median
with its range; the cache state (responses cached when the prompt began) is printed. Where a speculative output
left the target alone's text (a near-tie flipped by a batched verify in bf16), the position is recorded and
counted. Then suffix decoding's parameter grid replayed from the recorded baselines (engine.analysis.suffix_grid):
the best settings by tokens per call over all the prompts in order.

Usage: python bench/suffix_vs_ngram.py [--categories 13] [--new-tokens 64] [--gamma 4] [--suffix-gamma 16]
       [--repetitive 3] [--no-draft-model] [--dtype float32]
Writes bench/results/suffix_vs_ngram.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
FOLLOW_UP = "\n\nAnswer once more, exactly as before."


def spec_bench(categories: int) -> list[tuple[str, str]]:
    """One prompt per Spec-Bench category (its shortest: rag and summarization have no short one), categories in
    name order."""
    from engine.prompts import load_prompt_file

    by_category: dict[str, str] = {}
    for prompt in load_prompt_file(SPEC_BENCH).prompts:
        shortest = by_category.get(prompt.category)
        if shortest is None or len(prompt.text) < len(shortest):
            by_category[prompt.category] = prompt.text
    return sorted(by_category.items())[:categories]


def repetitive(prompts: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    """The first n prompts asked again, then asked again with a follow-up line: requests a cache has seen."""
    chosen = prompts[:n]
    return [(f"again:{c}", t) for c, t in chosen] + [(f"follow-up:{c}", t + FOLLOW_UP) for c, t in chosen]


def _decode(target: Any, source: Any, ids: list[int], gamma: int, new_tokens: int) -> dict[str, Any]:
    from engine.core.decoder import DecodeConfig, decode_prompt
    from engine.core.sampling import SamplingConfig

    out, steps = decode_prompt(target, source, ids, DecodeConfig(gamma, SamplingConfig(0.0), new_tokens))
    seconds = out.wall_time_s - out.prefill_time_s
    return {"tokens": len(out.token_ids), "calls": len(steps), "seconds": seconds, "ids": out.token_ids,
            "tokens_per_call": len(out.token_ids) / max(1, len(steps))}  # fmt: skip


BASELINE = "target alone"


def _decode_rotated(
    target: Any, sources: dict[str, tuple[Any, int]], ids: list[int], new_tokens: int, shift: int
) -> dict[str, dict[str, Any]]:
    """The target alone and every draft on one prompt, the order rotated by `shift` so that no method always runs
    first (a machine's drift then spreads over all of them); returned in the order they ran."""
    runs: list[tuple[str, Any, int]] = [(BASELINE, None, 0)] + [(n, s, g) for n, (s, g) in sources.items()]
    shift %= len(runs)
    return {name: _decode(target, source, ids, gamma, new_tokens)
            for name, source, gamma in runs[shift:] + runs[:shift]}  # fmt: skip


def _diverged_at(base: list[int], got: list[int]) -> int | None:
    """The first position where a speculative output left the target alone's (None: the same text)."""
    for i, (a, b) in enumerate(zip(base, got, strict=False)):
        if a != b:
            return i
    return None if len(base) == len(got) else min(len(base), len(got))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.drafts.model import ModelDraft
    from engine.drafts.ngram import NgramDraft
    from engine.drafts.refs import SuffixParams
    from engine.drafts.suffix import SuffixDraft
    from engine.models.chat import encode_prompt
    from engine.models.pool import ModelPool

    pool = ModelPool()
    target = pool.get(TARGET, args.dtype)
    warm = SuffixDraft(SuffixParams(), name="suffix (warm)")
    sources: dict[str, tuple[Any, int]] = {"ngram": (NgramDraft(), args.gamma)}
    if not args.no_draft_model:
        sources[DRAFT] = (ModelDraft(pool.get(DRAFT, args.dtype), target.vocab_size, name=DRAFT), args.gamma)
    sources["suffix cold"] = (SuffixDraft(SuffixParams(max_cached_requests=0)), args.suffix_gamma)
    sources["suffix warm"] = (warm, args.suffix_gamma)
    base_set = spec_bench(args.categories)
    rows, recorded, n = [], [], 0
    for kind, prompts in (("spec-bench", base_set), ("repetitive", repetitive(base_set, args.repetitive))):
        for category, text in prompts:
            ids = encode_prompt(target.tokenizer, text, True)
            cached = warm.cached_requests
            got = _decode_rotated(target, sources, ids, args.new_tokens, n)
            n += 1
            base = got.pop(BASELINE)
            recorded.append((ids, base["ids"]))
            row: dict[str, Any] = {"set": kind, "category": category, "warm_cached_before": cached,
                                   "order": list(got), "methods": {}}  # fmt: skip
            for name, out in got.items():
                row["methods"][name] = {"tokens_per_call": round(out["tokens_per_call"], 3),
                                        "speedup": round(base["seconds"] / out["seconds"], 3),
                                        "diverged_at": _diverged_at(base["ids"], out["ids"])}  # fmt: skip
            rows.append(row)
            print(f"{kind:10s} {category:22s} cached {cached:2d} " + "  ".join(
                f"{n} {m['tokens_per_call']:.2f}/{m['speedup']:.2f}×" for n, m in row["methods"].items()),
                flush=True)  # fmt: skip
    from engine.analysis.suffix_grid import suffix_grid

    grid = suffix_grid([p for p, _ in recorded], [o for _, o in recorded], gammas=(4, 8, 16))
    best = [{"ref": g.ref, "gamma": g.gamma, "tokens_per_call": round(g.tokens_per_call, 3)} for g in grid[:8]]
    return {"target": TARGET, "dtype": args.dtype, "new_tokens": args.new_tokens, "gamma": args.gamma,
            "suffix_gamma": args.suffix_gamma, "machine": platform.platform(), "rows": rows,
            "methods": list(sources), "medians": _medians(rows), "grid_best": best}  # fmt: skip


def _medians(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for kind in {r["set"] for r in rows}:
        chosen = [r for r in rows if r["set"] == kind]
        for name in chosen[0]["methods"]:
            out[kind][name] = {
                key: round(median(r["methods"][name][key] for r in chosen), 3) for key in ("tokens_per_call", "speedup")
            }
            speedups = [r["methods"][name]["speedup"] for r in chosen]
            out[kind][name]["speedup_min"], out[kind][name]["speedup_max"] = min(speedups), max(speedups)
            out[kind][name]["diverged"] = sum(r["methods"][name]["diverged_at"] is not None for r in chosen)
    return dict(out)


def markdown(result: dict[str, Any]) -> str:
    names = result["methods"]
    lines = ["| set | category | cached before | " + " | ".join(f"{n}: tokens/call, speedup" for n in names) + " |",
             "|---" * (3 + len(names)) + "|"]  # fmt: skip
    for r in result["rows"]:
        cells = [f"{r['methods'][n]['tokens_per_call']:.2f}, {r['methods'][n]['speedup']:.2f}×" for n in names]
        lines.append(f"| {r['set']} | {r['category']} | {r['warm_cached_before']} | " + " | ".join(cells) + " |")
    lines += ["", "| set | method | tokens/call (median) | speedup (median) | speedup range | outputs diverged |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for kind, by_name in result["medians"].items():
        for name in names:
            m = by_name[name]
            lines.append(f"| {kind} | {name} | {m['tokens_per_call']:.2f} | {m['speedup']:.2f}× | "
                         f"{m['speedup_min']:.2f}–{m['speedup_max']:.2f}× | {m['diverged']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", type=int, default=13)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="γ for n-gram and the draft model")
    parser.add_argument("--suffix-gamma", type=int, default=16, help="most tokens suffix decoding drafts a step")
    parser.add_argument("--repetitive", type=int, default=3, help="prompts of the repetitive set (asked twice more)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-draft-model", action="store_true")
    parser.add_argument("--out", type=output_file, default=str(ROOT / "bench" / "results" / "suffix_vs_ngram.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    write_output(args.out, json.dumps(result, indent=2), "--out")
    print(markdown(result))
    print("\nsuffix grid, best by tokens per call (replayed from the baselines):")
    for g in result["grid_best"]:
        print(f"  {g['ref']:28s} γ={g['gamma']:2d}  {g['tokens_per_call']:.2f}")
    return 0


if __name__ == "__main__":
    run_command(main)
