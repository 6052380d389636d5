"""The suffix export run for real: vLLM CPU 0.32.0 (.venv-vllm, with the suffix-tree wheel `make setup` installs)
serves SmolLM2-135M with exactly the exported `method: "suffix"` config, drafts, accepts, and accepts more on a
request its global tree has seen (the warm cache). One server start, about a minute on 2 cores."""

from __future__ import annotations

import json
import urllib.request

from test_suffix_export import suffix_rec
from test_vllm_server import smollm

from engine.analysis.export import export
from engine.engines.vllm.server import VllmConfig, VllmServer
from engine.serving.metrics import parse_metrics

PROMPT = "Count: one two three four five six seven eight nine ten. Again: one two three"


def _complete(server: VllmServer, prompt: str) -> str:
    body = json.dumps({"model": str(server.config.model), "prompt": prompt, "max_tokens": 48, "temperature": 0,
                       "ignore_eos": True})  # fmt: skip
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{server.url}/v1/completions", body.encode(), headers)
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())["choices"][0]["text"]


def _counters(server: VllmServer) -> tuple[int, int]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
        c = parse_metrics(reply.read().decode())
    return int(c.drafts or 0), int(c.accepted_tokens or 0)


def test_vllm_runs_the_suffix_export_and_learns_across_requests() -> None:
    speculative = json.loads(export(suffix_rec("suffix"), "vllm")[1])["speculative_config"]
    assert speculative["method"] == "suffix"
    config = VllmConfig.with_speculation(smollm(), speculative, max_model_len=512, kv_cache_mib=256)
    with VllmServer(config) as server:
        first = _complete(server, PROMPT)
        drafts_1, accepted_1 = _counters(server)
        second = _complete(server, PROMPT)  # the same request again: its response is in the global tree
        drafts_2, accepted_2 = _counters(server)
    assert first.strip() and second == first, (first, second)  # greedy, speculative or not
    assert drafts_1 > 0 and accepted_1 > 0
    assert accepted_2 - accepted_1 > accepted_1  # warm: the earlier response is drafted back


def test_a_vllm_session_runs_suffix_decoding_through_the_one_driver() -> None:
    """A vLLM session with a suffix draft (the config the export writes) measured beside the target alone: vLLM's
    own counters show drafts and acceptance, the output is the target's, the servers are gone afterwards."""
    from engine.engines import registry
    from engine.session.runner import PromptText
    from engine.session.spec import SessionSpec

    prompts = [PromptText("a", PROMPT), PromptText("b", PROMPT)]  # the second sees the first's response in the tree
    spec = SessionSpec(target="smollm2-135m", drafts=["suffix:24:1:0.1"], gammas=[4], max_new_tokens=24,
                       dtype="float32", engine="vllm", concurrency=[1], measure_verify_cost=False,
                       detect_regime=False, chat_template=False)  # fmt: skip
    report = registry.sweep(spec, prompts).to_dict()
    assert report["failed"] == [], report["failed"]
    (run,) = report["runs"]
    assert run["method"] == "suffix" and run["draft_acceptance_rate"] is not None and run["tokens_per_call"] > 1
    assert all(d["verdict"] in ("identical", "near-tie") for d in run["divergences"])
    assert report["vllm"]["startups"][1]["speculative_config"]["method"] == "suffix"
