"""Speculation policies on Spec-Bench: the best policy the replay finds vs the best fixed γ vs transformers' default
assisted generation, tokens/s side by side, per category.

1. Calibrate, out of sample: the target alone on calibration prompts (the second prompt of every other category), the
   draft's trace on those outputs, c (a draft forward ÷ a target step) and v(k) measured; the replay
   (engine.analysis.policy_replay.compare_policies) picks the best policy and the best fixed γ.
2. Evaluate on the first prompt of each category, interleaved prompt by prompt: the target alone, the best fixed γ
   and the best policy in spectune's loop, and transformers' assisted generation with its defaults
   (num_assistant_tokens 20, "constant", assistant_confidence_threshold 0.4). Every time includes prefill, as
   generate()'s does. The replay of the evaluation prompts' own trace gives the predicted tokens per call beside
   the measured ones.
3. With --llamacpp: the same policy in llama-server where it maps onto --spec-draft-p-min / n-min / n-max, beside
   the best fixed γ there (tokens per call from its counters, tokens/s from its timings).

Usage: python bench/bench_policies.py [--new-tokens 32] [--categories 13] [--dtype bfloat16] [--llamacpp]
Writes bench/results/policies.json and prints Markdown tables (copied into bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from statistics import median

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
TRANSFORMERS_DEFAULTS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                         "assistant_confidence_threshold": 0.4}  # fmt: skip


def spec_bench(per_category: int, categories: int | None, max_chars: int = 1200) -> dict[str, list[str]]:
    """Up to `per_category` prompts (turns[0]) of at most `max_chars` per Spec-Bench category, in file order (rag's
    prompts are all longer: its ~700-token prefills alone would take minutes on 2 CPU cores)."""
    by_category: dict[str, list[str]] = defaultdict(list)
    for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        text = (row.get("turns") or [""])[0]
        if text and len(text) <= max_chars and len(by_category[row["category"]]) < per_category:
            by_category[row["category"]].append(text)
    names = sorted(by_category)[: categories or None]
    return {name: by_category[name] for name in names}


def hf_assisted(target, draft, ids: list[int], new_tokens: int) -> tuple[list[int], float]:
    """transformers' assisted generation with its default assistant settings (set explicitly: the bundled draft's
    own generation_config may carry others)."""
    for key, value in TRANSFORMERS_DEFAULTS.items():
        setattr(draft.model.generation_config, key, value)
    inp = torch.tensor([ids])
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = target.model.generate(
            inp, attention_mask=torch.ones_like(inp), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, assistant_model=draft.model,
        )  # fmt: skip
        elapsed = time.perf_counter() - t0
    return out[0, len(ids) :].tolist(), elapsed


def measure_c(target, draft, ids: list[int], reps: int = 16) -> float:
    """A draft forward's time ÷ a target step's, measured side by side: one-token forwards over each model's own KV
    cache, alternating, so a change in the machine's load hits both alike; the ratio of the medians."""
    from engine.core.kvcache import forward_step, new_cache, sync

    caches = {id(m): new_cache(m.model.config) for m in (target, draft)}
    for model in (target, draft):
        forward_step(model, ids, caches[id(model)], 1)
    times: dict[int, list[float]] = {id(target): [], id(draft): []}
    with torch.inference_mode():
        for i in range(reps):
            for model in (target, draft):
                sync(model.device)
                t0 = time.perf_counter()
                forward_step(model, [ids[i % len(ids)]], caches[id(model)], 1)
                sync(model.device)
                times[id(model)].append(time.perf_counter() - t0)
    return median(times[id(draft)]) / median(times[id(target)])


