"""The sweep interleaves at the prompt level: for each prompt the baseline, then every other configuration in an
order that rotates from prompt to prompt.

Recorded through the hooks on the tiny fp32 pair: the order of decodes, every run open at once, a phase
for each part of the sweep, per-prompt speedups with their spread, the machine's load, the fidelity
verdicts and the agreement runs. StoreHooks keeps one step writer per open run and the worker's failure
path closes and marks every open run.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine.core.records import Cancelled
from engine.engines.registry import sweep
from engine.measure.noise import Spread, is_noisy
from engine.models.pool import ModelPool
from engine.models.tiny import load_tiny
from engine.session.hooks import Hooks
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec
from tests.test_measurement_floor import ModelClock, timed_forwards

TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
DRAFT_FORWARD_S = 0.0002  # a draft forward on model time (a target forward: FORWARD_S, 1 ms)
PROMPTS = [PromptText(str(i), text, cat) for i, (text, cat) in enumerate(
    [("the sea is wide", "prose"), ("def f(x): return", "code"), ("one two three four", "prose")]
)]  # fmt: skip


def spec(**over: Any) -> SessionSpec:
    base = {"target": TARGET, "drafts": [DRAFT, "ngram"], "gammas": [1, 3], "max_new_tokens": 12, "dtype": "float32",
            "device": "cpu", "chat_template": False, "measure_verify_cost": False}  # fmt: skip
    return SessionSpec(**(base | over))


class Recorder(Hooks):
    """Every hook call, in order."""

    def __init__(self, stop_after_outputs: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.runs: list[dict[str, Any]] = []
        self.summaries: dict[int, Any] = {}
        self.stop_after = stop_after_outputs
        self.outputs = 0

    def run_started(self, key: dict[str, Any]) -> int:
        self.runs.append(key)
        self.calls.append(("run_started", len(self.runs) - 1))
        return len(self.runs) - 1

    def output(self, run: Any, output: Any, divergence: dict | None) -> None:
        self.outputs += 1
        self.calls.append(("output", run, output.prompt_index, divergence))

    def run_finished(self, run: Any, summary: Any) -> None:
        self.summaries[run] = summary
        self.calls.append(("run_finished", run))

    def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
        self.calls.append(("phase", name, done, total, eta_s))

    def should_stop(self) -> bool:
        return self.stop_after is not None and self.outputs >= self.stop_after


@pytest.fixture(scope="module")
def swept() -> tuple[Recorder, dict[str, Any]]:
    """The sweep on model time: a target forward costs 1 ms and a draft forward 0.2 ms, nothing else takes time,
    so every ratio it judges is exact however loaded the machine is."""
    clock = ModelClock()
    pool = ModelPool()
    pool.adopt(timed_forwards(load_tiny(TARGET), clock))
    pool.adopt(timed_forwards(load_tiny(DRAFT), clock, cost_s=DRAFT_FORWARD_S))
    hooks = Recorder()
    with clock.installed():
        report = sweep(spec(), PROMPTS, hooks=hooks, pool=pool).to_dict()
    return hooks, report


def test_each_prompt_decodes_every_configuration_the_baseline_included_in_a_rotating_order(swept) -> None:
    hooks, _ = swept
    keys = [(k["draft"], k["gamma"]) for k in hooks.runs]
    assert keys == [("none", 0), (DRAFT, 1), (DRAFT, 3), ("ngram", 1), ("ngram", 3)]
    started = [c for c in hooks.calls if c[0] == "run_started"]
    first_output = next(i for i, c in enumerate(hooks.calls) if c[0] == "output")
    assert all(hooks.calls.index(c) < first_output for c in started), "every run is open before decoding starts"
    order = [(c[2], c[1]) for c in hooks.calls if c[0] == "output"]  # (prompt, run), in the order decoded
    slots: list[int | None] = [*range(len(hooks.runs)), None]  # every run, the baseline first, and the A/A decode
    rotated = [[r for r in [*slots[p:], *slots[:p]] if r is not None] for p in range(len(PROMPTS))]
    assert order == [(p, r) for p in range(len(PROMPTS)) for r in rotated[p]]
    assert {rotated[p][0] for p in range(len(PROMPTS))} == {0, 1, 2}, "the first decode after the prime rotates too"
    finished = [c[1] for c in hooks.calls if c[0] == "run_finished"]
    assert finished == list(range(len(hooks.runs)))
    last_output = max(i for i, c in enumerate(hooks.calls) if c[0] == "output")
    assert all(hooks.calls.index(("run_finished", r)) > last_output for r in finished)


def test_phases_are_named_with_their_own_progress(swept) -> None:
    hooks, report = swept
    phases = [c for c in hooks.calls if c[0] == "phase"]
    names = [p[1] for p in phases]
    assert names[0] == "loading models" and "warming up" in names and names[-1] == "agreement pass"
    decoding = [p for p in phases if p[1].startswith("decoding prompt")]
    per_prompt = len(hooks.runs) + 1  # every run and the A/A measurement of the target alone
    assert [p[1] for p in decoding][::per_prompt] == [f"decoding prompt {i} of 3" for i in (1, 2, 3)]
    assert [p[2] for p in decoding] == list(range(len(decoding))) and {p[3] for p in decoding} == {3 * per_prompt}
    priming = [p[1] for p in phases if p[1].startswith("priming prompt")]
    assert priming == [f"priming prompt {i} of 3" for i in (1, 2, 3)]
    assert decoding[0][4] is None and all(p[4] is not None and p[4] >= 0 for p in decoding[1:])
    # each output follows its decode's phase (one decoded before its baseline waits for the baseline's output)
    for i, call in enumerate(hooks.calls):
        if call[0] == "output":
            phase = next(c for c in reversed(hooks.calls[:i]) if c[0] == "phase")
            assert phase[1] == f"decoding prompt {call[2] + 1} of 3", (phase, call)
    assert set(report["phase_times_s"]) >= {"loading models", "warming up", "decoding", "agreement pass"}


def test_speedup_is_the_median_of_per_prompt_ratios_with_its_spread(swept) -> None:
    hooks, report = swept
    for run in report["runs"]:
        spread = run["speedup_spread"]
        assert spread["n"] == len(PROMPTS) and spread["dropped"] == 0  # model time: none above its bound
        assert spread["min"] <= run["speedup_measured"] == spread["median"] <= spread["max"]
        assert spread["verdict"] in ("faster", "slower", "too noisy to tell")
        assert run["speedup_noisy"] == is_noisy(Spread(**spread))
        assert set(run["machine_load"]) >= {"other_cpu_pct_median", "other_cpu_pct_max", "n"}
        assert run["machine_load"]["n"] == len(PROMPTS)
    assert report["baseline"]["speedup_spread"] is None and report["baseline"]["machine_load"]["n"] == len(PROMPTS)
    assert report["machine_load"]["n"] == len(PROMPTS) * len(hooks.runs)
    assert "machine_note" in report and isinstance(report["noisy_runs"], list)


def test_fidelity_verdicts_and_agreement_runs_still_work(swept) -> None:
    hooks, report = swept
    verdicts = [c[3] for c in hooks.calls if c[0] == "output" and c[1] != 0]
    assert verdicts and all(v is not None and v["verdict"] == "identical" for v in verdicts)  # greedy fp32
    assert [c[3] for c in hooks.calls if c[0] == "output" and c[1] == 0] == [None] * len(PROMPTS)
    for run, summary in hooks.summaries.items():
        if run == 0:
            continue
        assert len(summary.agreement_runs) == len(PROMPTS)
    baseline_text = [o["text"] for o in report["baseline"]["outputs"]]
    for run in report["runs"]:
        assert [o["text"] for o in run["outputs"]] == baseline_text


def test_a_cancel_mid_sweep_leaves_every_run_open_for_the_caller_to_close() -> None:
    hooks = Recorder(stop_after_outputs=2)
    with pytest.raises(Cancelled):
        sweep(spec(drafts=[DRAFT], gammas=[2]), PROMPTS, hooks=hooks)
    assert len(hooks.runs) == 2 and not hooks.summaries


class FakeWriter:
    def __init__(self, log: list, run_id: int) -> None:
        self.log, self.run_id, self.pending = log, run_id, 0

    def add(self, record: Any) -> None:
        self.log.append(("add", self.run_id))

    def add_sample(self, metrics: Any, source: str, t: float) -> None:
        self.log.append(("sample", self.run_id))

    def flush(self) -> int:
        self.log.append(("flush", self.run_id))
        return 0

    def close(self) -> None:
        self.log.append(("close", self.run_id))


class FakeStore:
    """The store calls StoreHooks makes, recorded."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.runs: dict[int, dict[str, Any]] = {}
        self.phases: list[dict | None] = []

    def create_run(self, session_id: int, draft: str, gamma: int, temperature: float, kind: str) -> int:
        run_id = len(self.runs) + 1
        self.runs[run_id] = {"id": run_id, "status": "queued"}
        return run_id

    def update_run(self, run_id: int, **values: Any) -> None:
        self.runs[run_id].update(values)

    def get_run(self, run_id: int) -> dict[str, Any]:
        return self.runs[run_id]

    def step_writer(self, run_id: int) -> FakeWriter:
        return FakeWriter(self.log, run_id)

    def finish_run(self, run_id: int, summary: Any, status: str = "done", **columns: Any) -> None:
        self.runs[run_id].update(columns, status=status, summary=summary)

    def add_output(self, run: int, output: Any, divergence: Any) -> None:
        self.log.append(("output", run))

    def set_phase(self, session_id: int, phase: dict | None) -> None:
        self.phases.append(phase)

    def set_progress(self, session_id: int, done: int, total: int) -> None:
        pass

    def is_cancel_requested(self, session_id: int) -> bool:
        return False


