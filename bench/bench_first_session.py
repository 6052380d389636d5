"""A new user's first session, from the README, timed from Start to a confirmed recommendation, in each engine.

For each engine, in a fresh data directory: `submit --prompts FILE --estimate --probe` with the defaults (the time
budget, the default engine where --engine is not given), then `submit` with the same defaults and `worker --once`,
all through the CLI as a user types them. Reported per engine: the probe's wall time, the estimate it gave, the
session's wall time from submit to done, the budget and what sizing cut, the stored decision (its headline, the
predicted and measured speedup of the configuration it names, their ratio), the A/A measurement floor and what
measuring cost beside decoding. The engines run one after another on the same prompts; run it on a quiet machine
(`uptime` before and after is recorded).

Usage: python bench/bench_first_session.py [--engines default spectune] [--prompts samples/code.jsonl]
Writes bench/results/first-session.json and prints a Markdown table (copied into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

GOAL_S = 600.0  # a first session answers within 10 minutes


def engine_args(engine: str) -> list[str]:
    """The CLI's engine flag: none for the default (what a new user gets)."""
    return [] if engine == "default" else ["--engine", engine]


def cli(home: Path, args: list[str], timeout_s: float) -> tuple[float, subprocess.CompletedProcess[str]]:
    """`python -m engine ARGS` in the data directory `home`; (wall seconds, the finished process)."""
    env = os.environ | {"SPECTUNE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("SPECTUNE_DB_URL", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)  # fmt: skip
    return time.perf_counter() - started, done


def decision_figures(home: Path) -> dict[str, Any]:
    """The newest session's stored decision, floor and measuring cost, read through the store."""
    from engine.service.decide.decisions import DecisionQuery, decision_for
    from store import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    try:
        session = store.list_sessions()[0]
        summary = session.get("summary") or {}
        options = session.get("options") or {}
        decision = decision_for(store, [session["id"]], DecisionQuery.of_session(options.get("serving_batch") or 1,
                                                                                  0.0))  # fmt: skip
        measured = (decision.measured or {}).get("speedup")
        predicted = decision.predicted_speedup
        record = summary.get("quick") or summary.get("confirmation") or {}
        confirmed = [{"configuration": c.get("configuration"), "predicted": c.get("predicted_speedup"),
                      "measured_whole_run": c.get("measured_whole_run"),
                      "measured_over_predicted": c.get("measured_over_predicted")}
                     for c in record.get("confirmed") or []]  # fmt: skip
        return {
            "session": session["id"], "status": session.get("status"), "ran_in": options.get("engine") or "spectune",
            "decision": decision.headline(), "predicted": predicted, "measured": measured,
            "measured_over_predicted": None if not (measured and predicted) else round(measured / predicted, 3),
            "floor": summary.get("measurement_floor"), "overhead": summary.get("measurement_overhead"),
            "budget_s": options.get("time_budget_s"), "confirmed": confirmed,
            "time_to_confirmed_s": (summary.get("quick") or {}).get("time_to_confirmed_s"),
            "loop": summary.get("loop"), "first_pass": summary.get("first_pass"),
        }  # fmt: skip
    finally:
        store.close()


def one(engine: str, prompts: Path, timeout_s: float, extra: list[str]) -> dict[str, Any]:
    """The README's first session in `engine`, in a fresh data directory (`extra`: more submit arguments)."""
    home = Path(tempfile.mkdtemp(prefix=f"first-{engine}-"))
    base = ["submit", "--prompts", str(prompts), *engine_args(engine), "--name", f"first session ({engine})", *extra]
    probe_s, probe = cli(home, [*base, "--estimate", "--probe"], timeout_s)
    submit_s, submitted = cli(home, base, timeout_s)
    if submitted.returncode != 0:
        return {"engine": engine, "error": submitted.stderr.strip()[-500:]}
    run_s, worker = cli(home, ["worker", "--once"], timeout_s)
    row = {"engine": engine, "home": str(home), "probe_s": round(probe_s, 1), "estimate": probe.stdout.strip(),
           "submit": submitted.stdout.strip() + submitted.stderr.strip(), "session_s": round(submit_s + run_s, 1),
           "worker_rc": worker.returncode}  # fmt: skip
    return row | decision_figures(home)


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md."""
    out = ["| engine | probe | Start → confirmed | ≤ 10 min | decision | measured ÷ predicted | A/A floor | measuring "
           "cost |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            out.append(f"| {r['engine']} | failed: {r['error'][:80]} | | | | | | |")
            continue
        floor = r.get("floor") or {}
        share = (r.get("overhead") or {}).get("share")
        ratio = r.get("measured_over_predicted")
        if ratio is None and r.get("confirmed"):  # speculation off: its best candidate, confirmed live
            ratio = r["confirmed"][0].get("measured_over_predicted")
        who = f"{r['engine']} ({r.get('ran_in') or '?'})"
        out.append(f"| {who} | {r['probe_s']:.0f} s | {r['session_s'] / 60:.1f} min | "
                   f"{'yes' if r['session_s'] <= GOAL_S else 'no'} | {r['decision']} | "
                   f"{'' if ratio is None else f'{ratio:.2f}'} | {floor.get('sentence', '')[:60]} | "
                   f"{'' if share is None else f'{share:.0%}'} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["default", "spectune"],
                        help="'default' (no --engine: what a new user gets), spectune, llamacpp")  # fmt: skip
    parser.add_argument("--prompts", type=Path, default=ROOT / "samples" / "code.jsonl")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per CLI call")
    parser.add_argument("--submit-args", default="", help="more submit arguments, e.g. a small target to try the "
                        "script: '--target smollm2-135m --draft ngram --max-prompts 2'")  # fmt: skip
    parser.add_argument("--out", type=output_file, default=str(ROOT / "bench" / "results" / "first-session.json"))
    args = parser.parse_args()
    load = [os.getloadavg()]
    extra = shlex.split(args.submit_args)
    rows = [one(engine, args.prompts.resolve(), args.timeout, extra) for engine in args.engines]
    load.append(os.getloadavg())
    result = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "load_before_after": load, "rows": rows}  # fmt: skip
    write_output(args.out, json.dumps(result, indent=2, default=str), "--out")
    print(table(rows))


if __name__ == "__main__":
    run_command(main)
