"""The engine seam: one sweep driver for every engine, one plan, one counters type, one registry.

The driver's rules are checked on a deterministic in-test engine (its speeds are set per configuration, so a
ratio's denominator can be read off the answer); the parity test runs one plan through spectune's PyTorch loop
and through real llama-servers and checks that both reports carry the same fields, noise verdict included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from processes import live_llama_servers

from engine.analysis.prediction import DraftingLoop
from engine.core.counters import SpecCounters, mean_acceptance_length, per_position_rates
from engine.core.policy import FixedGamma
from engine.core.records import PromptOutput, StepRecord
from engine.engines import registry
from engine.engines.spectune.runner import LOOP_FIELDS
from engine.errors import SettingsError
from engine.serving.metrics import ServerCounters
from engine.session.hooks import Hooks
from engine.session.runner import DecodeContext, Decoded, EngineOutputs, PromptText, RunFailed, RunKey, plan_runs
from engine.session.spec import SessionSpec
from engine.session.sweep import run_sweep

PROMPTS = [PromptText(str(i), f"prompt {i}") for i in range(4)]


class ScriptedRunner:
    """An engine whose decode speed is a number per configuration: 100 tok/s for the greedy baseline, 50 for the
    T=0.8 baseline, 150 for every speculative run (so its ratio is 1.5 against T=0 and 3.0 against T=0.8)."""

    name: ClassVar[str] = "scripted"
    unavailable: ClassVar[tuple[str, ...]] = ("alpha",)
    drafting_loop: ClassVar[DraftingLoop] = DraftingLoop()
    dtype = "float32"
    device = "cpu"

    def __init__(self, broken: RunKey | None = None, fail_at: int = 1) -> None:
        self.order: list[tuple[int, RunKey]] = []
        self.primed: list[int] = []
        self.broken, self.fail_at = broken, fail_at
        self.stopped = 0

    def start(
        self, spec: SessionSpec, prompts: Sequence[PromptText], plan: list[RunKey], ctx: DecodeContext
    ) -> dict[RunKey, str]:
        return {}

    def verify_cost(self, widest: int) -> tuple[dict[int, float], list[str]]:
        return {1: 1.0, widest: 1.1}, []

    def warm_up(self, plan: list[RunKey]) -> None:
        pass

    def prime(self, index: int, ctx: DecodeContext) -> None:
        self.primed.append(index)

    def reference_at(self, index: int, prefix: list[int]) -> None:
        return None

    def decode(self, key: RunKey, index: int, ctx: DecodeContext, reference: bool) -> Decoded:
        if key == self.broken and index >= self.fail_at:
            raise RunFailed("its server exited")
        self.order.append((index, key))
        tokens = [7] * 12
        rate = 150.0 if key.kind != "baseline" else (100.0 if key.temperature == 0 else 50.0)
        counters = SpecCounters()
        if key.kind == "baseline":
            for _ in tokens:
                counters.add_step(0, 0, 1, [])
        else:
            for _ in range(4):  # 4 steps of γ=2, each accepting the first draft token: 2 tokens each, then 4 plain
                counters.add_step(2, 1, 2, [True, False])
                ctx.on_step(StepRecord(index, 0, 2, 1, [True, False], [0.9, 0.1], 0.0, 0.0, 2, 2))
            for _ in range(4):
                counters.add_step(0, 0, 1, [])
        out = PromptOutput(index, str(index), 3, tokens, "x" * 12, [], 12 / rate, counters.target_calls)
        return Decoded(out, counters, 12 / rate)

    def side_measure(self, index: int) -> None:
        pass

    def finish(self, baselines: dict[float, list[PromptOutput]], ctx: DecodeContext) -> EngineOutputs:
        return EngineOutputs(draft_costs={"ngram": 0.0})

    def describe(self) -> dict[str, Any]:
        return {"scripted": True}

    def stop(self) -> None:
        self.stopped += 1


def spec(**over: Any) -> SessionSpec:
    base = {"target": "tiny:1", "drafts": ["ngram"], "gammas": [2], "temperatures": [0.0, 0.8], "max_new_tokens": 12,
            "measure_verify_cost": True, "chat_template": False}  # fmt: skip
    return SessionSpec(**(base | over))


class Failures(Hooks):
    def __init__(self) -> None:
        self.failed: list[str] = []

    def run_failed(self, run: Any, message: str) -> None:
        self.failed.append(message)


def test_the_plan_has_a_baseline_at_each_temperature() -> None:
    plan = plan_runs(spec(gammas=[2, 4], policies=["fixed:3", "confidence:0.6:8:0"]))
    assert [k for k in plan if k.kind == "baseline"] == [RunKey("none", 0, 0.0), RunKey("none", 0, 0.8)]
    assert [(k.gamma, k.temperature) for k in plan if k.kind != "baseline" and k.policy is None] == [
        (2, 0.0), (2, 0.8), (3, 0.0), (3, 0.8), (4, 0.0), (4, 0.8),
    ]  # fmt: skip
    varying = [k for k in plan if k.policy is not None]
    assert [(k.gamma, k.policy.spec(), k.as_dict()["policy"]) for k in varying] == [
        (0, "confidence:0.6:8:0", "confidence:0.6:8:0")
    ] * 2


def test_each_speedup_is_against_the_baseline_at_its_own_temperature() -> None:
    report = run_sweep(ScriptedRunner(), spec(), PROMPTS).to_dict()
    by_t = {r["temperature"]: r for r in report["runs"]}
    assert by_t[0.0]["speedup_measured"] == pytest.approx(1.5) and by_t[0.8]["speedup_measured"] == pytest.approx(3.0)
    assert [b["temperature"] for b in report["baselines"]] == [0.0, 0.8] and report["baseline"]["temperature"] == 0
    assert report["scripted"] is True and report["unavailable"] == ["alpha"] and report["engine"] == "scripted"


def test_the_order_rotates_and_every_run_gets_a_noise_verdict() -> None:
    runner = ScriptedRunner()
    report = run_sweep(runner, spec(gammas=[1, 2, 3], temperatures=[0.0]), PROMPTS).to_dict()
    rounds = [[key for i, key in runner.order if i == index] for index in range(len(PROMPTS))]
    assert runner.primed == list(range(len(PROMPTS))), "every prompt is primed, untimed, before its round"
    # the baseline, 3 configurations and the A/A measurement of the target alone rotate, the baseline included:
    # the first decode after each prime falls on another configuration
    assert rounds[0][0] == RunKey("none", 0, 0.0) and len({r[0] for r in rounds}) == 4, rounds
    assert all(r.count(RunKey("none", 0, 0.0)) == 2 for r in rounds)  # the baseline and its A/A twin
    assert report["measurement_floor"]["spread"]["median"] == 1.0 and report["measurement_floor"]["holds"]
    for run in report["runs"]:
        assert run["speedup_spread"]["verdict"] == "faster" and run["speedup_noisy"] is False
        assert run["speedup_spread"]["n"] == len(PROMPTS)
    assert report["noisy_runs"] == []


def test_one_broken_configuration_fails_alone_and_the_runner_is_always_stopped() -> None:
    broken = RunKey("ngram", 2, 0.0)
    runner, hooks = ScriptedRunner(broken=broken), Failures()
    report = run_sweep(runner, spec(temperatures=[0.0], gammas=[1, 2]), PROMPTS, hooks).to_dict()
    assert [(f["gamma"], f["error"]) for f in report["failed"]] == [(2, "ngram γ=2 T=0: its server exited")]
    assert hooks.failed == ["ngram γ=2 T=0: its server exited"] and [r["gamma"] for r in report["runs"]] == [1]
    assert runner.stopped == 1
    dead_baseline = ScriptedRunner(broken=RunKey("none", 0, 0.0), fail_at=0)
    with pytest.raises(RunFailed, match="baseline T=0: its server exited"):
        run_sweep(dead_baseline, spec(temperatures=[0.0]), PROMPTS)
    assert dead_baseline.stopped == 1


def test_counters_from_steps_give_every_derived_figure() -> None:
    runner = ScriptedRunner()
    run = next(r for r in run_sweep(runner, spec(temperatures=[0.0]), PROMPTS[:1]).to_dict()["runs"])
    # per prompt: 4 drafting calls of 2 tokens + 4 plain calls of 1: 12 tokens over 8 calls
    assert run["tokens_per_call"] == pytest.approx(12 / 8)  # tokens per target call (every call)
    assert run["drafting_fraction"] == pytest.approx(0.5) and run["draft_acceptance_rate"] == pytest.approx(0.5)
    assert run["per_position_acceptance"] == [pytest.approx(1.0), pytest.approx(0.0)]
    assert run["alpha"] == pytest.approx(0.5) and run["steps"] == 8  # mean β over evaluated positions
    # the prediction charges v(1) on calls that drafted nothing: E/(γc+v) with α at position 1 halved
    assert run["speedup_predicted"] == pytest.approx((1 + 0.5) / (0.5 * 1.1 + 0.5))


def test_one_mean_acceptance_length_for_every_source() -> None:
    c = SpecCounters(drafts=3, draft_tokens=9, accepted_tokens=5, target_calls=4, emitted=9,
                     accepted_per_position={0: 3, 1: 2, 2: 0})  # fmt: skip
    server = ServerCounters(drafts=3, draft_tokens=9, accepted_tokens=5, accepted_per_position={0: 3, 1: 2, 2: 0})
    assert c.mean_acceptance_length() == server.mean_acceptance_length() == mean_acceptance_length(3, 5)
    assert c.tokens_per_call() == pytest.approx(9 / 4) and c.drafting_fraction() == pytest.approx(0.75)
    assert c.per_position_acceptance() == server.per_position_acceptance() == per_position_rates(3, {0: 3, 1: 2, 2: 0})
    assert c.minus(c).plus(c) == c


def test_the_registry_is_the_one_place_an_engine_is_named() -> None:
    assert registry.names() == ("spectune", "llama.cpp", "vllm", "endpoint")
    assert registry.engine_from_cli("llamacpp") == "llama.cpp" and registry.get("llama.cpp").cli == "llamacpp"
    with pytest.raises(SettingsError, match="engine 'vllm-gpu': choose one of spectune, llama.cpp, vllm, endpoint"):
        registry.validate(spec(engine="vllm-gpu"))
    with pytest.raises(SettingsError, match="llama.cpp cannot run heuristic"):
        registry.validate(spec(engine="llama.cpp", drafts=["qwen2.5-coder-0.5b"], policies=["heuristic:8"]))
    assert type(registry.runner_for(spec(engine="endpoint"))).__name__ == "EndpointRunner"  # every engine: a Runner
    assert "endpoint" not in registry.sweep_engines() and registry.get("endpoint").deployment
    assert registry.drafting_loop("llama.cpp") == DraftingLoop("top10", prompt_call=True, one_ngram_length=True)
    assert registry.drafting_loop("spectune") == DraftingLoop()
    assert FixedGamma(2).spec() == "fixed:2"


def llama_servers() -> set[int]:
    """The live llama-servers this test run started (a shared machine's others are not this test's to count)."""
    return {p.pid for p in live_llama_servers()}


def test_parity_the_same_plan_through_spectune_and_llamacpp_gives_the_same_report_fields() -> None:
    """Real engines: SmolLM2-135M with n-gram γ=2 at T=0 and T=0.8, two prompts, through spectune's loop (float32)
    and managed llama-servers. Both reports carry the same fields, a baseline per temperature, a noise verdict
    on every run, fidelity verdicts per output and no llama-server left behind."""
    before = llama_servers()
    prompts = [PromptText("a", "Count from one to ten: one, two, three,"), PromptText("b", "Repeat: red blue red blue")]
    common = {"target": "smollm2-135m", "drafts": ["ngram"], "gammas": [2], "temperatures": [0.0, 0.8],
              "max_new_tokens": 12, "measure_verify_cost": False, "detect_regime": False}  # fmt: skip
    reports = {
        engine: registry.sweep(SessionSpec(**common, engine=engine, dtype="float32", device="cpu"), prompts).to_dict()
        for engine in ("spectune", "llama.cpp")
    }
    a, b = reports["spectune"], reports["llama.cpp"]
    assert set(a) - {"llama_cpp", *LOOP_FIELDS} == set(b) - {"llama_cpp"} and "llama_cpp" in b
    assert set(LOOP_FIELDS) <= set(a)  # spectune's own: the loop and threads it measured with
    for report in (a, b):
        assert report["failed"] == [] and [x["temperature"] for x in report["baselines"]] == [0.0, 0.8]
        assert [(r["gamma"], r["temperature"]) for r in report["runs"]] == [(2, 0.0), (2, 0.8)]
        for run in report["runs"]:
            spread = run["speedup_spread"]  # every prompt: in the verdict, or left out above its bound
            assert isinstance(run["speedup_noisy"], bool) and spread["dropped"] <= 2
            if spread["dropped"] < 2:
                assert spread["n"] + spread["dropped"] == 2
            else:  # none stands: every ratio is kept, and the verdict is that nothing can be told
                assert spread["n"] == 2 and spread["verdict"] == "too noisy to tell" and run["speedup_noisy"]
            assert len(run["divergences"]) == 2 and 1.0 <= run["tokens_per_call"] <= 3.0
            assert 0.0 <= run["drafting_fraction"] <= 1.0 and run["engine"] == report["engine"]
    assert [set(r) for r in a["runs"]] == [set(r) for r in b["runs"]]
    assert set(a["baseline"]) == set(b["baseline"])
    assert llama_servers() <= before, "a llama-server was left running"


def test_parity_a_running_deployment_reports_what_every_engine_reports() -> None:
    """The endpoint engine (a stand-in vLLM under test and a stand-in baseline on 127.0.0.1) and spectune's loop
    (tiny models): the same report fields and the same run fields, a noise verdict on every run."""
    from engine.engines.endpoint.standin import StandIn
    from engine.service.endpoint_sessions import endpoint_spec

    prompts = [PromptText(str(i), f"prompt {i}: count one two three") for i in range(3)]
    loop = registry.sweep(spec(temperatures=[0.0], measure_verify_cost=False, detect_regime=False), prompts)
    with StandIn(flavor="vllm", tokens=6) as under_test, StandIn(flavor="openai", tokens=6) as base:
        endpoint = {"url": under_test.url, "baseline_url": base.url, "concurrency": [1], "max_requests": 3,
                    "request_timeout_s": 5.0}  # fmt: skip
        deployed = registry.sweep(endpoint_spec(endpoint, 6), prompts)
    a, b = loop.to_dict(), deployed.to_dict()
    assert set(a) - set(LOOP_FIELDS) == set(b) - {"endpoint"} and "endpoint" in b
    assert [set(r) for r in a["runs"]] == [set(r) for r in b["runs"]] and set(a["baseline"]) == set(b["baseline"])
    for report in (a, b):
        assert report["failed"] == [] and [x["temperature"] for x in report["baselines"]] == [0.0]
        assert all(isinstance(r["speedup_noisy"], bool) and r["speedup_spread"]["n"] + r["speedup_spread"]["dropped"]
                   == 3 for r in report["runs"])  # fmt: skip


def test_the_worker_stops_every_engines_processes_through_the_registry(monkeypatch) -> None:
    """An engine that starts processes says how to stop them in its entry; the worker asks the registry, and no
    module outside the engine names it."""
    stopped: list[str] = []

    def stop() -> int:
        stopped.append("toy")
        return 2

    toy = registry.EngineEntry("toy", "toy", "toy engine", lambda spec, n: None, lambda: ScriptedRunner,  # type: ignore[arg-type]
                               stop_processes=stop, processes="toy server(s)")  # fmt: skip
    monkeypatch.setitem(registry._ENTRIES, "toy", toy)
    done = registry.stop_all_processes()
    assert stopped == ["toy"] and done["toy server(s)"] == 2
    assert set(done) <= {"toy server(s)", "llama-server process(es)", "vLLM server(s)"}