def test_store_hooks_keep_one_writer_per_open_run_and_close_them_all() -> None:
    from engine.service.worker.loop import _mark_open_run
    from engine.service.worker.store_hooks import StoreHooks

    store = FakeStore()
    hooks = StoreHooks(store, 1, "w")
    keys = (("none", 0, "baseline"), (DRAFT, 1, "speculative"), (DRAFT, 2, "speculative"))
    a, b, c = (hooks.run_started({"draft": d, "gamma": g, "temperature": 0.0, "kind": k}) for d, g, k in keys)
    hooks.step(a, object())
    hooks.step(b, object())
    hooks.sample(1.0, "cpu", {"cpu_util_pct": 1.0})  # to the run that logged the last step
    hooks.step(c, object())
    assert [e for e in store.log if e[0] in ("add", "sample")] == [("add", a), ("add", b), ("sample", b), ("add", c)]
    hooks.run_finished(a, _summary())
    assert ("close", a) in store.log and store.runs[a]["status"] == "done"
    assert sorted(hooks.open_runs) == [b, c]
    hooks.phase("agreement pass", 3, 8, 12.5)
    said = store.phases[-1]
    assert said == {"name": "agreement pass", "done": 3, "total": 8, "eta_s": 12.5, "at": said["at"]}
    assert abs(said["at"] - time.time()) < 60  # when it was said: the pages count the time left down from it
    hooks.discard_writer()  # the worker's failure path
    _mark_open_run(store, hooks, "cancelled")
    assert ("close", b) in store.log and ("close", c) in store.log
    assert [store.runs[r]["status"] for r in (a, b, c)] == ["done", "cancelled", "cancelled"]


