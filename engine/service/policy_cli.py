"""Speculation policies from stored sessions: the replay table, live figures beside it, the best policy, exports.

`python -m engine policies --session ID [--json OUT] [--prove N]` replays every policy of the grid from the
session's recorded draft trace (engine.analysis.policy_replay) with the session's measured c and v(k), and puts
what the session ran live (its fixed γs and any policies) beside the replayed figures. `--prove N` queues a
session that runs the best N policies (and the best fixed γ) for real on the same prompts.
`python -m engine recommend --session ID` gains the best policy for the objective and its gain over the best
fixed γ; `--policy-export FORMAT|all` writes it for the engines (engine.analysis.export.export_policy).
The dashboard's Policies page reads the same `session_policies`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.analysis.export import FORMATS, PolicyExport, export_policy
from engine.analysis.policy_replay import (
    CostModel,
    PolicyComparison,
    ReplayResult,
    compare_policies,
    ranked,
    replay,
    trace_usable,
)
from engine.analysis.recommend import DraftMeasurement, Recommendation, effective_c
from engine.analysis.theory import MEMORY_BOUND, REGIMES
from engine.core.policy import FixedGamma, parse_policy
from engine.errors import SpectuneError
from engine.llamacpp.policy_flags import llamacpp_fields


@dataclass
class DraftPolicies:
    """One draft × temperature of a session: the replayed grid, and what ran live."""

    draft: str
    temperature: float
    comparison: PolicyComparison
    cost: CostModel
    live: dict[str, dict[str, Any]]  # policy spec -> live figures (fixed γs included, as fixed:G)
    measurement: DraftMeasurement | None = None
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per replayed policy (best first), the live figures beside it where it ran."""
        out = []
        for rank, r in enumerate(self.comparison.results, 1):
            live = self.live.get(r.policy) or {}
            out.append({
                "rank": rank, "draft": self.draft, "temperature": self.temperature, "policy": r.policy,
                "kind": r.kind, "setting": r.setting, "tokens_per_call": r.tokens_per_call,
                "draft_calls_per_step": r.draft_calls_per_step, "drafted_per_step": r.drafted_per_step,
                "predicted_speedup": r.predicted_speedup, "cost_multiplier": r.cost_multiplier,
                "ops_multiplier": r.ops_multiplier, "basis": r.basis, "calls_exact": r.calls_exact,
                "live_tokens_per_call": live.get("tokens_per_call"),
                "live_draft_calls_per_step": live.get("draft_calls_per_step"),
                "live_speedup": live.get("speedup_measured"), "live_tokens_per_s": live.get("tokens_per_s"),
                "live": bool(live), "best_fixed": r is self.comparison.best_fixed,
            })  # fmt: skip
        return out


@dataclass
class PolicyReport:
    """Every draft's policy comparison in the sessions, and the policy recommended for the objective."""

    session_ids: list[int]
    objective: str
    budget: float | None
    regime: str
    drafts: list[DraftPolicies]
    recommendation: Recommendation | None
    chosen: DraftPolicies | None  # the draft the recommendation is for (None: nothing replayable)
    target: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> ReplayResult | None:
        return self.chosen.comparison.best if self.chosen else None

    @property
    def best_fixed(self) -> ReplayResult | None:
        return self.chosen.comparison.best_fixed if self.chosen else None

    def to_dict(self) -> dict[str, Any]:
        best, fixed = self.best, self.best_fixed
        return {
            "session_ids": self.session_ids,
            "objective": self.objective,
            "budget": self.budget,
            "regime": self.regime,
            "best": None if best is None else best.to_dict() | {"draft": self.chosen.draft},
            "best_fixed": None if fixed is None else fixed.to_dict(),
            "gain_over_best_fixed": None if self.chosen is None else self.chosen.comparison.gain,
            "rows": [row for d in self.drafts for row in d.rows()],
            "cost_model": [
                {"draft": d.draft, "temperature": d.temperature, "c": d.cost.c, "c_hat": d.cost.c_hat,
                 "verify_cost": {str(k): v for k, v in sorted((d.cost.verify_cost or {}).items())}}
                for d in self.drafts
            ],  # fmt: skip
            "notes": self.notes + [n for d in self.drafts for n in d.notes],
            "exact": "tokens per call and draft calls are exact at temperature 0 (the loop's own steps, replayed); "
            "speed and cost are predicted from c and v(k); at temperature > 0 everything is estimated",
        }


