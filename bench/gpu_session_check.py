"""One-command GPU check of spectune's measurements: NVML, the A/A floor, the eager and compiled loops, a draft's c,
and a quick session on a GGUF given by path.

Usage:
    python bench/gpu_session_check.py --tokenizer DIR [--gguf SmolLM2-135M-Instruct.Q4_1.gguf] [--prompts FILE]
        [--parts loops,floor,batch,quick] [--budget PART=SECONDS ...]
        [--kernels default|eager|max-autotune-no-cudagraphs] [--out gpu_session_check.json]
    python bench/gpu_session_check.py --dry-run --out dry.json   # tiny models on the CPU: budgets and JSON only

Every part runs under a time budget of its own (PART_BUDGET_S, or --budget): past it, the part stops where it is,
keeps what it measured and says `over_budget`; the JSON is written after every part. `--parts loops,floor` is sized
for about 6 minutes on an H100, compiles included. On a GPU host it runs:
- NVML sampling every 0.5 s throughout (the session's own sampler, source "nvml");
- `loops`: a randomly initialised SmolLM2-1.7B-shaped target (a Llama config built on the GPU; no weights to carry)
  decoding alone in the eager loop and in the compiled loop (static KV cache, CUDA graphs), ms per token beside the
  memory roofline; and c of a 135M-shaped draft (SmolLM2-135M's config; its real weights when --gguf is given) in
  both loops; and per model and width (`per_call`): the compile and capture seconds, the wall time of a call, the
  GPU kernel time of a call (the profiler's kernel events), their difference (the host's overhead), and the
  cudaGraphLaunch and kernel-launch calls per call (one graph launch and no kernel launch when the graph replays);
- `generate`: the same target in transformers' own `generate`, eager and with a static cache and torch.compile;
- `floor`: a sweep on that target (n-gram γ 2 and 4, the 135M draft at γ 4) in the compiled loop and again in the
  eager loop: each session's A/A measurement floor and every speedup against its bound;
- `batch`: the batch sweep behind the regime on that target, in the eager loop and in the compiled loop (one graph
  per batch size, captured on a GPU): the step time per batch size in each, their ratio, the seconds preparing the
  batches took (prefill, compile, capture) and the graphs held while it ran;
- `quick`: a quick session through the CLI (`submit`, `worker --once`) on the GGUF given by path, in its own store.

It writes one JSON and prints a summary; exit 0 when every part ran and every goal held, 1 otherwise. It needs torch,
transformers, gguf, SQLAlchemy, Alembic, nvidia-ml-py, psutil and prometheus-client: no Streamlit, no llama.cpp.
Without a GPU it runs on the CPU (slowly, with smaller shapes: `--small`); `--dry-run` runs the parts' machinery on
two tiny models in seconds, which is how it is tested (tests/test_gpu_session_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GOALS = {"floor_within": 0.03, "compiled_ms_max": 2.0, "draft_c_max": 0.25}
TARGET_SHAPE = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
                "num_key_value_heads": 32, "rope_theta": 130000.0}  # fmt: skip
DRAFT_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "rope_theta": 100000.0}  # fmt: skip
SMALL_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "rope_theta": 10000.0}  # fmt: skip
DECODE_TOKENS = 128
PART_BUDGET_S = {
    "loops": 150.0,
    "generate": 120.0,
    "floor": 200.0,
    "batch": 120.0,
    "quick": 900.0,
}  # loops + floor: about 6 minutes
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)  # the regime evidence's batch sizes (engine.session.regime_evidence)
LOOP_WIDTHS = {"target": (1, 2, 3, 5), "draft": (1,)}  # what `loops` compiles; `floor` adds the rest of 1..5
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
TINY_TARGET, TINY_DRAFT = "tiny:1:48:2:64", "tiny:1:48:2:64~0.15"  # --dry-run's models


class OverBudget(Exception):
    """A part ran past its time budget."""


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[Callable[[str], None]]:
    """Run a part under `seconds`: the check it yields raises OverBudget between steps once they are spent, and an
    alarm (where there is SIGALRM, on the main thread) raises it inside a step that overruns."""
    deadline = time.monotonic() + seconds

    def check(what: str) -> None:
        if time.monotonic() > deadline:
            raise OverBudget(f"its budget of {seconds:g} s was spent before {what}")

    def ring(signum: int, frame: Any) -> None:
        raise OverBudget(f"its budget of {seconds:g} s was spent")

    alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, ring) if alarm else None
    if alarm:
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield check
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def random_llama(ref: str, shape: dict[str, Any], tokenizer: Any, device: str, dtype: str, seed: int) -> Any:
    """A randomly initialised Llama of `shape` built on `device` in `dtype`, with a real tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.core.model import LoadedModel

    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, tie_word_embeddings=True,
                         rms_norm_eps=1e-5, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         **shape)  # fmt: skip
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    return LoadedModel(ref=ref, model=model, tokenizer=tokenizer, device=device, dtype=dtype)


