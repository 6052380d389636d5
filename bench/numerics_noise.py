"""How much do logits move between a (γ+1)-token verify and the same positions decoded one by one?

This is the measurement behind engine/fidelity.py's near-tie tolerances. For each dtype and a few
Spec-Bench prompts, the bundled target prefills a context, then computes the next 9 positions
once as a batched verify forward and once as 9 single-token steps; we record the largest absolute
logit difference per position. Writes bench/results/numerics_noise.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.kvcache import crop_to, forward_step, new_cache  # noqa: E402
from engine.measure.fidelity import TOLERANCE  # noqa: E402
from engine.models.chat import encode_prompt  # noqa: E402
from engine.models.pool import ModelPool  # noqa: E402
from engine.prompts import load_prompt_file  # noqa: E402
from engine.service.outputs import run_command, write_output  # noqa: E402

K = 9


def noise(model, ids: list[int]) -> list[float]:
    with torch.inference_mode():
        cache = new_cache(model.model.config)
        forward_step(model, ids[:-K], cache, 1)
        base = len(ids) - K
        batched = forward_step(model, ids[-K:], cache, K).float()
        crop_to(cache, base)
        single = torch.stack([forward_step(model, [t], cache, 1)[0].float() for t in ids[-K:]])
    return (batched - single).abs().max(-1).values.tolist()


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args(argv)  # --help; no options
    prompts = [p.text for p in load_prompt_file(ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl").prompts]
    chosen = prompts[:: max(1, len(prompts) // 5)][:5]
    results = {}
    for dtype in ("bfloat16", "float32"):
        model = ModelPool().get("qwen2.5-coder-1.5b", dtype)
        diffs = []
        for text in chosen:
            ids = encode_prompt(model.tokenizer, text[:400], True)
            diffs.extend(noise(model, ids))
        results[dtype] = {"max": max(diffs), "mean": sum(diffs) / len(diffs), "tolerance": TOLERANCE[dtype]}
        print(
            f"{dtype}: max |Δlogit| {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}, tolerance {TOLERANCE[dtype]}",
            flush=True,
        )
        del model
    out = ROOT / "bench" / "results" / "numerics_noise.json"
    write_output(out, json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    run_command(main)