# ------------------------------------------------------------------------------------------------ the store


def _runs(store: Any, session_ids: list[int]) -> list[dict[str, Any]]:
    out = []
    for sid in session_ids:
        for run in store.list_runs(sid):
            if run.get("status") == "done" and run.get("kind") == "speculative":
                out.append(run)
    return out


def session_traces(store: Any, session_ids: list[int], draft: str) -> list[dict[str, Any]]:
    """The draft's recorded trace, one per prompt, from the first run of each session that kept one."""
    traces: list[dict[str, Any]] = []
    seen: set[int] = set()
    for run in _runs(store, session_ids):
        summary = run.get("summary") or {}
        if run["draft"] == draft and summary.get("policy_trace") and run["session_id"] not in seen:
            seen.add(run["session_id"])
            traces.extend(t for t in summary["policy_trace"] if trace_usable(t))
    return traces


def live_figures(store: Any, session_ids: list[int], draft: str, temperature: float) -> dict[str, dict[str, Any]]:
    """What the sessions ran live for this draft and temperature: policy spec -> figures (fixed γ as fixed:G)."""
    live: dict[str, dict[str, Any]] = {}
    for run in _runs(store, session_ids):
        if run["draft"] != draft or abs(float(run["temperature"]) - temperature) > 1e-9:
            continue
        summary = run.get("summary") or {}
        if summary.get("policy_live"):
            figures = dict(summary["policy_live"])
            spec = figures["policy"]
        else:
            steps = summary.get("steps") or 0
            spec = FixedGamma(int(run["gamma"])).spec()
            figures = {
                "policy": spec, "tokens_per_call": run.get("mean_acceptance_length"),
                "tokens_per_s": run.get("tokens_per_s"), "speedup_measured": run.get("speedup_measured"),
                "mean_drafted_per_step": summary.get("mean_drafted_per_step"),
                "draft_calls_per_step": (summary["draft_calls"] / steps) if summary.get("draft_calls") and steps
                else None,
            }  # fmt: skip
        figures["session_id"] = run["session_id"]
        live[spec] = figures
    return live


def _regime(label: str | None) -> str:
    return label if label in REGIMES else MEMORY_BOUND


def session_policies(
    store: Any,
    session_ids: list[int] | int,
    objective: str = "latency",
    budget: float | None = None,
    batch_size: int = 1,
    regime_override: str | None = None,
    max_gamma: int = 32,
    engine: str | None = None,
    recommended: tuple[Recommendation, Any, Any] | None = None,
) -> PolicyReport:
    """Replay every policy for every draft × temperature of the sessions; recommend one for the objective.

    c is the draft cost the fixed-γ recommender calibrated to the measured speedups (its profiled c when none
    were measured), v(k) the sessions' measured verify cost, the regime the one the recommendation was judged
    in. The policy recommended is the best for the draft and temperature the fixed-γ recommendation chose
    (every draft when that is off). `engine` is whose measurements to use (default: evidence.choose_engine);
    `recommended`, the (recommendation, evidence, regime report) a caller already computed from the same inputs
    and engine, is used as it is instead of computing it again."""
    from engine.service.evidence import choose_engine, recommend_from_store

    ids = [session_ids] if isinstance(session_ids, int) else list(session_ids)
    engine = choose_engine(store, ids, engine)
    llamacpp = engine == "llama.cpp"  # replayed in llama-server's own loop, as its sessions ran
    rec, ev, report = recommended or recommend_from_store(
        store, ids, objective, budget, batch_size, None, regime_override, engine=engine
    )
    regime = _regime(report.label)
    drafts: list[DraftPolicies] = []
    notes: list[str] = []
    for m in ev.measurements:
        traces = session_traces(store, ids, m.name)
        if not traces:
            notes.append(f"{m.name}: {_why_no_trace(m, llamacpp)}")
            continue
        if m.temperature > 0 and not any(f"{m.temperature:g}" in (t.get("beta") or {}) for t in traces):
            notes.append(f"{m.name} at T={m.temperature:g}: no β recorded at that temperature")
            continue
        calibrated = effective_c(m)
        cost = CostModel(c=calibrated if calibrated is not None else m.c, verify_cost=m.verify_cost or None,
                         c_hat=m.c_hat, regime=regime)  # fmt: skip
        comparison = compare_policies(traces, cost, m.temperature, objective, budget, max_gamma=max_gamma,
                                      llamacpp=llamacpp)  # fmt: skip
        live = live_figures(store, ids, m.name, m.temperature)
        replayed = {r.policy for r in comparison.results}
        extra = [replay(traces, parse_policy(spec), cost, m.temperature, llamacpp=llamacpp)
                 for spec in live if spec not in replayed]  # fmt: skip
        if extra:  # live policies outside the grid get replayed too, so every live point has its prediction
            comparison.results = ranked([*comparison.results, *extra], objective, budget)
        drafts.append(DraftPolicies(m.name, m.temperature, comparison, cost, live, m, list(comparison.notes)))
    chosen = None
    if drafts:
        if rec.measurement is not None:
            chosen = next((d for d in drafts if d.measurement is rec.measurement), None)
        if chosen is None:
            chosen = ranked_drafts(drafts, objective)[0]
    return PolicyReport(ids, objective, budget, regime, drafts, rec, chosen, ev.target, notes)


