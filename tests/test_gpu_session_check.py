"""bench/gpu_session_check.py without a GPU: its arguments, its part budgets, the JSON after every part, and a dry run
of the loops part on two tiny models (the per-model, per-width call costs it reports)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_session_check.py"
# a dry run checks what a part reports, not how fast this CPU runs it: its budget is set past any load (the budget
# itself is tested with a part made to overrun it)
DRY_RUN_BUDGET = ["--budget", "loops=3600", "--budget", "batch=3600"]


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_session_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_session_check"] = module
    spec.loader.exec_module(module)
    return module


def test_the_arguments_set_parts_and_budgets(check) -> None:
    args = check.parse_args(["--dry-run", "--parts", "loops, floor", "--budget", "loops=7.5"])
    assert args.parts == ["loops", "floor"]
    assert args.budgets["loops"] == 7.5 and args.budgets["floor"] == check.PART_BUDGET_S["floor"]
    assert check.PART_BUDGET_S["loops"] + check.PART_BUDGET_S["floor"] <= 360  # loops,floor: 6 minutes at most
    for bad in (["--dry-run", "--parts", "loops,nope"], ["--dry-run", "--budget", "loops=soon"], ["--parts", "loops"]):
        with pytest.raises(SystemExit):
            check.parse_args(bad)


def test_a_part_past_its_budget_stops_keeps_what_it_measured_and_the_next_part_runs(check, tmp_path, monkeypatch):
    out = tmp_path / "check.json"
    seen: dict[str, Any] = {}

    def looping(ctx: dict[str, Any], result: dict[str, Any]) -> None:
        result["first"] = 1
        while True:  # stopped between steps by the budget's check
            ctx["check"]("the next step")
            time.sleep(0.01)

    def stuck(ctx: dict[str, Any], result: dict[str, Any]) -> None:
        seen["written"] = json.loads(out.read_text())  # the previous part's JSON is on disk already
        result["before"] = True
        time.sleep(30)  # stopped inside the step by the budget's alarm

    def quick(ctx: dict[str, Any], result: dict[str, Any]) -> None:
        result["done"] = True

    monkeypatch.setattr(check, "PARTS", {"loops": looping, "generate": stuck, "floor": quick, "quick": quick})
    started = time.monotonic()
    code = check.main(["--dry-run", "--parts", "loops,generate,floor", "--out", str(out),
                       "--budget", "loops=0.3", "--budget", "generate=0.5"])  # fmt: skip
    assert time.monotonic() - started < 20
    report = json.loads(out.read_text())
    assert code == 1 and report["ok"] is False
    assert report["loops"]["first"] == 1 and "0.3 s" in report["loops"]["over_budget"]
    assert report["generate"]["before"] is True and report["generate"]["over_budget"]
    assert report["generate"]["part_s"] < 5
    assert report["floor"] == {"budget_s": check.PART_BUDGET_S["floor"], "done": True, "part_s": 0.0}
    assert seen["written"]["loops"]["first"] == 1 and "generate" not in seen["written"]
    assert not report["errors"]


def test_a_dry_run_reports_each_models_call_costs_per_width(check, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECTUNE_COMPILE_MODE", "eager")  # the step traced and checked, not compiled: seconds
    out = tmp_path / "dry.json"
    code = check.main(["--dry-run", "--kernels", "eager", "--parts", "loops", *DRY_RUN_BUDGET, "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"] and report["kernels"] == "eager" and report["device"] == "cpu"
    loops = report["loops"]
    assert set(loops["per_call"]) == {"target", "draft"}
    assert set(loops["per_call"]["target"]) == {"1", "2"} and set(loops["per_call"]["draft"]) == {"1"}
    for widths in loops["per_call"].values():
        for costs in widths.values():
            assert costs["wall_ms"] > 0 and costs["compile_s"] > 0
            assert costs["kernel_ms"] is None and costs["graphs"] == 0  # no GPU: no kernel events, no capture
            assert costs["graph_launches"] == 0 and costs["kernel_launches"] == 0
    assert loops["compiled_ms_per_token"] > 0 and loops["compiled_v"]["1"] == 1.0
    assert "over_budget" not in loops and loops["budget_s"] == 3600


def test_a_dry_run_times_the_batch_sweep_in_both_loops(check, tmp_path, monkeypatch) -> None:
    """The `batch` part: per batch size the eager and the compiled step, their ratio, and what compiling cost."""
    monkeypatch.setenv("SPECTUNE_COMPILE_MODE", "eager")
    out = tmp_path / "dry.json"
    code = check.main(["--dry-run", "--kernels", "eager", "--parts", "batch", *DRY_RUN_BUDGET, "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"] and not report["errors"]
    batch = report["batch"]
    assert batch["loop"] == "compiled" and set(batch["per_batch"]) == {"1", "2", "4"}
    for row in batch["per_batch"].values():
        assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
        assert row["eager_over_compiled"] == pytest.approx(row["eager_ms"] / row["compiled_ms"], rel=0.02)
    assert 0 < batch["prepare_s"] <= batch["compiled_sweep_s"] and batch["graphs_held"] == 0  # a CPU captures nothing
    assert "over_budget" not in batch and batch["budget_s"] == 3600
