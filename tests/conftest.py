"""Shared fixtures: tiny in-process model pairs (fast) and the real bundled pair (loaded once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARED_DATA = ROOT.parent / "shared" / "data" / "spec_bench_question.jsonl"


@pytest.fixture(scope="session")
def tiny_pair():
    """A tiny target and a noisy copy of it as draft: they agree often, not always."""
    from engine.tiny import load_tiny

    return load_tiny("tiny:1:48:2:64", logit_scale=4.0), load_tiny("tiny:1:48:2:64~0.15", logit_scale=4.0)


_REAL: dict[str, tuple] = {}


def real_pair(dtype: str):
    """The bundled Qwen2.5-Coder 1.5B target and 0.5B draft, loaded once per dtype per test run."""
    if dtype not in _REAL:
        from engine.runner import ModelPool

        pool = ModelPool()
        _REAL.clear()  # keep at most one dtype in memory (fp32 1.5B + 0.5B is ~8 GB)
        import gc

        gc.collect()
        _REAL[dtype] = (pool.get("qwen2.5-coder-1.5b", dtype), pool.get("qwen2.5-coder-0.5b", dtype))
    return _REAL[dtype]


# prompts for the real-pair tests: code (high α) and prose (lower α)
REAL_PROMPTS = [
    "Write a Python function is_prime(n) that returns True when n is prime.",
    "Explain in two sentences what a hash map is.",
    "Complete this code:\ndef fizzbuzz(n):\n    for i in range(1, n + 1):",
]


def greedy_config(gamma: int, new_tokens: int, record: int = 0):
    """Greedy decoding of `new_tokens` tokens; `record` > 0 keeps the target's top logits (baselines)."""
    from engine.decoder import DecodeConfig
    from engine.sampling import SamplingConfig

    return DecodeConfig(gamma, SamplingConfig(0.0), new_tokens, record_top_logits=record)
