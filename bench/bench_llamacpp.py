"""llama.cpp benchmark: is the recommendation right where a CPU user deploys it? Ratios measured side by side.

1. llama.cpp's baseline tokens/s ÷ spectune's PyTorch baseline, same target and prompts, interleaved prompt by
   prompt (llama-server, then the PyTorch loop), with the spread over prompts.
2. A llama.cpp session through the real pipeline (queued, run by the worker, stored): the target alone, the 0.5B
   draft at γ = 2, 3 (llama.cpp's default --spec-draft-n-max) and 4, and n-gram lookup, on one Spec-Bench prompt
   per category. `recommend --engine llamacpp` then picks a configuration from those llama.cpp numbers; its
   measured speed is compared with llama.cpp's default draft configuration (γ = 3) per category. When the
   recommendation is a configuration the session did not run, a second session measures it beside the
   target alone and the default draft: predicted, then measured.
3. Measured ÷ predicted speedup in llama.cpp for every γ run.

Usage: python bench/bench_llamacpp.py [--new-tokens 32] [--prompts-per-category 1] [--categories 13]
Writes bench/results/llamacpp.json and prints Markdown tables (copied into bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from statistics import median

from sqlalchemy import text

from engine.service.outputs import output_file, run_command, write_output

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def spec_bench(per_category: int, categories: int = 13, max_chars: int = 600) -> list[tuple[str, str]]:
    from engine.prompts import load_prompt_file

    by_category: dict[str, list[str]] = defaultdict(list)
    for prompt in load_prompt_file(SPEC_BENCH).prompts:
        if len(prompt.text) <= max_chars and len(by_category[prompt.category]) < per_category:
            by_category[prompt.category].append(prompt.text)
    chosen = sorted(by_category.items())[:categories]
    return [(category, text) for category, texts in chosen for text in texts]


def baseline_ratio(prompts: list[tuple[str, str]], new_tokens: int) -> dict:
    """llama.cpp vs the PyTorch loop, target alone, greedy, interleaved per prompt."""
    from engine.core.decoder import DecodeConfig, decode_prompt
    from engine.core.sampling import SamplingConfig
    from engine.engines.llamacpp import client
    from engine.engines.llamacpp.server import ManagedServer, ServerConfig
    from engine.measure.noise import ratios, spread_of
    from engine.models.bundled import gguf_for
    from engine.models.chat import encode_prompt
    from engine.models.pool import ModelPool

    target = ModelPool().get(TARGET, "bfloat16")
    cfg = DecodeConfig(0, SamplingConfig(0.0), new_tokens)
    pairs = []
    with ManagedServer(ServerConfig(gguf_for(TARGET, "target"))) as server:
        for _, text in prompts:
            done = client.complete(server.url, client.chat_prompt(server.url, text), new_tokens)
            llama_tps = done.predicted_n / (done.predicted_ms / 1000.0)
            out, _ = decode_prompt(target, None, encode_prompt(target.tokenizer, text, True), cfg)
            torch_tps = len(out.token_ids) / (out.wall_time_s - out.prefill_time_s)
            pairs.append((torch_tps, llama_tps))
    spread = spread_of(ratios(pairs))
    return {"pytorch_bf16_tokens_per_s": median(p[0] for p in pairs),
            "llamacpp_tokens_per_s": median(p[1] for p in pairs), "ratio": spread.to_dict()}  # fmt: skip


def llamacpp_session(
    prompts: list[tuple[str, str]], new_tokens: int, home: Path, drafts: list[str], gammas: list[int]
) -> tuple[dict, list[dict], str]:
    """Queue and run a llama.cpp session like a user; then recommend from it and export for llama.cpp."""
    from engine.analysis.export import export
    from engine.service.decide.evidence import recommend_from_store
    from engine.service.jobs import open_app_store, submit_session
    from engine.service.worker.loop import serve
    from engine.session.spec import SessionSpec

    store = open_app_store(f"sqlite:///{home / 'bench.db'}")
    set_id, _, _ = store.add_prompt_set("spec-bench", None, [{"text": t, "category": c} for c, t in prompts])
    spec = SessionSpec(target=TARGET, drafts=drafts, gammas=gammas, max_new_tokens=new_tokens, engine="llama.cpp",
                       detect_regime=False)  # fmt: skip
    sid = submit_session(store, spec, set_id, len(prompts), "bench llama.cpp")
    serve(store, once=True)
    session = store.get_session(sid)
    if session["status"] != "done":
        raise SystemExit(f"the llama.cpp session ended {session['status']}: {session.get('error')}")
    runs = store.list_runs(sid)
    rec, _, _ = recommend_from_store(store, [sid], "latency", engine="llama.cpp")
    _, flags = export(rec, "llamacpp", target=TARGET)
    per_prompt = {}  # tokens/s per prompt, from the per-request rows the worker logged (decode time only)
    with store.engine.connect() as conn:
        for run in runs:
            query = text("SELECT emitted, verify_time_s FROM steps WHERE run_id = :r ORDER BY prompt_index")
            rows = conn.execute(query, {"r": run["id"]}).all()
            per_prompt[(run["draft"], run["gamma"])] = [e / t for e, t in rows if t > 0]
    chosen = {"draft": rec.draft_name, "gamma": rec.gamma, "off": rec.off, "predicted_speedup": rec.predicted_speedup,
              "flags": flags}  # fmt: skip
    return {"session": sid, "recommendation": chosen, "per_prompt": per_prompt}, runs, flags


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompts-per-category", type=int, default=1)
    ap.add_argument("--categories", type=int, default=13, help="the first N Spec-Bench categories (of 13)")
    ap.add_argument("--out", type=output_file, default=str(ROOT / "bench" / "results" / "llamacpp.json"))
    args = ap.parse_args()
    from engine.engines.llamacpp.binaries import find_llama

    prompts = spec_bench(args.prompts_per_category, args.categories)
    started = time.time()
    result: dict = {"machine": platform.processor() or platform.machine(), "llama_cpp": find_llama().describe(),
                    "prompts": len(prompts), "new_tokens": args.new_tokens}  # fmt: skip
    result["baseline"] = baseline_ratio(prompts, args.new_tokens)
    with tempfile.TemporaryDirectory() as home:
        session, runs, _ = llamacpp_session(prompts, args.new_tokens, Path(home), [DRAFT, "ngram"], [2, 3, 4])
        rec = session["recommendation"]
        chosen = ("none", 0) if rec["off"] else (rec["draft"], rec["gamma"])
        proof = session
        if chosen not in session["per_prompt"]:
            # the recommendation is a configuration the first session did not run: measure it, beside the baseline
            # and llama.cpp's default draft, in a second session (the closed loop: predicted, then measured)
            drafts = list(dict.fromkeys([chosen[0], DRAFT]))
            proof, proof_runs, _ = llamacpp_session(prompts, args.new_tokens, Path(home), drafts, [chosen[1], 3])
            run = next(r for r in proof_runs if (r["draft"], r["gamma"]) == chosen and r["kind"] == "speculative")
            result["recommended_measured"] = {"speedup_measured": run["speedup_measured"],
                                              "speedup_predicted": rec["predicted_speedup"],
                                              "spread": (run.get("summary") or {}).get("speedup_spread")}  # fmt: skip
    result["session"] = {k: v for k, v in session.items() if k != "per_prompt"}
    base = proof["per_prompt"][("none", 0)]
    default = proof["per_prompt"][(DRAFT, 3)]
    by_category: dict[str, list[float]] = defaultdict(list)
    for (category, _), rec_tps, def_tps in zip(prompts, proof["per_prompt"][chosen], default, strict=True):
        by_category[category].append(rec_tps / def_tps)
    result["recommended_vs_default"] = {c: median(v) for c, v in by_category.items()}
    result["configurations"] = [
        {"draft": r["draft"], "gamma": r["gamma"], "tokens_per_s": r["tokens_per_s"],
         "speedup_measured": r["speedup_measured"], "speedup_predicted": r["speedup_predicted"],
         "measured_over_predicted": (r["speedup_measured"] / r["speedup_predicted"])
         if r.get("speedup_measured") and r.get("speedup_predicted") else None,
         "tokens_per_call": r["tokens_per_call"],
         "spread": (r.get("summary") or {}).get("speedup_spread")}
        for r in runs if r["kind"] == "speculative" and r["status"] == "done"
    ]  # fmt: skip
    result["seconds"] = round(time.time() - started, 1)
    base_tps = median(base)
    result["baseline_tokens_per_s_in_session"] = base_tps
    write_output(args.out, json.dumps(result, indent=2), "--out")
    b = result["baseline"]
    print(f"llama.cpp {b['llamacpp_tokens_per_s']:.2f} tok/s vs PyTorch bf16 {b['pytorch_bf16_tokens_per_s']:.2f} "
          f"tok/s: ×{b['ratio']['median']:.2f} (prompts {b['ratio']['min']:.2f}–{b['ratio']['max']:.2f})")  # fmt: skip
    print(f"recommended: {rec}")
    if "recommended_measured" in result:
        print(f"recommended, measured in a second session: {result['recommended_measured']}")
    print("| category | recommended ÷ llama.cpp default draft (γ=3) |\n|---|---|")
    for category, ratio in sorted(result["recommended_vs_default"].items()):
        print(f"| {category} | {ratio:.2f}× |")
    print("| config | tok/s | measured | predicted | measured ÷ predicted | spread |\n|---|---|---|---|---|---|")
    for c in result["configurations"]:
        s = c["spread"] or {}
        ratio = f"{c['measured_over_predicted']:.2f}" if c["measured_over_predicted"] else "—"
        measured, predicted = (f"{x:.2f}×" if x else "—" for x in (c["speedup_measured"], c["speedup_predicted"]))
        print(f"| {c['draft']} γ={c['gamma']} | {c['tokens_per_s']:.2f} | {measured} | {predicted} | {ratio} | "
              f"{s.get('min', 0):.2f}–{s.get('max', 0):.2f} {s.get('verdict', '')} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_command(main)
