"""llama-server's speculation flags come from one place (engine.engines.llamacpp.launch.speculative_server and
ServerConfig.speculation_flags), for the servers spectune starts and for the exports alike; a policy export and a
fixed-γ export are made from the same Deployment, so a fixed γ exported as a policy configures the same thing."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
from test_export import draft_rec, ngram_rec

from engine.analysis.export import LLAMACPP_SPEC_PARAMS_BUILD, bundled_gguf_path, export, export_policy
from engine.core.policy import ConfidenceStop, FixedGamma
from engine.engines.llamacpp.launch import speculative_server
from engine.engines.llamacpp.server import ServerConfig, ServerError
from engine.service.cli.endpoint import server_config

TARGET = "qwen2.5-coder-1.5b"


def bundled():
    rec = draft_rec()
    rec.model_ref = "qwen2.5-coder-0.5b"
    return rec


def args_of(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def test_the_three_flag_forms() -> None:
    draft = speculative_server(Path("t.gguf"), draft=Path("d.gguf"), policy=ConfidenceStop(0.6, 8, 2))
    assert draft.speculation_flags() == ["-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "8",
                                         "--spec-draft-n-min", "2", "--spec-draft-p-min", "0.6"]  # fmt: skip
    assert draft.speculation_flags("user") == ["--spec-type", "draft-simple", "--spec-draft-model", "d.gguf",
                                               "--spec-draft-n-max", "8", "--spec-draft-n-min", "2",
                                               "--spec-draft-p-min", "0.6"]  # fmt: skip
    assert draft.speculation_flags("legacy") == ["-md", "d.gguf", "--draft-max", "8", "--draft-min", "2",
                                                 "--draft-p-min", "0.6"]  # fmt: skip
    ngram = speculative_server(Path("t.gguf"), ngram_window=(1, 3), policy=FixedGamma(5))
    assert ngram.speculation_flags() == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                         "--spec-ngram-simple-size-m", "5", "--spec-draft-n-max", "5",
                                         "--spec-draft-n-min", "0"]  # fmt: skip
    assert ngram.speculation_flags("user") == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                               "--spec-ngram-simple-size-m", "5"]  # fmt: skip
    with pytest.raises(ServerError):
        ngram.speculation_flags("legacy")
    assert speculative_server(Path("t.gguf")).speculation_flags("user") == []
    flags = draft.flags()
    assert flags[: flags.index("-md")] == ["-m", "t.gguf", "-c", "4096", "-np", "1", "--metrics", "--no-webui",
                                           "--no-warmup"]  # fmt: skip


@pytest.mark.parametrize("build", [None, LLAMACPP_SPEC_PARAMS_BUILD - 1])
def test_the_llamacpp_export_carries_the_servers_own_flags(build: int | None) -> None:
    legacy = build is not None
    draft = speculative_server(Path("t.gguf"), draft=bundled_gguf_path("qwen2.5-coder-0.5b"), policy=FixedGamma(3))
    text = export(bundled(), "llamacpp", target=TARGET, llamacpp_build=build)[1]
    assert args_of(text) == draft.speculation_flags("legacy" if legacy else "user")
    policy = export_policy(bundled(), ConfidenceStop(0.6, 16, 2), "llamacpp", target=TARGET, llamacpp_build=build)
    stop = speculative_server(Path("t.gguf"), draft=bundled_gguf_path("qwen2.5-coder-0.5b"),
                              policy=ConfidenceStop(0.6, 16, 2))  # fmt: skip
    assert args_of(policy.text) == stop.speculation_flags("legacy" if legacy else "user")
    ng = ngram_rec()
    ngram = speculative_server(Path("t.gguf"), ngram_window=(2, 3), policy=FixedGamma(ng.gamma))
    assert args_of(export(ng, "llamacpp")[1]) == ngram.speculation_flags("user")


@pytest.mark.parametrize("fmt", ["llamacpp", "sglang"])
def test_a_fixed_gamma_policy_configures_what_the_recommendation_does(fmt: str) -> None:
    rec = bundled()
    plain = export(rec, fmt, target=TARGET)[1]
    policy = export_policy(rec, FixedGamma(rec.gamma), fmt, target=TARGET)
    assert args_of(policy.text) == args_of(plain) and policy.exact
    assert policy.text.splitlines()[0] == plain.splitlines()[0]


def test_a_fixed_gamma_policy_in_the_json_exports() -> None:
    rec = bundled()
    for fmt, key in (("vllm", "speculative_config"), ("transformers", "assistant_generation_config")):
        plain = json.loads(export(rec, fmt, target=TARGET)[1])
        policy = json.loads(export_policy(rec, FixedGamma(rec.gamma), fmt, target=TARGET).text)
        assert policy[key] == plain[key]
        assert policy["policy"]["spec"] == f"fixed:{rec.gamma}" and policy["policy"]["exact"]
        assert {k: v for k, v in policy.items() if k not in ("spectune", "policy", "note")} == {
            k: v for k, v in plain.items() if k not in ("spectune", "note")
        }


@pytest.mark.parametrize("fmt", ["llamacpp", "sglang"])
def test_a_name_with_a_newline_stays_in_the_comments(fmt: str) -> None:
    rec = bundled()
    clean = args_of(export(rec, fmt, target=TARGET)[1])
    rec.draft_name = "two\nlines"
    rec.notes = ["a note"]
    text = export(rec, fmt, target=TARGET)[1]
    assert args_of(text) == clean
    assert "# lines (draft_model)" in text and "# note: a note" in text


def test_serve_builds_its_server_with_speculative_server(tmp_path: Path) -> None:
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")

    def config(draft_ref: str) -> ServerConfig:
        args = argparse.Namespace(target=str(target), draft=draft_ref, gamma=4, parallel=2, port=0, threads=3,
                                  ctx_size=1024)  # fmt: skip
        return server_config(args)

    common = {"ctx_size": 2048, "parallel": 2, "threads": 3}
    assert config("none") == ServerConfig(target, **common)
    assert config("ngram:1-3") == ServerConfig(target, spec_type="ngram-simple", draft_n_max=4, draft_n_min=0,
                                               ngram_size_n=3, ngram_size_m=4, **common)  # fmt: skip
    assert config(str(draft)) == ServerConfig(target, draft=draft, spec_type="draft-simple", draft_n_max=4,
                                              draft_n_min=0, draft_p_min=0.0, **common)  # fmt: skip