def weights_gb(model: Any) -> float:
    return sum(p.numel() * p.element_size() for p in model.model.parameters()) / 1e9


def copy_bandwidth_gb_s(device: str) -> float | None:
    """Device-to-device copy bandwidth (bytes read + written per second): the memory roofline's ceiling."""
    import torch

    if not device.startswith("cuda"):
        return None
    x = torch.empty(1 << 29, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 10
    del x, y
    torch.cuda.empty_cache()
    return 2 * (1 << 29) * 4 / seconds / 1e9


def ms_per_token(model: Any, ids: list[int], tokens: int, rounds: int = 3) -> float:
    """The fastest of `rounds` decodes of `tokens` tokens by `model` alone, ms per token (decode only)."""
    from engine.core.decoder import DecodeConfig, decode_prompt
    from engine.core.proposal import NoDraft
    from engine.core.sampling import SamplingConfig

    cfg = DecodeConfig(0, SamplingConfig(0.0), tokens, stop_on_eos=False)
    best = float("inf")
    for _ in range(rounds):
        out, steps = decode_prompt(model, NoDraft(), ids, cfg)
        best = min(best, (out.wall_time_s - out.prefill_time_s) * 1000.0 / max(1, len(steps)))
    return best


def forward_ms(model: Any, ids: list[int], width: int = 1, reps: int = 30) -> float:
    """Median ms of a `width`-token forward over a warm cache, in the loop `model` decodes in now."""
    import torch

    from engine.core.kvcache import crop_to, forward_step, sequence_cache, sync

    times = []
    with torch.inference_mode():
        cache = sequence_cache(model)
        forward_step(model, ids, cache, 1)
        base = len(ids)
        for _ in range(reps + 3):
            sync(model.device)
            start = time.perf_counter()
            forward_step(model, ids[:width], cache, width)
            sync(model.device)
            times.append(time.perf_counter() - start)
            crop_to(cache, base)
    return statistics.median(times[3:]) * 1000.0


def _launches(events: list[Any], reps: int) -> dict[str, Any]:
    """Per call, from the profiler's events of `reps` calls: GPU kernel ms, and graph and kernel launches."""
    from torch.autograd import DeviceType

    def ms(event: Any) -> float:
        return (event.time_range.end - event.time_range.start) / 1000.0

    device = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
    names = [e.name for e in events if e.device_type == DeviceType.CPU]
    return {
        "kernel_ms": round(sum(ms(e) for e in kernels) / reps, 4) if device else None,
        "kernels": round(len(kernels) / reps, 1),
        "graph_launches": round(sum("GraphLaunch" in n for n in names) / reps, 1),
        "kernel_launches": round(sum(n in KERNEL_LAUNCHES for n in names) / reps, 1),
    }


def call_costs(model: Any, ids: list[int], width: int, reps: int) -> dict[str, Any]:
    """One model's `width`-token call: wall ms (median), GPU kernel ms, the host's overhead (their difference), and
    the launches a call makes, from `reps` calls under the profiler after the timed ones."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.core.kvcache import crop_to, forward_step, sequence_cache

    wall = forward_ms(model, ids, width, reps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if str(model.device).startswith("cuda") else [])
    with torch.inference_mode():
        cache = sequence_cache(model)
        forward_step(model, ids, cache, 1)
        with profile(activities=activities) as prof:
            for _ in range(reps):
                forward_step(model, ids[:width], cache, width)
                crop_to(cache, len(ids))
    costs = {"wall_ms": round(wall, 4)} | _launches(list(prof.events()), reps)
    if costs["kernel_ms"] is not None:
        costs["host_overhead_ms"] = round(wall - costs["kernel_ms"], 4)
    return costs


def compiled_costs(ctx: dict[str, Any], out: dict[str, Any], need: int) -> None:
    """Compile each model's widths for `loops` one at a time, and measure each call (`per_call`)."""
    from engine.core.compiled import use_compiled

    out["per_call"] = {}
    for role in ("target", "draft"):
        model, widths = ctx[role], ctx["widths"][role]
        loop = use_compiled(model, need, max(widths))
        for width in widths:
            ctx["check"](f"compiling the {role} at width {width}")
            compile_s = loop.compile([width])
            costs = call_costs(model, ctx["ids"], width, ctx["reps"])
            graphs = loop.graph_count()
            out["per_call"].setdefault(role, {})[str(width)] = {"compile_s": round(compile_s, 2), "graphs": graphs,
                                                                 **costs}  # fmt: skip
            print(f"   {role} width {width}: {json.dumps(out['per_call'][role][str(width)])}", flush=True)


def part_loops(ctx: dict[str, Any], out: dict[str, Any]) -> None:
    """Eager vs compiled ms/token of the target alone, the roofline, c of the draft in both loops, and per model
    and width the compile, wall, kernel and host time of a call and its launches."""
    from engine.core.compiled import use_eager

    target, draft, ids, tokens = ctx["target"], ctx["draft"], ctx["ids"], ctx["decode_tokens"]
    need = len(ids) + tokens + 16
    out["target_weights_gb"] = round(weights_gb(target), 3)
    bandwidth = copy_bandwidth_gb_s(target.device)
    if bandwidth:
        out["copy_gb_s"] = round(bandwidth, 1)
        # a decode step streams every weight once; a copy's bytes read + written per second is what the memory moves
        out["roofline_ms_per_token"] = round(weights_gb(target) / bandwidth * 1000.0, 3)
    use_eager(target)
    use_eager(draft)
    ms_per_token(target, ids, 8, rounds=1)  # first pass over the shapes, untimed
    out["eager_ms_per_token"] = round(ms_per_token(target, ids, tokens), 3)
    out["eager_c"] = round(forward_ms(draft, ids) / forward_ms(target, ids), 3)
    ctx["check"]("the compiled loop")
    started = time.perf_counter()
    compiled_costs(ctx, out, need)
    out["compile_s"] = round(sum(w["compile_s"] for m in out["per_call"].values() for w in m.values()), 1)
    out["loops_s_with_measuring"] = round(time.perf_counter() - started, 1)
    ctx["check"]("the compiled decode")
    out["compiled_ms_per_token"] = round(ms_per_token(target, ids, tokens), 3)
    target_ms = out["per_call"]["target"]["1"]["wall_ms"]
    out["compiled_c"] = round(out["per_call"]["draft"]["1"]["wall_ms"] / target_ms, 3)
    out["compiled_v"] = {k: round(v["wall_ms"] / target_ms, 3) for k, v in out["per_call"]["target"].items()}
    out["eager_over_compiled"] = round(out["eager_ms_per_token"] / out["compiled_ms_per_token"], 2)
    if ctx["gpu"]:
        out["goal_compiled_ms"] = out["compiled_ms_per_token"] <= GOALS["compiled_ms_max"]
        out["goal_draft_c"] = out["compiled_c"] <= GOALS["draft_c_max"]


def generate_ms_per_token(model: Any, ids: list[int], tokens: int, static: bool) -> tuple[float, float]:
    """transformers' own `generate` (greedy), eager with its dynamic cache or with a static cache and torch.compile
    (its "reduce-overhead" compile on a GPU): ms per token over the decode (a 1-token generate's time taken off, the
    prefill), fastest of 3, and the seconds the first call took (the compile)."""
    import torch
    from transformers import CompileConfig

    inputs = torch.tensor([ids], device=model.device)
    kwargs: dict[str, Any] = {"do_sample": False, "pad_token_id": model.tokenizer.eos_token_id}
    if static:
        config = CompileConfig()
        config._compile_all_devices = True  # transformers compiles on a GPU only unless told
        kwargs |= {"cache_implementation": "static", "compile_config": config}
    else:
        kwargs["disable_compile"] = True

    def timed(n: int) -> float:
        if str(model.device).startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.model.generate(inputs, max_new_tokens=n, min_new_tokens=n, **kwargs)
        if str(model.device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = timed(tokens)
    timed(1)
    best = min(timed(tokens) - timed(1) for _ in range(3))
    return best * 1000.0 / (tokens - 1), first


def part_generate(ctx: dict[str, Any], out: dict[str, Any]) -> None:
    """The target alone in transformers' `generate`, eager and static + compiled, beside spectune's loops."""
    target, ids = ctx["target"], ctx["ids"]
    eager_ms, _ = generate_ms_per_token(target, ids, ctx["decode_tokens"], static=False)
    out["generate_eager_ms_per_token"] = round(eager_ms, 3)
    ctx["check"]("the compiled generate")
    static_ms, first_s = generate_ms_per_token(target, ids, ctx["decode_tokens"], static=True)
    out["generate_static_compiled_ms_per_token"] = round(static_ms, 3)
    out["generate_first_call_s"] = round(first_s, 1)


def _bound(run: dict[str, Any]) -> float | None:
    """The most a run can measure: its tokens per call over its cheapest verify (1) plus its drafting share."""
    per_call = run.get("tokens_per_call")
    if not per_call:
        return None
    share = float(run.get("c") or 0.0) * float(run.get("draft_calls") or 0) / max(1, int(run.get("steps") or 1))
    return per_call / (1.0 + share)


def part_floor(ctx: dict[str, Any], out: dict[str, Any]) -> None:
    """A sweep on the target in each loop: its measurement floor and every speedup against its bound."""
    from engine.engines import registry
    from engine.engines.spectune.options import LoopOptions
    from engine.models.pool import ModelPool
    from engine.session.spec import SessionSpec

    pool = ModelPool()
    pool.adopt(ctx["target"])
    pool.adopt(ctx["draft"])
    for loop in ("compiled", "eager"):
        ctx["check"](f"the sweep in the {loop} loop")
        spec = SessionSpec(target=ctx["target"].ref, drafts=["ngram", ctx["draft"].ref], gammas=[2, 4],
                           max_new_tokens=ctx["floor_tokens"], dtype=ctx["dtype"], device=ctx["device"],
                           chat_template=ctx["chat_template"], engine_options=LoopOptions(loop))  # fmt: skip
        started = time.perf_counter()
        report = registry.sweep(spec, ctx["prompts"][: ctx["floor_prompts"]], pool=pool).to_dict()
        runs = []
        for run in report["runs"]:
            bound = _bound(run)
            measured = run.get("speedup_whole_run") or run.get("speedup_measured")
            escapes = bool(bound and measured and measured > bound * 1.05 and not run.get("speedup_flag"))
            runs.append({"run": f"{run['draft']} γ={run['gamma']}", "tokens_per_call": run.get("tokens_per_call"),
                         "speedup_measured": run.get("speedup_measured"), "whole_run": run.get("speedup_whole_run"),
                         "bound": bound, "noisy": run.get("speedup_noisy"), "flag": run.get("speedup_flag"),
                         "unflagged_above_bound": escapes, "c": run.get("c"),
                         "baseline_tokens_per_s": report["baseline"].get("tokens_per_s")})  # fmt: skip
        floor = report.get("measurement_floor") or {}
        spread = floor.get("spread") or {}
        out[loop] = {"seconds": round(time.perf_counter() - started, 1), "floor": spread, "holds": floor.get("holds"),
                     "sentence": floor.get("sentence"), "runs": runs, "verify_cost": report.get("verify_cost"),
                     "loop": report.get("loop"), "loop_basis": report.get("loop_basis")}  # fmt: skip
        if ctx["gpu"] and spread.get("median") is not None:
            out[loop]["goal_floor"] = abs(spread["median"] - 1.0) <= GOALS["floor_within"]
        out[loop]["goal_bounds"] = not any(r["unflagged_above_bound"] for r in runs)


def part_batch(ctx: dict[str, Any], out: dict[str, Any]) -> None:
    """The target's batch sweep in the eager loop, then in the compiled loop: per batch size the step time in each
    and eager ÷ compiled; what preparing the compiled sweep's batches took (prefill, compile, capture) and the most
    graphs it held."""
    from engine.core.compiled import use_compiled, use_eager
    from engine.measure.microbench import batch_sweep, compiled_batch_sweep

    target, sizes, reps = ctx["target"], ctx["batch_sizes"], ctx["batch_reps"]
    use_eager(target)
    eager = batch_sweep(target.model, input_len=32, batch_sizes=sizes, reps=reps, device=str(target.device))
    ctx["check"]("the compiled batch sweep")
    loop = use_compiled(target, len(ctx["ids"]) + ctx["decode_tokens"] + 16, 1)
    started = time.perf_counter()
    held: list[int] = []
    prepared: list[float] = []
    step, sequence = loop.batch_step, loop.batch_sequence

    def counted(seq: Any) -> Any:
        held.append(loop.graph_count())
        return step(seq)

    def timed(ids: Any) -> Any:
        began = time.perf_counter()
        try:
            return sequence(ids)
        finally:
            prepared.append(time.perf_counter() - began)

    loop.batch_step, loop.batch_sequence = counted, timed  # type: ignore[method-assign]
    try:
        compiled = compiled_batch_sweep(loop, input_len=32, batch_sizes=sizes, reps=reps)
    finally:
        del loop.batch_step, loop.batch_sequence
    out["compiled_sweep_s"] = round(time.perf_counter() - started, 2)  # as prepare_s, a part of it
    out["prepare_s"] = round(sum(prepared), 2)  # each batch's eager prefill, its step's compile and its capture
    out["graphs_held"] = max(held, default=0)
    out["loop"] = compiled.loop
    out["per_batch"] = {str(b): {"eager_ms": round(e * 1000.0, 3), "compiled_ms": round(c * 1000.0, 3),
                                 "eager_over_compiled": round(e / c, 2) if c > 0 else None}
                        for b, e, c in zip(sizes, eager.step_times_s, compiled.step_times_s, strict=True)}  # fmt: skip
    if ctx["gpu"]:
        out["goal_graph_per_batch"] = out["graphs_held"] >= len(sizes)


def part_quick(ctx: dict[str, Any], out: dict[str, Any]) -> None:
    """A quick session on the GGUF by path through the CLI, in a store of its own; its summary as stored."""
    gguf = ctx.get("gguf")
    if not gguf:
        out["skipped"] = "no --gguf given"
        return
    home = Path(tempfile.mkdtemp(prefix="spectune-gpu-check-"))
    env = dict(os.environ, SPECTUNE_HOME=str(home), PYTHONUNBUFFERED="1")
    python = [sys.executable, "-m", "engine"]
    submit = python + ["submit", "--target", str(gguf), "--draft", "ngram", "--gamma", "1", "--gamma", "2",
                       "--gamma", "4", "--gamma", "8", "--mode", "quick", "--prompts", str(ctx["prompts_file"]),
                       "--max-prompts", str(ctx["quick_prompts"]), "--max-new-tokens", str(ctx["quick_tokens"]),
                       "--dtype", ctx["dtype"], "--device", ctx["device"]]  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    started = time.perf_counter()
    steps = {}
    for name, command in (  # each step's timeout is what is left of the part's budget
        ("submit", submit),
        ("worker", python + ["worker", "--once"]),
        ("sessions", python + ["sessions"]),
        ("recommend", python + ["recommend", "--session", "1"]),
    ):
        ctx["check"](f"the CLI's {name}")
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=ctx["quick_timeout"])
        steps[name] = {"rc": done.returncode, "tail": (done.stdout + done.stderr)[-1500:]}
        if done.returncode != 0 and name in ("submit", "worker"):
            break
    out |= {"seconds": round(time.perf_counter() - started, 1), "steps": steps}
    from store.open import open_store

    store = open_store(f"sqlite:///{home / 'spectune.db'}")
    session = store.get_session(1) or {}
    summary = session.get("summary") or {}
    out["status"] = session.get("status")
    out["error"] = session.get("error")
    out["measurement_floor"] = summary.get("measurement_floor")
    out["loop"] = {k: summary.get(k) for k in ("loop", "loop_basis", "compile_s", "threads")}
    out["quick"] = summary.get("quick")
    out["runs"] = [{"run": f"{r.get('draft')} γ={r.get('gamma')}", "tokens_per_call": r.get("tokens_per_call"),
                    "speedup_measured": r.get("speedup_measured"), "whole_run": r.get("speedup_whole_run"),
                    "flag": r.get("speedup_flag"), "noisy": r.get("speedup_noisy"),
                    "predicted": r.get("speedup_predicted")} for r in summary.get("runs") or []]  # fmt: skip
    out["samples"] = store.count_samples(1) if hasattr(store, "count_samples") else None
    out["goal_bounds"] = not any(
        r["whole_run"] and r["tokens_per_call"] and r["whole_run"] > r["tokens_per_call"] * 1.05 and not r["flag"]
        for r in out["runs"]
    )


def sampler_summary(sampler: Any) -> dict[str, Any]:
    from engine.measure.telemetry import GPM_METRICS

    samples = list(sampler.samples)
    keys = sorted({k for s in samples for k in s.metrics})
    pct = [k for k in keys if k.endswith("_pct")]
    out: dict[str, Any] = {"source": sampler.describe(), "n": len(samples), "metrics": keys,
                           "gpm_seen": [k for k in keys if k in GPM_METRICS]}  # fmt: skip
    for key in ("gpu_util_pct", "mem_ctrl_util_pct", "dram_bw_util_pct", "tensor_util_pct"):
        values = [s.metrics[key] for s in samples if key in s.metrics]
        if values:
            out[key] = {"mean": round(sum(values) / len(values), 1), "max": round(max(values), 1)}
    out["out_of_range"] = sum(1 for s in samples for k in pct if not 0.0 <= s.metrics[k] <= 100.5)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; --budget PART=SECONDS overrides PART_BUDGET_S, part by part."""
    from engine.service.outputs import output_file  # imports SQLAlchemy: not on importing this module

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=output_file, default="gpu_session_check.json", help="the JSON report to write")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (SmolLM2's: vocabulary 49152)")
    parser.add_argument("--gguf", default=None, help="the bundled SmolLM2-135M GGUF, by path")
    parser.add_argument("--prompts", default=None, help="JSONL prompts (default: samples/prose.txt)")
    parser.add_argument("--parts", default="loops,floor,quick")
    parser.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS", help="a part's time budget")
    parser.add_argument("--kernels", default=None, help="the compiled step's kernels: a torch.compile mode or eager")
    parser.add_argument("--small", action="store_true", help="small shapes and few tokens (a CPU run of the check)")
    parser.add_argument("--dry-run", action="store_true", help="two tiny models on the CPU: the machinery only")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PART_BUDGET_S))
    if unknown:
        parser.error(f"unknown part(s): {', '.join(unknown)}; the parts are {', '.join(PART_BUDGET_S)}")
    args.parts = parts
    args.budgets = dict(PART_BUDGET_S)
    for item in args.budget:
        name, _, seconds = item.partition("=")
        try:
            args.budgets[name.strip()] = float(seconds)
        except ValueError:
            parser.error(f"--budget {item}: use PART=SECONDS")
    if not args.dry_run and not args.tokenizer:
        parser.error("--tokenizer is required (or --dry-run)")
    return args


def build_context(args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    """The models, prompts and sizes every part reads: full shapes on a GPU, small ones, or tiny models (dry run)."""
    from engine.models.chat import encode_prompt
    from engine.prompts import load_prompt_file
    from engine.session.runner import PromptText

    device, dtype = ("cuda", "bfloat16") if gpu and not args.dry_run else ("cpu", "float32")
    root = Path(__file__).resolve().parent.parent
    prompts_file = Path(args.prompts) if args.prompts else root / "samples" / "prose.txt"
    prompts = [PromptText(p.prompt_id, p.text, p.category) for p in load_prompt_file(prompts_file).prompts]
    few = args.small or args.dry_run
    ctx: dict[str, Any] = {"gpu": device == "cuda", "device": device, "dtype": dtype, "prompts": prompts,
                           "prompts_file": prompts_file, "gguf": args.gguf, "chat_template": not args.dry_run,
                           "floor_prompts": 2 if few else 4, "floor_tokens": 8 if args.dry_run else 16 if few else 64,
                           "quick_prompts": 2 if few else 8, "quick_tokens": 16 if few else 96, "quick_timeout": 1200,
                           "decode_tokens": 8 if args.dry_run else DECODE_TOKENS, "reps": 5 if few else 30,
                           "widths": {"target": (1, 2), "draft": (1,)} if args.dry_run else LOOP_WIDTHS,
                           "batch_sizes": (1, 2, 4) if few else BATCH_SIZES, "batch_reps": 2 if few else 5,
                           "check": lambda what: None}  # fmt: skip
    if args.dry_run:
        from engine.models.tiny import load_tiny

        ctx["target"], ctx["draft"] = load_tiny(TINY_TARGET), load_tiny(TINY_DRAFT)
        tokenizer = ctx["target"].tokenizer
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        shapes = (SMALL_SHAPE, SMALL_SHAPE) if args.small else (TARGET_SHAPE, DRAFT_SHAPE)
        ctx["target"] = random_llama("random:smollm2-1.7b-shape", shapes[0], tokenizer, device, dtype, 0)
        ctx["draft"] = draft_model(args.gguf, shapes[1], tokenizer, device, dtype)
    ctx["ids"] = encode_prompt(tokenizer, prompts[0].text, ctx["chat_template"])
    return ctx


PARTS: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
    "loops": part_loops, "generate": part_generate, "floor": part_floor, "batch": part_batch,
    "quick": part_quick}  # fmt: skip


def run_part(name: str, budget: float, ctx: dict[str, Any], report: dict[str, Any], out_path: Path) -> None:
    """One part under its budget: what it measured is kept however it ends, and the JSON is written after it."""
    from engine.service.outputs import write_output

    result: dict[str, Any] = {"budget_s": budget}
    report[name] = result
    started = time.perf_counter()
    print(f"-- {name} (budget {budget:g} s) …", flush=True)
    try:
        with time_budget(budget) as check:
            ctx["check"] = check
            PARTS[name](ctx, result)
    except OverBudget as exc:
        result["over_budget"] = str(exc)
    except Exception:  # noqa: BLE001 - every part reports what broke and the next one runs
        report["errors"][name] = traceback.format_exc()[-3000:]
        print(report["errors"][name], flush=True)
    finally:
        ctx["check"] = lambda what: None
    result["part_s"] = round(time.perf_counter() - started, 1)
    write_output(out_path, json.dumps(report, indent=1, default=str) + "\n", "--out")  # a time-out keeps what ran
    shown = {k: v for k, v in result.items() if k not in ("steps", "per_call")}  # not the CLI's own output
    print(f"-- {name}: {result['part_s']:.0f} s {json.dumps(shown, default=str)[:2500]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for, each under its budget; exit 0 when every part ran and every goal held."""
    args = parse_args(argv)
    if args.kernels:
        os.environ["SPECTUNE_COMPILE_MODE"] = args.kernels
    import torch

    from engine.measure.hardware import describe_hardware
    from engine.measure.telemetry import UtilisationSampler
    from engine.service.outputs import write_output

    gpu = torch.cuda.is_available() and not args.dry_run
    out_path = Path(args.out)
    report: dict[str, Any] = {"hardware": describe_hardware(), "torch": torch.__version__, "goals": GOALS,
                              "parts": args.parts, "budgets": {p: args.budgets[p] for p in args.parts},
                              "kernels": os.environ.get("SPECTUNE_COMPILE_MODE") or "default",
                              "dry_run": args.dry_run, "errors": {}}  # fmt: skip
    print(f"hardware: {report['hardware'].get('label')}  torch {torch.__version__}", flush=True)
    sampler = UtilisationSampler(0.5, force_source="nvml" if gpu else "cpu")
    sampler.start()
    started = time.perf_counter()
    try:
        ctx = build_context(args, gpu)
        report |= {"device": ctx["device"], "dtype": ctx["dtype"]}
        report["models"] = {"target": ctx["target"].ref, "target_gb": round(weights_gb(ctx["target"]), 3),
                            "draft": ctx["draft"].ref, "draft_gb": round(weights_gb(ctx["draft"]), 3)}  # fmt: skip
        for name in args.parts:
            run_part(name, args.budgets[name], ctx, report, out_path)
    finally:
        sampler.stop()
    report["nvml"] = sampler_summary(sampler)
    report["seconds"] = round(time.perf_counter() - started, 1)
    goals = [v for part in args.parts for v in _goals(report.get(part))]
    over = [p for p in args.parts if (report.get(p) or {}).get("over_budget")]
    report["ok"] = not report["errors"] and not over and all(goals)
    write_output(out_path, json.dumps(report, indent=1, default=str) + "\n", "--out")
    print(json.dumps({k: report.get(k) for k in ("nvml", "seconds", "ok")}, default=str))
    print(f"{'OK' if report['ok'] else 'NOT OK'}: {args.out}")
    return 0 if report["ok"] else 1


def _goals(part: Any) -> list[bool]:
    """Every goal_* verdict in a part's result, at any depth."""
    if not isinstance(part, dict):
        return []
    found = [bool(v) for k, v in part.items() if str(k).startswith("goal_")]
    return found + [g for v in part.values() for g in _goals(v)]


def draft_model(gguf: str | None, shape: dict[str, Any], tokenizer: Any, device: str, dtype: str) -> Any:
    """The 135M draft: the bundled SmolLM2-135M from its GGUF when given, else a random model of its shape."""
    if gguf:
        from engine.models.loading import load_model

        return load_model(str(gguf), dtype=dtype, device=device)
    return random_llama("random:smollm2-135m-shape", shape, tokenizer, device, dtype, 1)


if __name__ == "__main__":
    from engine.service.outputs import run_command

    run_command(main)
