"""Quick vs full sessions on the same prompts, in the same engine: same recommendation? how much faster? does the
confirmed configuration measure what the one model predicted for it?

For each engine, two sessions on the same Spec-Bench prompts (one per category, 6 by default), queued and run by
the worker through the real pipeline: mode "full" (target alone + each draft × each γ) and mode "quick" (target
alone + each draft once at the widest γ, the grid predicted, the best confirmed live); the order of the two
alternates per engine so neither always runs on a warmer machine. Reported per engine: each session's wall time to
done, their ratio, the fixed-γ recommendation each leads to (`recommend`, latency objective), and for the quick
session each confirmed choice's predicted and measured speedup.

Usage: python bench/bench_quick.py [--engines llama.cpp spectune] [--prompts 6] [--new-tokens 32]
Writes bench/results/quick.json and prints a Markdown table (copied into bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SPEC_BENCH = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def prompts(n: int, max_chars: int = 500) -> list[dict[str, str]]:
    from engine.prompts import load_prompt_file

    seen: dict[str, str] = {}
    for p in load_prompt_file(SPEC_BENCH).prompts:
        if p.category not in seen and len(p.text) <= max_chars:
            seen[str(p.category)] = p.text
        if len(seen) == n:
            break
    return [{"text": t, "category": c} for c, t in seen.items()]


def one(store, engine: str, mode: str, set_id: int, args: argparse.Namespace) -> dict:  # noqa: ANN001
    from engine.models.pool import ModelPool
    from engine.service.decide.recommendations import recommend_and_export
    from engine.service.jobs import submit_session
    from engine.service.worker.loop import run_session
    from engine.session.spec import SessionSpec

    spec = SessionSpec(target=TARGET, drafts=[DRAFT, "ngram"], gammas=list(args.gammas), temperatures=[0.0],
                       max_new_tokens=args.new_tokens, dtype=args.dtype, engine=engine, detect_regime=False,
                       mode=mode)  # fmt: skip
    sid = submit_session(store, spec, set_id)
    started = time.perf_counter()
    state = run_session(store, store.claim_next_session("bench:1"), ModelPool(), "bench:1")
    wall = time.perf_counter() - started
    session = store.get_session(sid)
    row = {"engine": engine, "mode": mode, "session": sid, "state": state, "wall_s": round(wall, 1),
           "live_runs": sum(1 for r in store.list_runs(sid) if r["kind"] == "speculative")}  # fmt: skip
    if state != "done":
        return row | {"error": session.get("error")}
    rec = recommend_and_export(store, [sid], formats=("vllm",), engine=engine).recommendation
    row["recommended"] = "off" if rec.off else f"{rec.draft_name} γ={rec.gamma}"
    row["predicted_speedup"] = rec.predicted_speedup
    runs = store.list_runs(sid)
    live = next((r for r in runs if r["draft"] == rec.draft_name and r["gamma"] == rec.gamma), None)
    row["measured_speedup"] = live.get("speedup_measured") if live else None
    row["quick"] = (session.get("summary") or {}).get("quick")
    own, by_prompt = predictions(store, sid, engine), prompt_predictions(store, sid, engine)
    row["runs"] = [{"draft": r["draft"], "gamma": r["gamma"], "measured": r.get("speedup_measured"),
                    "predicted": own.get((r["draft"], r["gamma"])), "noisy": _noisy(r),
                    "measured_whole_run": (r.get("summary") or {}).get("speedup_whole_run"),
                    "predicted_prompt_median": by_prompt.get((r["draft"], r["gamma"]))}
                   for r in runs if r["kind"] == "speculative" and r.get("gamma")]  # fmt: skip
    return row


def prompt_predictions(store, sid: int, engine: str, gammas: range = range(1, 9)) -> dict[tuple[str, int], float]:  # noqa: ANN001
    """The median over prompts of the one model's prediction from each prompt's own recorded pass: the statistic
    the measured speedup is (the median of per-prompt ratios). Drafts without a pass are left out."""
    from statistics import median

    from engine.analysis.calibrate import cost_of
    from engine.analysis.policy_replay import replay
    from engine.analysis.predictor import traces_of
    from engine.core.policy import FixedGamma
    from engine.service.decide.evidence import gather

    out = {}
    for m in gather(store, [sid], engine).measurements:
        traces, cost = traces_of(m), cost_of(m)
        if m.temperature == 0 and traces:
            for g in gammas:
                out[(m.name, g)] = median(replay([t], FixedGamma(g), cost, loop=m.drafting_loop).predicted_speedup
                                          for t in traces)  # fmt: skip
    return out


def _noisy(run: dict) -> bool | None:
    from engine.measure import noise

    spread = (run.get("summary") or {}).get("speedup_spread")
    return noise.is_noisy(noise.Spread(**spread)) if spread else None


def predictions(store, sid: int, engine: str, gammas: range = range(1, 9)) -> dict[tuple[str, int], float]:  # noqa: ANN001
    """The one model's predicted speedup for every draft × fixed γ, from this session's measurements alone."""
    from engine.analysis.calibrate import cost_of
    from engine.analysis.predictor import predict
    from engine.core.policy import FixedGamma
    from engine.service.decide.evidence import gather

    out = {}
    for m in gather(store, [sid], engine).measurements:
        cost = cost_of(m)
        for g in gammas:
            out[(m.name, g)] = predict(m, FixedGamma(g), cost).predicted_speedup
    return out


def cross_check(rows: list[dict], store_rows: dict[tuple[str, str], dict[tuple[str, int], float]]) -> list[dict]:
    """Each configuration the full session measured, beside what the quick session's probe predicted for it."""
    out = []
    for row in rows:
        quick = store_rows.get((row["engine"], "quick"))
        if row["mode"] != "full" or quick is None:
            continue
        for run in row.get("runs") or []:
            predicted = quick.get((run["draft"], run["gamma"]))
            out.append(run | {"engine": row["engine"], "quick_predicted": predicted,
                              "measured_over_quick": run["measured"] / predicted
                              if run["measured"] and predicted else None})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["llama.cpp", "spectune"])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--modes", nargs="+", default=["quick", "full"], choices=["quick", "full"])
    parser.add_argument("--keep-db", type=Path, help="write the sessions to this SQLite file (kept) instead")
    args = parser.parse_args()
    from store import open_store

    rows = []
    quick_predictions: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
    with tempfile.TemporaryDirectory() as home:
        store = open_store(f"sqlite:///{args.keep_db or Path(home) / 'bench.db'}")
        set_id, _, _ = store.add_prompt_set("spec-bench", "spec-bench", prompts(args.prompts))
        for i, engine in enumerate(args.engines):
            order = args.modes if i % 2 == 0 else list(reversed(args.modes))
            for mode in order:
                rows.append(one(store, engine, mode, set_id, args))
                if rows[-1]["state"] == "done":
                    quick_predictions[(engine, mode)] = predictions(store, rows[-1]["session"], engine)
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "quick"}), file=sys.stderr, flush=True)
        store.close()
    checks = cross_check(rows, quick_predictions)
    doc = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} CPUs", "load_average": os.getloadavg(), "args": vars(args), "rows": rows,
           "full_measured_vs_quick_predicted": checks}  # fmt: skip
    out = ROOT / "bench" / "results" / ("quick.json" if len(args.modes) == 2 else f"quick-{args.modes[0]}.json")
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"Run {doc['when']}, load average {doc['load_average'][0]:.1f} on {os.cpu_count()} CPUs.\n")
    print("| engine | mode | wall | live runs | recommended | predicted | measured |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:

        def f(x: float | None) -> str:
            return "—" if x is None else f"{x:.2f}×"

        print(f"| {r['engine']} | {r['mode']} | {r['wall_s'] / 60:.1f} min | {r['live_runs']} | "
              f"{r.get('recommended', r.get('error'))} | {f(r.get('predicted_speedup'))} | "
              f"{f(r.get('measured_speedup'))} |")  # fmt: skip
    print(
        "\nMeasured ÷ predicted, like with like: the median of per-prompt ratios ÷ the median of per-prompt"
        " predictions; the whole run's speedup (tokens/s over every prompt ÷ the baseline's) ÷ the whole-run"
        " prediction (what pages show as predicted).\n"
    )
    print(
        "| engine | mode | configuration | measured (median) | predicted (median) | ÷ | measured (whole run) | "
        "predicted (whole run) | ÷ | noisy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")

    def over(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b else "—"

    for r in rows:
        for run in r.get("runs") or []:
            m, p = run["measured"], run["predicted"]
            mt, pm = run["measured_whole_run"], run["predicted_prompt_median"]
            print(f"| {r['engine']} | {r['mode']} | {run['draft']} γ={run['gamma']} | {f(m)} | {f(pm)} | "
                  f"{over(m, pm)} | {f(mt)} | {f(p)} | {over(mt, p)} | {run['noisy']} |")  # fmt: skip
    if checks:
        print("\n| engine | configuration (full session) | measured | quick's prediction | measured ÷ quick's |")
        print("|---|---|---|---|---|")
        for c in checks:
            ratio = f"{c['measured_over_quick']:.2f}" if c["measured_over_quick"] else "—"
            print(f"| {c['engine']} | {c['draft']} γ={c['gamma']} | {f(c['measured'])} | {f(c['quick_predicted'])} "
                  f"| {ratio} |")  # fmt: skip
    for r in rows:
        for c in (r.get("quick") or {}).get("confirmed") or []:
            print(f"- {r['engine']} quick, {c['role']}: {c['configuration']} predicted {c['predicted_speedup']:.2f}×, "
                  f"measured {c.get('measured_whole_run') or float('nan'):.2f}× over the whole run "
                  f"(÷ {c['measured_over_predicted'] or float('nan'):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