def _why_no_trace(m: DraftMeasurement, llamacpp: bool) -> str:
    if llamacpp and m.method == "ngram":
        return "no policy to replay (llama.cpp's n-gram lookup drafts up to a fixed n-max, without a confidence)"
    if llamacpp:
        return "no trace recorded (a session from before policies, or the draft did not load in PyTorch: see its notes)"
    return "no trace recorded (a session from before policies, or another tokenizer)"


def ranked_drafts(drafts: list[DraftPolicies], objective: str) -> list[DraftPolicies]:
    def score(d: DraftPolicies) -> float:
        best = d.comparison.best
        return -best.cost_multiplier if objective == "cost" else best.predicted_speedup

    return sorted(drafts, key=score, reverse=True)


def recommendation_for(report: PolicyReport) -> Recommendation | None:
    """The fixed-γ recommendation of the chosen draft (rebuilt for it when the recommendation is off or for
    another draft), for the exporters' model references and notes."""
    rec, chosen = report.recommendation, report.chosen
    if rec is None or chosen is None:
        return rec
    m = chosen.measurement
    if m is not None and (rec.off or rec.draft_name != m.name):
        gamma = int(chosen.comparison.best_fixed.policy.split(":")[1])
        best = chosen.comparison.best_fixed
        rec = replace(rec, draft_name=m.name, method=m.method, model_ref=m.model_ref, gamma=gamma, measurement=m,
                      predicted_speedup=best.predicted_speedup, schedule=None, temperature=m.temperature)  # fmt: skip
    return rec


def pays(objective: str, result: ReplayResult) -> bool:
    """Whether a replayed policy beats the target alone under the objective (cost: a lower cost per token)."""
    return result.cost_multiplier < 1.0 if objective == "cost" else result.predicted_speedup > 1.0


def export_best(report: PolicyReport, fmt: str) -> PolicyExport:
    """The recommended policy for one engine (the closest fixed γ where the engine cannot express it); off when
    no replayed policy pays under the objective."""
    rec = recommendation_for(report)
    best, fixed = report.best, report.best_fixed
    if rec is None or best is None or fixed is None:
        raise SpectuneError("no policy to export: the sessions recorded no replayable trace")
    closest = int(fixed.policy.split(":")[1])
    if not pays(report.objective, best):
        why = f"Speculation off: no policy replayed pays for {report.objective} (best {best.policy}: " \
              f"{best.predicted_speedup:.2f}×, cost ×{best.cost_multiplier:.2f})."
        return export_policy(replace(rec, gamma=0, explanation=why), best.policy, fmt, target=report.target)
    predicted = {
        "tokens_per_call": best.tokens_per_call, "speedup": best.predicted_speedup,
        "gain": report.chosen.comparison.gain, "best_fixed_gamma": closest, "basis": best.basis,
    }  # fmt: skip
    return export_policy(rec, best.policy, fmt, closest_gamma=closest, predicted=predicted, target=report.target)


