"""Engine benchmark: this engine vs transformers, side by side in one run, on the bundled pair.

Greedy, the same Spec-Bench prompts for every method, interleaved per prompt so that machine
noise hits every method alike. Reports three ratios (goals from the engine issue):

  1. engine autoregressive tokens/s ÷ transformers `generate` tokens/s        (goal ≥ 1.0)
  2. engine speculative tokens/s ÷ transformers assisted generation, same γ   (goal ≥ 1.1)
  3. measured speedup ÷ predicted speedup from measured α, c and v(γ+1)       (goal ≥ 0.9)

Usage: python bench/bench_engine.py [--gamma 4] [--new-tokens 64] [--prompts 4] [--dtype bfloat16]
Writes bench/results/engine.json and prints a Markdown table (copied into bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.analysis.prediction import CostModel, positional  # noqa: E402
from engine.core.decoder import DecodeConfig, decode_prompt  # noqa: E402
from engine.core.sampling import SamplingConfig  # noqa: E402
from engine.drafts.model import ModelDraft  # noqa: E402
from engine.measure import stats as metrics  # noqa: E402
from engine.measure.verify_cost import verify_cost_curve  # noqa: E402
from engine.models.chat import encode_prompt  # noqa: E402
from engine.models.pool import ModelPool  # noqa: E402
from engine.prompts import load_prompt_file  # noqa: E402
from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"


def pick_prompts(n: int) -> list[tuple[str, str]]:
    """A mix of Spec-Bench categories: coding first (the bundled pair is a code model), then others."""
    result = load_prompt_file(SPEC_BENCH)
    order = ["coding", "math_reasoning", "summarization", "translation", "writing", "qa", "reasoning"]
    chosen: list[tuple[str, str]] = []
    for i in range(n):
        category = order[i % len(order)]
        pool = [p for p in result.prompts if p.category == category and len(p.text) < 700]
        chosen.append((category, pool[i // len(order)].text))
    return chosen


def hf_generate(model, ids: list[int], new_tokens: int, assistant=None, gamma: int = 0) -> tuple[list[int], float]:
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if assistant is not None:
        # transformers 5.x reads γ, the schedule and the confidence threshold only from the assistant's own
        # generation_config (generate() kwargs are ignored; the threshold defaults to 0.4 unless set to 0.0)
        config = assistant.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    inp = torch.tensor([ids])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(inp, attention_mask=torch.ones_like(inp), **kwargs)
        elapsed = time.perf_counter() - t0
    return out[0, len(ids) :].tolist(), elapsed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--out",
        type=output_file,
        default=str(ROOT / "bench" / "results" / "engine.json"),
        help="the JSON report to write",
    )
    args = ap.parse_args()
    out = Path(args.out)

    pool = ModelPool()
    target = pool.get("qwen2.5-coder-1.5b", args.dtype)
    draft = pool.get("qwen2.5-coder-0.5b", args.dtype)
    prompts = pick_prompts(args.prompts)
    encoded = [encode_prompt(target.tokenizer, text, True) for _, text in prompts]
    no_eos = DecodeConfig(0, SamplingConfig(0.0), args.new_tokens, stop_on_eos=False)
    spec_cfg = DecodeConfig(args.gamma, SamplingConfig(0.0), args.new_tokens, stop_on_eos=False)
    source = ModelDraft(draft, target.vocab_size)

    totals = {"engine_ar": 0.0, "hf_generate": 0.0, "engine_spec": 0.0, "hf_assisted": 0.0}
    tokens = 0
    spec_steps, base_steps, per_prompt = [], [], []
    for (category, _), ids in zip(prompts, encoded, strict=True):
        # engine times include prefill, like generate's, so the comparison is like for like
        base_out, b_steps = decode_prompt(target, None, ids, no_eos)
        _, t_hf = hf_generate(target.model, ids, args.new_tokens)
        spec_out, s_steps = decode_prompt(target, source, ids, spec_cfg)
        _, t_hfa = hf_generate(target.model, ids, args.new_tokens, draft.model, args.gamma)
        totals["engine_ar"] += base_out.wall_time_s
        totals["hf_generate"] += t_hf
        totals["engine_spec"] += spec_out.wall_time_s
        totals["hf_assisted"] += t_hfa
        tokens += args.new_tokens
        spec_steps += s_steps
        base_steps += b_steps
        per_prompt.append({
            "category": category, "prompt_tokens": len(ids), "engine_ar_s": base_out.wall_time_s, "hf_generate_s": t_hf,
            "engine_spec_s": spec_out.wall_time_s, "hf_assisted_s": t_hfa,
            "accepted_per_call": metrics.mean_tokens_per_call(s_steps),
        })  # fmt: skip
        print(
            f"{category:<16} AR {base_out.wall_time_s:6.1f}s  HF {t_hf:6.1f}s  spec {spec_out.wall_time_s:6.1f}s"
            f"  HF-assisted {t_hfa:6.1f}s  tokens/call {metrics.mean_tokens_per_call(s_steps):.2f}",
            flush=True,
        )

    tps = {k: tokens / v for k, v in totals.items()}
    verify = verify_cost_curve(target, encoded[0], args.gamma + 1, reps=5)
    per_pos = metrics.per_position_acceptance(spec_steps)
    c = metrics.draft_forward_time(spec_steps) / metrics.single_token_step_time(base_steps)
    # the one model (engine.analysis.prediction), from this run's per-position acceptance, c and v(k)
    predicted = positional(per_pos, 1.0, args.gamma, CostModel(c, verify), draft_forwards=True).predicted_speedup
    # decode-only speedup (prefill is identical for both and excluded from the theory)
    dec = lambda steps: sum(s.draft_time_s + s.verify_time_s for s in steps)  # noqa: E731
    measured_decode = dec(base_steps) / dec(spec_steps)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "dtype": args.dtype, "gamma": args.gamma, "new_tokens": args.new_tokens, "prompts": per_prompt,
        "tokens_per_s": tps,
        "alpha": metrics.alpha_mean_beta(spec_steps), "per_position_acceptance": per_pos, "c": c,
        "verify_cost": verify, "mean_tokens_per_call": metrics.mean_tokens_per_call(spec_steps),
        "speedup_measured_wall": tps["engine_spec"] / tps["engine_ar"],
        "speedup_measured_decode": measured_decode, "speedup_predicted": predicted,
        "ratios": {
            "engine_ar_vs_hf_generate": tps["engine_ar"] / tps["hf_generate"],
            "engine_spec_vs_hf_assisted": tps["engine_spec"] / tps["hf_assisted"],
            "measured_vs_predicted_speedup": measured_decode / predicted,
        },
    }  # fmt: skip
    write_output(out, json.dumps(results, indent=2), "--out")
    r = results["ratios"]
    print()
    print("| comparison | this engine | transformers | ratio | goal |")
    print("|---|---|---|---|---|")
    print(
        f"| autoregressive tokens/s | {tps['engine_ar']:.2f} | {tps['hf_generate']:.2f} (generate) "
        f"| {r['engine_ar_vs_hf_generate']:.2f}× | ≥ 1.0× |"
    )
    print(
        f"| speculative tokens/s, γ={args.gamma} | {tps['engine_spec']:.2f} | {tps['hf_assisted']:.2f} (assisted) "
        f"| {r['engine_spec_vs_hf_assisted']:.2f}× | ≥ 1.1× |"
    )
    print(
        f"| speedup measured ÷ predicted | {measured_decode:.2f}× | {predicted:.2f}× (α={results['alpha']:.2f}, "
        f"c={c:.2f}, v({args.gamma + 1})={verify[args.gamma + 1]:.2f}) | {r['measured_vs_predicted_speedup']:.2f} "
        f"| ≥ 0.9 |"
    )
    return 0


if __name__ == "__main__":
    run_command(main)
