"""Which speculation policies a llama.cpp session runs: the mapping onto llama-server's draft flags, the settings it
refuses (and what it says to run instead), and the draft forwards read from its counters. No server is started
(tests/test_llamacpp.py runs one)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.core.counters import SpecCounters
from engine.engines.llamacpp.policy_flags import draft_forwards, llamacpp_fields
from engine.engines.llamacpp.server import ServerConfig
from engine.engines.registry import validate
from engine.errors import SettingsError
from engine.service.cli import main as cli
from engine.service.cli.policy import run_policy
from engine.session.spec import SessionSpec

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def llama_spec(**kw) -> SessionSpec:
    base = dict(target=TARGET, drafts=[DRAFT], gammas=[4], policies=["confidence:0.6:8:0"], engine="llama.cpp")
    return SessionSpec(**(base | kw))


@pytest.mark.parametrize(
    ("spec", "fields"),
    [
        ("fixed:4", {"draft_n_max": 4, "draft_n_min": 0, "draft_p_min": 0.0}),
        ("confidence:0.6:8:2", {"draft_n_max": 8, "draft_n_min": 2, "draft_p_min": 0.6}),
        ("confidence:0.5", {"draft_n_max": 16, "draft_n_min": 0, "draft_p_min": 0.5}),
        ("confidence:0.4:20:0:keep", None),
        ("heuristic:4", None),
        ("adaptive", None),
        ("batch:1=4,8=2", None),
    ],
)
def test_policies_map_onto_llama_server_flags(spec: str, fields: dict | None) -> None:
    assert llamacpp_fields(spec) == fields


def test_a_mapped_confidence_stop_becomes_the_servers_draft_flags() -> None:
    config = ServerConfig(Path("t.gguf"), draft=Path("d.gguf"), spec_type="draft-simple",
                          **llamacpp_fields("confidence:0.6:8:2"))  # fmt: skip
    flags = config.flags()
    for flag, value in (("--spec-draft-n-max", "8"), ("--spec-draft-n-min", "2"), ("--spec-draft-p-min", "0.6")):
        assert flags[flags.index(flag) + 1] == value


def test_a_llamacpp_session_accepts_what_llama_server_runs() -> None:
    validate(llama_spec())
    validate(llama_spec(gammas=[]))  # a policy alone is enough
    validate(llama_spec(policies=["fixed:3"], drafts=["ngram", DRAFT], gammas=[]))  # fixed:G is γ = G
    validate(llama_spec(drafts=["ngram", DRAFT]))  # policies run with the draft model, γ with both


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"policies": ["heuristic:4"]}, "llama.cpp cannot run heuristic:4: it runs fixed:G and confidence:P:NMAX:NMIN"),
        ({"policies": ["adaptive"]}, "llama.cpp cannot run adaptive.*spectune's loop"),
        ({"policies": ["batch:1=4"]}, "llama.cpp cannot run batch:1=4: "),
        ({"policies": ["confidence:0.4:20:0:keep"]}, "never keeps it; run confidence:0.4:20:0, or"),
        ({"drafts": ["ngram"]}, r"confidence:0.6:8:0 with a draft model only \(n-gram lookup has no draft confidence"),
        ({"drafts": ["ngram", DRAFT], "gammas": []}, "no γ given for n-gram lookup"),
        ({"policies": ["confidence:2"]}, "confidence p = 2"),
    ],
)
def test_a_llamacpp_session_refuses_what_llama_server_cannot_run(changes: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        validate(llama_spec(**changes))


def test_draft_forwards_from_the_counters() -> None:
    counters = SpecCounters(draft_tokens=11, target_calls=8)
    assert draft_forwards(counters, requests=2, p_min=0.6) == 17  # + one dropped token per drafting attempt
    assert draft_forwards(counters, requests=2, p_min=0.0) == 11  # a fixed γ drafts every token it samples


def test_run_policy_lets_llamacpp_through_and_the_cli_refuses_what_it_cannot_run(tmp_path: Path, capsys) -> None:
    args = argparse.Namespace(policy="confidence:0.6:8:0", gamma=4, engine="llamacpp")
    assert run_policy(args) == ("confidence:0.6:8:0", [])
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    code = cli.main(["run", "--engine", "llamacpp", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts),
                     "--policy", "heuristic:3", "--json", str(tmp_path / "out.json")])  # fmt: skip
    assert code == 2 and "llama.cpp cannot run heuristic:3" in capsys.readouterr().err