def _summary() -> Any:
    from engine.session.summary import RunSummary

    return RunSummary(tokens_per_s=10.0, steps=1, tokens=1, tokens_per_call=1.0)


def test_worker_session_samples_by_category_and_records_phases_and_load(tmp_path) -> None:
    """run_session end to end on SQLite: a stratified sample, every phase stored in order (the batch sweep
    included, then "done"), and the session summary carrying the load, the note, the noisy runs and phase times."""
    from engine.models.pool import ModelPool
    from engine.service.worker.loop import run_session
    from store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    rows = [{"text": f"code prompt {i}", "category": "code"} for i in range(4)]
    rows += [{"text": "a prose prompt", "category": "prose"}, {"text": "sum 2 and 3", "category": "math"}]
    set_id, _, _ = store.add_prompt_set("mixed", None, rows)
    settings = spec(drafts=[DRAFT], gammas=[2], detect_regime=True, prompt_sample="stratified")
    sid = store.create_session(**settings.to_row(), prompt_set_id=set_id, n_prompts=3)
    phases: list[dict] = []
    real_set_phase = store.set_phase
    store.set_phase = lambda session_id, value: (phases.append(value), real_set_phase(session_id, value))[1]
    session = store.claim_next_session("test-worker")
    assert run_session(store, session, ModelPool(), "test-worker") == "done"

    done = store.get_session(sid)
    names = [p["name"] for p in phases]
    assert names[0] == "loading models" and names[-1] == "done" and done["phase"]["name"] == "done"
    assert names.index("warming up") < names.index("decoding prompt 1 of 3") < names.index("agreement pass")
    assert names[-2] == "batch sweep up to batch 2" and phases[-2]["eta_s"] > 0
    runs = store.list_runs(sid)
    assert [r["status"] for r in runs] == ["done", "done"]
    outputs = store.get_outputs(runs[0]["id"])
    chosen = {int(o["prompt_id"]) for o in outputs}
    stored = {p["id"]: p["category"] for p in store.get_prompts(set_id)}
    assert sorted(stored[i] for i in chosen) == ["code", "math", "prose"]
    summary = done["summary"]
    assert summary["machine_load"]["n"] == 6 and "other_cpu_pct_median" in summary["machine_load"]
    assert "machine_note" in summary and isinstance(summary["noisy_runs"], list)
    assert {"loading models", "decoding", "agreement pass", "batch sweep"} <= set(summary["phase_times_s"])
    spread = runs[1]["summary"]["speedup_spread"]
    assert spread["n"] + spread["dropped"] == 3 and runs[1]["speedup_measured"] == spread["median"]
    assert runs[1]["summary"]["machine_load"]["n"] == 3
    store.close()
