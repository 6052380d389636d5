"""vLLM (CPU) on Spec-Bench prompts: the measured γ × concurrency surface, the γ schedule the recommender reads from
it, and that schedule's export launched as it is beside its fixed γ and the target alone.

1. A vLLM session queued and run by the worker: the target alone and n-gram lookup × γ at each concurrency level,
   on one prompt per Spec-Bench category (the first of ≤ 3500 characters; by default three with a document to copy
   from and three without), each configuration against the target alone at the same level, interleaved
   (engine.session.sweep).
   With the headline confirmation (default; --no-confirm skips it): a recommended γ the grid did not measure is
   then run live at every level beside the target alone (engine.service.worker.sweeps).
2. `recommend --export vllm` from it (the grid and the confirmation): γ by batch size, measured at the surface's
   levels, the headline at batch 1.
3. `check-export`'s session on the same prompts: vLLM started with exactly the file's speculative_config, beside
   the fixed γ the file gives one request in flight and the target alone, at the same levels.

Printed (Markdown, copied into bench/README.md): the surface (speedup and noise verdict per γ and level), each
configuration's measured ÷ predicted per level (the one model predicts one request in flight, memory-bound: the
same number at every level, so the ratio shows where batching takes the gain away), the schedule, and the check
per level. Raw figures in bench/results/vllm_surface.json.

Usage: python bench/bench_vllm_surface.py [--categories extraction rag ...] [--max-chars 3500] [--new-tokens 32]
       [--gammas 1 2 4] [--levels 1 2 4]
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
sys.path.insert(0, str(ROOT / "bench"))

from bench_quick import SPEC_BENCH, predictions  # noqa: E402

TARGET = "smollm2-135m"
# copy-heavy categories (a document to extract from, summarise or answer from) beside ones with little to copy
CATEGORIES = ("extraction", "summarization", "rag", "coding", "writing", "qa")


def prompts(categories: list[str], max_chars: int) -> list[dict[str, str]]:
    """The first Spec-Bench prompt of each category of at most `max_chars` characters, in the order named."""
    from engine.prompts import load_prompt_file

    found: dict[str, str] = {}
    for p in load_prompt_file(SPEC_BENCH).prompts:
        if p.category in categories and p.category not in found and len(p.text) <= max_chars:
            found[str(p.category)] = p.text
    return [{"text": found[c], "category": c} for c in categories if c in found]


def run_queued(store, sid: int) -> tuple[str, float]:  # noqa: ANN001
    from engine.models.pool import ModelPool
    from engine.service.worker.loop import run_session

    started = time.perf_counter()
    claimed = store.claim_next_session("bench:1")
    assert claimed is not None and claimed["id"] == sid, (claimed, sid)
    return run_session(store, claimed, ModelPool(), "bench:1"), time.perf_counter() - started


def surface_rows(store, sid: int) -> list[dict]:  # noqa: ANN001
    from engine.service.decide.surface import session_surface

    surface = session_surface(store, sid)
    return [] if surface is None else [
        {"configuration": c.configuration, "gamma": c.gamma, "level": c.concurrency, "speedup": c.speedup,
         "verdict": c.verdict, "noisy": c.noisy} for c in surface.cells]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(CATEGORIES))
    parser.add_argument("--max-chars", type=int, default=3500)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--no-confirm",
        action="store_true",
        help="do not run an extrapolated headline live after the grid (engine.service.worker.sweeps)",
    )
    parser.add_argument("--keep-db", type=Path, help="write the sessions to this SQLite file (kept) instead")
    args = parser.parse_args()
    from engine.analysis.export.vllm_read import read_vllm_export
    from engine.service.decide.recommendations import recommend_and_export
    from engine.service.export_check import export_check_rows, submit_export_check
    from engine.service.jobs import submit_session
    from engine.session.spec import SessionSpec
    from store import open_store

    doc: dict = {"when": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args),
                 "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"}  # fmt: skip
    with tempfile.TemporaryDirectory() as home:
        store = open_store(f"sqlite:///{args.keep_db or Path(home) / 'bench.db'}")
        set_id, _, _ = store.add_prompt_set("spec-bench", "spec-bench", prompts(args.categories, args.max_chars))
        spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=list(args.gammas), max_new_tokens=args.new_tokens,
                           dtype="float32", engine="vllm", concurrency=list(args.levels), measure_verify_cost=False,
                           detect_regime=False, mode="full", confirm=not args.no_confirm)  # fmt: skip
        sid = submit_session(store, spec, set_id, name="vLLM surface on Spec-Bench")
        state, wall = run_queued(store, sid)
        error = store.get_session(sid).get("error")
        doc["surface_session"] = {"state": state, "wall_s": round(wall, 1), "error": error}
        if state != "done":
            print(f"the surface session ended {state}: {error}", file=sys.stderr)
            return 1
        doc["surface"] = surface_rows(store, sid)
        doc["confirmation"] = (store.get_session(sid).get("summary") or {}).get("confirmation")
        doc["predicted"] = {f"{d} γ={g}": p for (d, g), p in predictions(store, sid, "vllm").items()}
        result = recommend_and_export(store, [sid], formats=("vllm",), engine="vllm")
        rec, text = result.recommendation, result.files["vllm"][1]
        doc["recommendation"] = {"draft": rec.draft_name, "gamma": rec.gamma, "predicted": rec.predicted_speedup,
                                 "schedule": rec.schedule, "measured_levels": rec.schedule_measured,
                                 "export": json.loads(text)["speculative_config"]}  # fmt: skip
        if not rec.off and read_vllm_export(text).schedule:
            check = submit_export_check(store, sid, text)
            state, wall = run_queued(store, check)
            doc["check_session"] = {"state": state, "wall_s": round(wall, 1)}
            doc["check"] = [r.__dict__ | {"winner": r.winner()} for r in export_check_rows(store, check)]
        store.close()
    (ROOT / "bench" / "results" / "vllm_surface.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    report(doc)
    return 0


def report(doc: dict) -> None:
    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}×"

    print(f"Run {doc['when']} on {doc['machine']}; surface session {doc['surface_session']}\n")
    print("| configuration | level | measured | predicted (one request in flight) | ÷ | verdict |")
    print("|---|---|---|---|---|---|")
    for c in doc["surface"]:
        p = doc["predicted"].get(f"{c['configuration'].split(' T=')[0]} γ={c['gamma']}")
        ratio = f"{c['speedup'] / p:.2f}" if p else "—"
        print(f"| {c['configuration']} γ={c['gamma']} | {c['level']} | {f(c['speedup'])} | {f(p)} | {ratio} | "
              f"{c['verdict']} |")  # fmt: skip
    done = doc.get("confirmation") or {}
    for c in done.get("confirmed") or []:
        whole, ratio = c.get("measured_whole_run"), c.get("measured_over_predicted")
        print(f"\nconfirmation ({'ran ' + ', '.join(done['ran']) if done.get('ran') else 'in the grid'}): "
              f"{c['configuration']} predicted {f(c['predicted_speedup'])}, measured {f(whole)} over the whole run "
              f"at one request in flight (÷ {'—' if ratio is None else f'{ratio:.2f}'})")  # fmt: skip
    rec = doc["recommendation"]
    print(f"\nrecommendation: {rec['draft']} γ={rec['gamma']} ({f(rec['predicted'])} predicted); γ by batch size "
          f"{rec['schedule']} (measured at {rec['measured_levels']}); export {json.dumps(rec['export'])}")  # fmt: skip
    if doc.get("check"):
        print(f"\ncheck session {doc['check_session']}\n")
        print("| level | target alone | fixed γ | schedule (as exported) | winner |")
        print("|---|---|---|---|---|")
        for r in doc["check"]:
            base = r["baseline_tokens_per_s"]
            print(f"| {r['level']} | {'—' if base is None else f'{base:.1f} tok/s'} | {f(r['fixed'])} | "
                  f"{f(r['schedule'])} | {r['winner']} |")  # fmt: skip
    else:
        print("\nno check: the export has no γ by batch size (the schedule is constant, or speculation is off)")


if __name__ == "__main__":
    raise SystemExit(main())