def main() -> int:
    from engine.analysis.policy_replay import CostModel, compare_policies, replay
    from engine.core.decoder import DecodeConfig, decode_prompt
    from engine.core.policy import PolicyRun, parse_policy
    from engine.core.sampling import SamplingConfig
    from engine.drafts.model import ModelDraft
    from engine.measure.agreement import draft_trace
    from engine.measure.verify_cost import verify_cost_curve
    from engine.models.chat import encode_prompt
    from engine.models.pool import ModelPool

    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--categories", type=int, default=None, help="first N categories (default: all)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--calibration", type=int, default=6, help="calibration prompts (every other category's second)")
    ap.add_argument("--llamacpp", action="store_true", help="also run the policy in llama-server")
    ap.add_argument(
        "--out",
        type=output_file,
        default=str(ROOT / "bench" / "results" / "policies.json"),
        help="the JSON report to write",
    )
    args = ap.parse_args()
    out = Path(args.out)
    started = time.perf_counter()
    n = args.new_tokens

    pool = ModelPool()
    target, draft = pool.get(TARGET, args.dtype), pool.get(DRAFT, args.dtype)
    source = ModelDraft(draft, target.vocab_size)
    prompts = spec_bench(2, args.categories)
    greedy = DecodeConfig(0, SamplingConfig(0.0), n, stop_on_eos=False)
    enc = {cat: [encode_prompt(target.tokenizer, t, True) for t in texts] for cat, texts in prompts.items()}

    # 1. calibration (the second prompt of each category)
    calibration = [ids[1] for ids in enc.values() if len(ids) > 1][::2][: args.calibration]
    decode_prompt(target, source, calibration[0], replace(greedy, gamma=4, max_new_tokens=4))  # warm-up
    traces = []
    for ids in calibration:
        out, _ = decode_prompt(target, None, ids, greedy)
        traces.append(draft_trace(source, ids, out.token_ids, n))
    c = measure_c(target, draft, calibration[0])
    verify = verify_cost_curve(target, calibration[0], 9, reps=3)
    cost = CostModel(c=c, verify_cost=verify)
    comparison = compare_policies(traces, cost)
    best, fixed = comparison.best, comparison.best_fixed
    # the policy to run: the best one that is not a fixed γ (the comparison says whether it beats the fixed γ)
    policy_row = best if best.kind != "fixed" else next(r for r in comparison.results if r.kind != "fixed")
    policy, fixed_policy = parse_policy(policy_row.policy), parse_policy(fixed.policy)
    print(f"calibration: c={c:.3f}, v(5)={verify.get(5, 1.0):.2f}; best {best.policy} {best.predicted_speedup:.2f}×, "
          f"best fixed {fixed.policy} {fixed.predicted_speedup:.2f}×, running {policy.spec()} "
          f"({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip

    # 2. evaluation (the first prompt of each category), interleaved prompt by prompt
    runs = {"fixed": PolicyRun(fixed_policy), "policy": PolicyRun(policy)}
    rows, eval_traces, live_steps, live_tokens = [], [], defaultdict(int), defaultdict(int)
    for cat, ids_list in enc.items():
        ids = ids_list[0]
        base, _ = decode_prompt(target, None, ids, greedy)
        times = {"target": base.wall_time_s}
        for name, pol in (("fixed", fixed_policy), ("policy", policy)):
            out, steps = decode_prompt(target, source, ids, replace(greedy, gamma=pol.max_draft(), policy=pol),
                                       policy_run=runs[name])  # fmt: skip
            times[name] = out.wall_time_s
            live_steps[name] += len(steps)
            live_tokens[name] += len(out.token_ids)
        _, times["transformers"] = hf_assisted(target, draft, ids, n)
        eval_traces.append(draft_trace(source, ids, base.token_ids, n))
        tps = {k: n / v for k, v in times.items()}
        rows.append({"category": cat, "tokens_per_s": tps})
        print(f"{cat:<16} " + "  ".join(f"{k} {v:5.2f}" for k, v in tps.items()) +
              f" tok/s ({time.perf_counter() - started:.0f}s)", flush=True)  # fmt: skip

    agreement = {}
    for name, pol in (("fixed", fixed_policy), ("policy", policy)):
        live = live_tokens[name] / live_steps[name]
        predicted = replay(eval_traces, pol, cost).tokens_per_call
        agreement[name] = {"policy": pol.spec(), "live_tokens_per_call": live, "replayed_tokens_per_call": predicted,
                           "difference": predicted / live - 1}  # fmt: skip

    llama = None
    if args.llamacpp:
        from engine.engines.llamacpp.policy_flags import llamacpp_fields
        from engine.service.decide.llamacpp_live import llamacpp_live

        texts = [prompts[cat][0] for cat in enc]
        llama = {"target": llamacpp_live(None, texts, n)}
        llama["fixed"] = llamacpp_live(fixed_policy, texts, n)
        if llamacpp_fields(policy) is not None:
            llama["policy"] = llamacpp_live(policy, texts, n)
        for value in llama.values():
            value.pop("outputs", None)
            value.pop("chat_prompts", None)

    def overall(key: str) -> float:
        return median(r["tokens_per_s"][key] / r["tokens_per_s"]["target"] for r in rows)

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "dtype": args.dtype, "new_tokens": n, "c": c, "verify_cost": verify,
        "best": best.to_dict(), "best_fixed": fixed.to_dict(), "ran": policy_row.to_dict(),
        "gain_predicted": comparison.gain, "rows": rows,
        "median_speedup": {k: overall(k) for k in ("fixed", "policy", "transformers")},
        "replay_vs_live": agreement, "llamacpp": llama, "wall_s": time.perf_counter() - started,
    }  # fmt: skip
    write_output(out, json.dumps(results, indent=2, default=str), "--out")

    print(f"\n| category | target alone | best fixed ({fixed.policy}) | policy ({policy.spec()}) | transformers "
          "default | best |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        t = r["tokens_per_s"]
        winner = max(("fixed", "policy", "transformers"), key=lambda k: t[k])
        print(f"| {r['category']} | {t['target']:.2f} | {t['fixed']:.2f} | {t['policy']:.2f} | "
              f"{t['transformers']:.2f} | {winner} |")  # fmt: skip
    m = results["median_speedup"]
    print(f"| median speedup | 1.00× | {m['fixed']:.2f}× | {m['policy']:.2f}× | {m['transformers']:.2f}× | |")
    for a in agreement.values():
        print(f"replay vs live, {a['policy']}: {a['replayed_tokens_per_call']:.3f} vs {a['live_tokens_per_call']:.3f} "
              f"tokens per call ({a['difference'] * 100:+.2f}%)")  # fmt: skip
    if llama:
        print("llama.cpp: " + ", ".join(f"{k} {v['tokens_per_s']:.2f} tok/s, {v['tokens_per_call']:.2f} tokens/call"
                                        for k, v in llama.items()))  # fmt: skip
    print(f"wall time {results['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    run_command(main)