# ------------------------------------------------------------------------------------------------ the CLI


def add_commands(sub: Any) -> None:
    """Register `policies` and extend `recommend` with the policy export (called by engine.service.cli)."""
    pol = sub.add_parser("policies", help="replay every speculation policy from a session; live figures beside")
    pol.add_argument("--session", type=int, action="append", required=True, help="session id (repeatable)")
    pol.add_argument("--json", dest="json_out", default=None, help="also write the whole table as JSON here")
    pol.add_argument("--objective", default="latency", choices=["latency", "cost", "latency_within_budget"])
    pol.add_argument("--budget", type=float, default=None, help="max cost-per-token increase, e.g. 0.2 = +20%%")
    pol.add_argument("--batch-size", type=int, default=1)
    pol.add_argument("--regime", choices=["memory-bound", "compute-bound"], default=None, help="override")
    pol.add_argument("--top", type=int, default=15, help="rows to print per draft (live ones always shown)")
    pol.add_argument("--prove", type=int, default=None, metavar="N",
                     help="queue a session running the best N policies and the best fixed γ live")  # fmt: skip
    rec = sub.choices.get("recommend")
    if rec is not None:
        rec.add_argument("--policy-export", choices=[*FORMATS, "all"], default=None,
                         help="write the best speculation policy for this engine (all: every engine)")
        rec.add_argument("--policy-out", default=".", help="folder for --policy-export files (default: here)")


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def print_table(report: PolicyReport, top: int = 15, out: Any = None) -> None:
    out = out or sys.stdout
    for d in report.drafts:
        cm = d.cost
        print(f"\n{d.draft} at T={d.temperature:g}: c={cm.c:.3f} (calibrated where measured), "
              f"v(k) {'measured' if cm.verify_cost else 'assumed 1'}, {cm.regime}", file=out)  # fmt: skip
        print(f"{'#':>3} {'policy':<30} {'setting':<34} {'tok/call':>8} {'calls/st':>8} {'speedup':>8} "
              f"{'cost':>7} {'basis':<9} {'live tok/call':>13} {'live speedup':>12}", file=out)  # fmt: skip
        for row in d.rows():
            if row["rank"] > top and not row["live"] and not row["best_fixed"]:
                continue
            mark = " ←best fixed γ" if row["best_fixed"] else ""
            print(
                f"{row['rank']:>3} {row['policy'][:30]:<30} {row['setting'][:34]:<34} {row['tokens_per_call']:>8.3f} "
                f"{row['draft_calls_per_step']:>8.2f} {row['predicted_speedup']:>7.2f}× {row['cost_multiplier']:>7.3f} "
                f"{row['basis']:<9} {_fmt(row['live_tokens_per_call'], '.3f'):>13} "
                f"{_fmt(row['live_speedup']):>11}{'×' if row['live_speedup'] else ' '}{mark}",
                file=out,
            )
        for note in d.notes:
            print(f"note: {note}", file=out)
    best, fixed = report.best, report.best_fixed
    if best is not None and fixed is not None:
        gain = report.chosen.comparison.gain
        print(f"\nbest for {report.objective}: {report.chosen.draft} {best.policy} ({best.setting}): "
              f"{best.tokens_per_call:.2f} tokens per call, {best.predicted_speedup:.2f}× predicted; best fixed "
              f"{fixed.policy}: {fixed.predicted_speedup:.2f}× — gain {gain * 100:+.1f}%", file=out)  # fmt: skip
    for note in report.notes:
        print(f"note: {note}", file=out)
    print("exact: tokens per call and draft calls at temperature 0; predicted: speed and cost (c, v(k)); "
          "estimated: everything at temperature > 0", file=out)  # fmt: skip


