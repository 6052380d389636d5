"""A llama.cpp session holds only the llama-servers that fit in memory (issue #21, defect 7).

Seen: 5 llama-servers resident at once beside a worker holding 10 GB; with one other large process the 24 GiB
machine thrashed. Here: the estimate bounds what real servers of the bundled models hold (measured with psutil),
the session says before it starts what it will hold, refuses with the numbers when not one server fits, and
rotates servers (never more resident than fit) when not all do — with fakes for the rotation's bookkeeping and
once end to end with real servers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

import engine.engines.llamacpp.runner as llamacpp_engine
from engine.engines.llamacpp import client
from engine.engines.llamacpp.memory import (
    GIB,
    RESERVE_BYTES,
    ServerMemory,
    estimate,
    gguf_metadata,
    kv_cache_bytes,
    plan_sentence,
    private_bytes,
    together,
)
from engine.engines.llamacpp.runner import LlamaCppRunner
from engine.engines.llamacpp.server import ManagedServer, ServerConfig, ServerError
from engine.engines.registry import sweep
from engine.models.bundled import gguf_for
from engine.session.runner import DecodeContext, PromptText, plan_runs
from engine.session.spec import SessionSpec
from tests.test_llamacpp import DRAFT, TARGET, Recorder

PROMPTS = [PromptText("a", "Say hello in French."), PromptText("b", "Name three colours."),
           PromptText("c", "Count to five.")]  # fmt: skip


def our_servers() -> list[psutil.Process]:
    """The llama-servers this test process started (other sessions on the machine may run their own)."""
    return [c for c in psutil.Process().children(recursive=True) if c.name() == "llama-server"]


@pytest.fixture(autouse=True)
def no_server_left_behind() -> Any:
    yield
    deadline = time.monotonic() + 10
    while our_servers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not our_servers(), "a llama-server was left running"


def ctx() -> DecodeContext:
    phases: list[str] = []
    return DecodeContext(on_step=lambda r: None, should_stop=lambda: False,
                         phase=lambda label, *a: phases.append(label))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# the estimate


def test_the_kv_cache_comes_from_the_gguf_header() -> None:
    target = gguf_for(TARGET, "target")
    meta = gguf_metadata(target, ["qwen2.block_count", "qwen2.attention.head_count_kv"])
    assert meta["general.architecture"] == "qwen2" and meta["qwen2.block_count"] == 28
    # 28 layers × 2 KV heads × (128 + 128) × 2 bytes = 28 KiB per token: 112 MiB at 4096 tokens
    assert kv_cache_bytes(target, 4096) == 28 * 2 * 256 * 2 * 4096 == 112 * 1024**2


def test_the_estimate_bounds_what_real_servers_hold() -> None:
    # measured after one decode: anonymous memory (private) and RSS (private + the mapped files) of the draft alone
    # and the target with the draft (the largest server a session of the bundled models starts); not USS, which
    # counts a mapped file as private while no other process maps it
    target, draft = gguf_for(TARGET, "target"), gguf_for(DRAFT, "draft")
    for config in (ServerConfig(draft), ServerConfig(target, draft=draft, spec_type="draft-simple")):
        with ManagedServer(config) as server:
            client.complete(server.url, "Write a haiku about the sea.", 32, 0.0, 0, 0, 1.0)
            held = psutil.Process(server.proc.pid).memory_full_info()
            anonymous = private_bytes(server.proc.pid)
        assert anonymous is not None and 0 < anonymous <= held.rss
        guess = estimate(config)
        mib = {"rss": held.rss, "uss": held.uss, "anon": anonymous, "estimate": guess.total(), "private": guess.private}
        print(config.model.name, config.draft is not None, {k: round(v / 2**20) for k, v in mib.items()}, "MiB")
        assert guess.private >= anonymous, (config.model.name, guess.private, anonymous)
        assert guess.total() >= held.rss, (config.model.name, guess.total(), held.rss)
        assert guess.total() < 3 * held.rss  # an upper bound, not a refusal to run anything


def test_the_plan_says_how_many_fit_with_the_numbers() -> None:
    file = Path("/models/target.gguf")
    servers = [ServerMemory(private=2 * GIB, files={file: GIB}) for _ in range(3)]
    assert together(servers) == 7 * GIB  # the shared file counted once
    fit, said = plan_sentence(servers, available=RESERVE_BYTES + 8 * GIB)
    assert fit == 3 and "3 llama-server(s) need at most 7.0 GiB" in said and "all are started at once" in said
    fit, said = plan_sentence(servers, available=RESERVE_BYTES + 5.5 * GIB)
    assert fit == 2 and "at most 2 are resident at once" in said and "7.5 GiB is available" in said
    fit, said = plan_sentence(servers, available=RESERVE_BYTES + GIB)
    assert fit == 0 and "not even one fits" in said


# ---------------------------------------------------------------------------------------------------------------------
# the runner: refuse, or rotate within the limit (fake servers: the bookkeeping only)


class FakeServer:
    started: list[ServerConfig] = []
    alive: set[int] = set()

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.proc = SimpleNamespace(pid=os.getpid())
        self.url = "http://127.0.0.1:1"
        FakeServer.started.append(config)
        FakeServer.alive.add(id(self))

    def stop(self, timeout_s: float = 5.0) -> None:
        FakeServer.alive.discard(id(self))


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Any:
    FakeServer.started, FakeServer.alive = [], set()
    monkeypatch.setattr(LlamaCppRunner, "_start", lambda self, config: FakeServer(config))
    monkeypatch.setattr(llamacpp_engine, "private_bytes", lambda pid: 0)
    return FakeServer


def ngram_spec() -> SessionSpec:
    return SessionSpec(target=TARGET, drafts=["ngram"], gammas=[1, 2, 3], engine="llama.cpp", chat_template=False)


def test_a_session_that_does_not_fit_is_refused_before_any_server_starts(fakes, monkeypatch) -> None:
    monkeypatch.setattr(llamacpp_engine, "available_bytes", lambda: RESERVE_BYTES + GIB // 2)
    spec = ngram_spec()
    with pytest.raises(ServerError) as refused:
        LlamaCppRunner().start(spec, PROMPTS, plan_runs(spec), ctx())
    said = str(refused.value)
    assert said.startswith("not enough memory for this session: 4 llama-server(s) need at most")
    assert "2.5 GiB is available now, 2.0 GiB kept free" in said and "not even one fits" in said
    assert fakes.started == []


def test_servers_take_turns_within_the_limit(fakes, monkeypatch) -> None:
    spec = ngram_spec()
    plan = plan_runs(spec)
    one = estimate(ServerConfig(gguf_for(TARGET, "target"), spec_type=None))
    # room for two servers of the target (its file once) and not three
    monkeypatch.setattr(llamacpp_engine, "available_bytes", lambda: RESERVE_BYTES + together([one, one]) + GIB // 8)
    runner = LlamaCppRunner()
    assert runner.start(spec, PROMPTS, plan, ctx()) == {}
    assert runner.resident_limit == 2 and len(fakes.started) == 2 and len(fakes.alive) == 2
    assert "at most 2 are resident at once" in runner.notes[0]
    most = 0
    for _prompt in range(3):
        for key in plan:
            server = runner._resident(runner.configs[key])
            assert server.config == runner.configs[key]
            most = max(most, len(fakes.alive))
    assert most == 2
    # the server used last is stopped for the next one: 4 configurations visited in turn with 2 resident cost 2 or 3
    # starts a round (2 is the fewest there can be; stopping the least recently used would start all 4 every round)
    assert runner.restarts == 7 < 2 + 4 + 4
    runner.stop()
    assert not fakes.alive


def test_a_session_that_fits_starts_every_server_at_once_and_says_so(fakes, monkeypatch) -> None:
    monkeypatch.setattr(llamacpp_engine, "available_bytes", lambda: 64 * GIB)
    spec = ngram_spec()
    runner = LlamaCppRunner()
    runner.start(spec, PROMPTS, plan_runs(spec), ctx())
    assert len(fakes.started) == len(fakes.alive) == 4 and runner.resident_limit == 4
    assert (
        runner.notes[0].startswith("memory: 4 llama-server(s) need at most")
        and "all are started at once" in (runner.notes[0])
    )
    runner.stop()


def test_the_estimate_says_before_queueing_what_the_start_will_note(fakes, monkeypatch) -> None:
    """A walk saw the Estimate say "about 1.5 GiB for 2 GGUF files" for a session whose start then noted 8
    llama-servers needing 13.6 GiB: what a session will hold is said before it is queued, in the start's words."""
    from engine.service.sizing.estimate import estimate_session

    monkeypatch.setattr(llamacpp_engine, "available_bytes", lambda: 64 * GIB)
    spec = ngram_spec()
    said = estimate_session([], spec, len(PROMPTS), "here")
    runner = LlamaCppRunner()
    runner.start(spec, PROMPTS, plan_runs(spec), ctx())
    assert said.sentences()[-1] == f"Memory: {runner.notes[0].removeprefix('memory: ')}"
    assert said.memory_bytes == together(runner.memory.values())
    runner.stop()


# ---------------------------------------------------------------------------------------------------------------------
# end to end: real servers, one resident at a time


def test_a_real_session_with_room_for_one_server_measures_every_configuration(monkeypatch) -> None:
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[2, 4], max_new_tokens=8, engine="llama.cpp",
                       measure_verify_cost=False)  # fmt: skip
    one = estimate(ServerConfig(gguf_for(TARGET, "target")))
    monkeypatch.setattr(llamacpp_engine, "available_bytes", lambda: RESERVE_BYTES + one.total() + GIB // 8)
    hooks = Recorder()
    most: list[int] = []
    hooks.on_step = lambda run, record: most.append(len(our_servers()))
    started = time.monotonic()
    report = sweep(spec, PROMPTS[:2], hooks).to_dict()
    assert not report["failed"], report["failed"]
    assert sorted((r["draft"], r["gamma"]) for r in report["runs"]) == [("ngram", 2), ("ngram", 4)]
    assert all(len(r["outputs"]) == 2 for r in report["runs"])
    assert max(most) == 1  # never two of our servers at once
    notes = " ".join(report["notes"])
    assert "at most 1 are resident at once" in notes and "start(s) after the first round" in notes
    assert time.monotonic() - started < 600
