"""Drift: the same configuration measured twice, as "baseline" and as "candidate", while the machine's load changes.

A CPU hog (one busy process per core, started and stopped here, with a hard deadline of its own) toggles on
and off every --toggle-s seconds, starting off. The true speedup is exactly 1: both sides are the target
alone decoding the same prompts (tiny model, greedy). Two schedules, each starting at a toggle boundary:

* sequential (how the sweep measured before): every prompt as the baseline, then every prompt as the
  candidate; speedup = candidate tokens/s ÷ baseline tokens/s over all prompts;
* interleaved (engine.session.sweep.run_sweep, every engine): for each prompt the baseline, then the candidate right
  after it; speedup = the median of the per-prompt ratios, with their spread and verdict
  (engine.measure.noise.spread_of, the same code the sweep uses).

The prompt count is sized from a calibration decode so that each half of the sequential schedule lasts about
one toggle period: the baseline is measured in one minute and the candidate in the next, under another load,
which is exactly the drift a busy machine produces. Writes bench/results/drift.json and prints a table.

    .venv/bin/python bench/bench_drift.py [--toggle-s 15] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.service.outputs import output_file, run_command, write_output  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "drift.json"
HOG_DEADLINE_S = 240.0  # the hog processes exit by themselves after this, whatever happens here


def _spin(on: Any, stop: Any, deadline: float) -> None:
    """One hog process: busy while ``on`` is set, idle otherwise, gone at ``stop`` or the deadline."""
    x = 0
    while not stop.is_set() and time.time() < deadline:
        if on.is_set():
            for _ in range(20_000):
                x = (x * 1_103_515_245 + 12_345) & 0xFFFFFFFF
        else:
            on.wait(0.05)


class Hog:
    """One spinning process per core, switched on and off every ``toggle_s`` by a thread; off at first."""

    def __init__(self, toggle_s: float, processes: int | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.toggle_s = toggle_s
        self.on, self.stop_flag = ctx.Event(), ctx.Event()
        deadline = time.time() + HOG_DEADLINE_S
        n = processes or os.cpu_count() or 1
        self.procs = [ctx.Process(target=_spin, args=(self.on, self.stop_flag, deadline), daemon=True)
                      for _ in range(n)]  # fmt: skip
        for p in self.procs:
            p.start()
        self._epoch = time.monotonic()
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._toggle, daemon=True)
        self._thread.start()
        self.switches: list[tuple[float, bool]] = []

    def restart_cycle(self) -> None:
        """Off now, and the next switch one full period from now (each schedule starts alike)."""
        self.on.clear()
        self._epoch = time.monotonic()

    def _toggle(self) -> None:
        while not self._quit.wait(0.05):
            phase_on = int((time.monotonic() - self._epoch) // self.toggle_s) % 2 == 1
            if phase_on != self.on.is_set():
                (self.on.set if phase_on else self.on.clear)()
                self.switches.append((round(time.monotonic() - self._epoch, 1), phase_on))

    def close(self) -> None:
        self._quit.set()
        self._thread.join(2)
        self.on.clear()
        self.stop_flag.set()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny:1:48:2:64")
    ap.add_argument("--toggle-s", type=float, default=15.0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompts", type=int, default=400)
    ap.add_argument("--out", type=output_file, default=str(DEFAULT_OUT), help="the JSON report to write")
    args = ap.parse_args(argv)

    import torch

    from engine.core.decoder import DecodeConfig, decode_prompt
    from engine.core.proposal import NoDraft
    from engine.core.sampling import SamplingConfig
    from engine.measure import noise
    from engine.measure.stats import tokens_per_second
    from engine.models.tiny import load_tiny

    torch.set_num_threads(1)  # one decode thread: an OpenMP team oversubscribed by the hog would stall for seconds
    target = load_tiny(args.target)
    cfg = DecodeConfig(0, SamplingConfig(0.0), args.max_new_tokens, 0, stop_on_eos=False)
    words = "the quick brown fox jumps over the lazy dog by the sea".split()
    vocab = target.model.config.vocab_size

    def prompt(i: int) -> list[int]:
        return [(7 * i + 3 * j + len(words[j % len(words)])) % vocab or 1 for j in range(8 + i % 5)]

    def decode(i: int, cfg: Any) -> Any:
        out, _ = decode_prompt(target, NoDraft(), prompt(i), cfg)
        return out

    for i in range(2):  # warm-up, then calibrate before the hog starts
        decode(i, cfg)
    t0 = time.perf_counter()
    for i in range(5):
        decode(i, cfg)
    per_decode = (time.perf_counter() - t0) / 5
    n = max(6, min(args.max_prompts, round(args.toggle_s / per_decode)))  # a side lasts about one toggle period
    print(f"calibration: {per_decode * 1000:.0f} ms a decode; {n} prompts a side (≈ {n * per_decode:.0f} s)")

    hog = Hog(args.toggle_s)
    try:
        hog.restart_cycle()
        t_seq = time.monotonic()
        base = [decode(i, cfg) for i in range(n)]
        cand = [decode(i, cfg) for i in range(n)]
        seq_s = time.monotonic() - t_seq
        sequential = tokens_per_second(cand) / tokens_per_second(base)
        seq_switches = list(hog.switches)

        hog.switches.clear()
        hog.restart_cycle()
        t_int = time.monotonic()
        pairs = []
        for i in range(n):
            b = decode(i, cfg)
            c = decode(i, cfg)
            pairs.append((tokens_per_second([b]), tokens_per_second([c])))
        int_s = time.monotonic() - t_int
        spread = noise.spread_of(noise.ratios(pairs))
        int_switches = list(hog.switches)
    finally:
        hog.close()
    assert spread is not None
    covers = spread.min <= 1.0 <= spread.max
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the end",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "prompts_per_side": n,
        "tokens_per_prompt": args.max_new_tokens,
        "true_speedup": 1.0,
        "sequential": {
            "speedup": round(sequential, 3),
            "seconds": round(seq_s, 1),
            "hog_switches": seq_switches,
            "baseline_tokens_per_s": round(tokens_per_second(base), 1),
            "candidate_tokens_per_s": round(tokens_per_second(cand), 1),
        },  # fmt: skip
        "interleaved": {
            "speedup": round(spread.median, 3),
            "min": round(spread.min, 3),
            "max": round(spread.max, 3),
            "n": spread.n,
            "verdict": spread.verdict,
            "noisy": noise.is_noisy(spread),
            "spread_covers_1": covers,
            "seconds": round(int_s, 1),
            "hog_switches": int_switches,
        },  # fmt: skip
    }
    write_output(args.out, json.dumps(result, indent=2) + "\n", "--out")
    print(f"{'schedule':<12} {'speedup':>8}  spread (min–max)   verdict")
    print(f"{'sequential':<12} {sequential:>7.3f}×  —                  (one number, no spread)")
    print(f"{'interleaved':<12} {spread.median:>7.3f}×  {spread.min:.3f}–{spread.max:.3f}×      {spread.verdict}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    run_command(main)