def cmd_policies(args: argparse.Namespace) -> int:
    from engine.service.jobs import open_app_store

    store = open_app_store()
    report = session_policies(store, args.session, args.objective, args.budget, args.batch_size, args.regime)
    if not report.drafts:
        raise SpectuneError("; ".join(report.notes) or "no replayable trace in these sessions")
    print_table(report, args.top)
    if args.json_out:
        path = Path(args.json_out)
        if path.parent and not path.parent.exists():
            raise SpectuneError(f"--json {args.json_out}: directory {path.parent} does not exist")
        path.write_text(json.dumps(_jsonable(report.to_dict()), indent=2))
        print(f"wrote {path}")
    if args.prove:
        new_id, specs = prove(store, report, args.prove)
        print(f"queued session {new_id} running {', '.join(specs)} live; when it is done: "
              f"python -m engine policies --session {new_id}")  # fmt: skip
    return 0


def prove(store: Any, report: PolicyReport, n: int) -> tuple[int, list[str]]:
    """Queue a session that runs the best `n` policies of different kinds and the best fixed γ, live, for the
    chosen draft on the first session's prompts; its own trace lets replay and live be compared side by side."""
    from engine.service.jobs import submit_session
    from engine.session.spec import SessionSpec

    if n < 1:
        raise SpectuneError(f"--prove {n}: must be at least 1")
    if report.chosen is None:
        raise SpectuneError("nothing to prove: no replayable trace")
    session = store.get_session(report.session_ids[0])
    spec = SessionSpec.from_row(session)
    comparison = report.chosen.comparison
    candidates = comparison.top(n + 1)
    if spec.engine == "llama.cpp":  # only what llama-server runs as is: the best confidence stops
        candidates = [r for r in comparison.results if llamacpp_fields(r.policy) is not None]
    picks = [r.policy for r in candidates if r.kind != "fixed"][:n]
    spec.drafts = [report.chosen.draft]
    spec.gammas = [int(comparison.best_fixed.policy.split(":")[1])]
    spec.temperatures = [report.chosen.temperature]
    spec.policies = picks
    new_id = submit_session(store, spec, session["prompt_set_id"], session.get("n_prompts"),
                            f"prove policies of session {report.session_ids[0]}")  # fmt: skip
    return new_id, [*picks, comparison.best_fixed.policy]


def cmd_recommend(args: argparse.Namespace) -> int:
    """`recommend`, then the best speculation policy for the objective (and its export with --policy-export)."""
    from engine.service import queue_cli
    from engine.service.evidence import choose_engine
    from engine.service.jobs import open_app_store
    from engine.session.spec import engine_from_cli

    code = queue_cli.cmd_recommend(args)
    if code != 0 or (args.export and args.out is None):
        return code  # the export went to stdout: nothing may follow it
    engine = engine_from_cli(args.engine) if getattr(args, "engine", None) else None
    store = open_app_store()
    try:
        report = session_policies(store, args.session, args.objective, args.budget, args.batch_size, args.regime,
                                  engine=choose_engine(store, args.session, engine, args.export))  # fmt: skip
    except SpectuneError as exc:
        print(f"policy: not available ({exc})")
        return code
    best, fixed = report.best, report.best_fixed
    if best is None or fixed is None:
        print("policy: no replayable trace in these sessions (sessions from before policies were recorded)")
        return code
    gain = report.chosen.comparison.gain
    print(f"policy: {report.chosen.draft} {best.policy} ({best.setting}) — {best.tokens_per_call:.2f} tokens per "
          f"call, {best.predicted_speedup:.2f}× predicted ({best.basis}); best fixed {fixed.policy} "
          f"{fixed.predicted_speedup:.2f}×: gain {gain * 100:+.1f}%")  # fmt: skip
    for note in report.chosen.comparison.notes:
        print(f"policy note: {note}")
    fmt = getattr(args, "policy_export", None)
    if fmt:
        folder = Path(args.policy_out)
        if not folder.is_dir():
            raise SpectuneError(f"--policy-out {args.policy_out}: not a folder")
        for one in FORMATS if fmt == "all" else (fmt,):
            exported = export_best(report, one)
            path = folder / ("policy-" + exported.filename)
            path.write_text(exported.text, encoding="utf-8")
            status = "exact" if exported.exact else f"closest: {exported.runs}; lost: {'; '.join(exported.lost)}"
            print(f"wrote {path} ({one}: {status})")
    return code


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------------ `run`


def add_run_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=None,
                   help="fixed:G | confidence:P[:NMAX[:NMIN]] | heuristic:START | adaptive[:C1,C2,..] "
                        "(default: fixed at --gamma)")  # fmt: skip


def run_policy(args: argparse.Namespace) -> tuple[str | None, list[int]]:
    """(the policy to run besides fixed γs or None, the fixed γs) for `run --policy`; SpectuneError if bad."""
    text = getattr(args, "policy", None)
    if not text:
        return None, [args.gamma]
    try:
        policy = parse_policy(text, args.gamma)
    except ValueError as exc:
        raise SpectuneError(f"--policy {text}: {exc}") from None
    if isinstance(policy, FixedGamma):
        return None, [policy.gamma]
    return policy.spec(), []  # validate() refuses what the engine cannot run (llama.cpp: engine.llamacpp.policy_flags)


def flatten_policy(flat: dict[str, Any], report: dict[str, Any], spec: str | None) -> dict[str, Any]:
    """`run`'s JSON for a policy run: its live figures at top level, the replayed prediction beside them."""
    runs = report.get("runs") or []
    run = next((r for r in runs if r.get("policy") == spec), None) if spec else (runs[0] if runs else None)
    flat["policy"] = spec or (FixedGamma(int(flat["gamma"])).spec() if run else None)
    flat["mean_drafted_per_step"] = run.get("mean_drafted_per_step") if run else None
    flat["draft_calls"] = run.get("draft_calls") if run else None
    if run is None or spec is None:
        return flat
    live = run.get("policy_live") or {}
    flat |= {
        "gamma": None, "alpha": live.get("alpha"), "mean_acceptance_length": live.get("tokens_per_call"),
        "speedup_measured": live.get("speedup_measured"), "speedup_measured_spread": live.get("speedup_spread"),
        "draft_calls_per_step": live.get("draft_calls_per_step"),
        "speedup_predicted": (live.get("replayed") or {}).get("speedup"),
        "replayed": live.get("replayed"),  # what the replay of this run's own trace predicted for the policy
    }  # fmt: skip
    return flat


# ------------------------------------------------------------------------------------------------ llama.cpp


def llamacpp_live(
    policy: Any,
    prompts: list[str],
    n_predict: int,
    target: str = "qwen2.5-coder-1.5b",
    draft: str = "qwen2.5-coder-0.5b",
    threads: int | None = None,
) -> dict[str, Any]:
    """Run a policy for real in llama-server (None: the target alone), greedy, prompt by prompt: tokens per target
    call from the server's counters, decode tokens/s, and each prompt's chat text and output token ids."""
    from engine.llamacpp import client
    from engine.llamacpp.server import ManagedServer, ServerConfig
    from engine.session.llamacpp_sweep import gguf_for

    fields = {} if policy is None else llamacpp_fields(policy)
    if fields is None:
        raise SpectuneError(f"llama.cpp cannot run {policy} as is: export it to see the closest it can run")
    config = ServerConfig(gguf_for(target, "target"), draft=gguf_for(draft, "draft") if fields else None,
                          spec_type="draft-simple" if fields else None, threads=threads, **fields)  # fmt: skip
    with ManagedServer(config) as server:
        texts = [client.chat_prompt(server.url, p) for p in prompts]
        before = client.metrics(server.url)
        done = [client.complete(server.url, text, n_predict) for text in texts]
        counters = client.metrics(server.url).minus(before)
    seconds = sum(c.predicted_ms for c in done) / 1000.0
    tokens = sum(c.predicted_n for c in done)
    return {
        "policy": None if policy is None else str(getattr(policy, "spec", lambda: policy)()),
        "tokens_per_call": counters.mean_acceptance_length() if fields else 1.0,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "per_prompt_tokens_per_s": [c.predicted_n / (c.predicted_ms / 1000.0) if c.predicted_ms else 0.0 for c in done],
        "draft_tokens": sum(c.draft_n for c in done),
        "accepted": sum(c.draft_n_accepted for c in done),
        "chat_prompts": texts,
        "outputs": [c.token_ids for c in done],
    }


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"policies": cmd_policies, "recommend": cmd_recommend}
