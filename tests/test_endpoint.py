"""Endpoint sweeps against stand-in servers this test starts on 127.0.0.1, and each engine's metric families.

The metric texts below are the samples built from the pinned engines' own sources:
- vLLM 0.33.0: `vllm/v1/spec_decode/metrics.py` (SpecDecodingProm: counters vllm:spec_decode_num_drafts,
  …_num_draft_tokens, …_num_accepted_tokens, …_num_accepted_tokens_per_pos{position}; labels model_name, engine),
  rendered by prometheus_client after 4 drafts of 3 tokens with 3, 1, 2, 0 accepted.
- SGLang 0.5.23: `sglang/srt/observability/metrics_collector.py` (gauges sglang:spec_accept_length,
  sglang:spec_accept_rate; counter sglang:spec_verify_calls_total).
Both files are in .venv-check (`make check-env`); the names are checked against them when it is there.
No request leaves 127.0.0.1: every URL is a server started here, or a port nothing listens on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.core.records import Cancelled
from engine.engines import registry
from engine.engines.endpoint.report import compare, percentile, request_stats
from engine.engines.endpoint.requests import build_request
from engine.engines.endpoint.settings import Endpoint, EndpointSessionSettings, SweepLimits, api_key, parse_levels
from engine.engines.endpoint.standin import MODEL, StandIn, spec_figures
from engine.errors import SettingsError
from engine.service.endpoint_sessions import endpoint_spec
from engine.serving.metrics import ServerCounters, parse_metrics
from engine.serving.transport import EndpointError
from engine.session.hooks import Hooks
from engine.session.runner import PromptText

ROOT = Path(__file__).resolve().parents[1]
CHECK_ENV = next(iter(sorted((ROOT / ".venv-check" / "lib").glob("python3*/site-packages"))), None)

VLLM_SAMPLE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct"} 4.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct"} 1.7960846842646823e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct"} 12.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct"} 6.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",position="2"} 1.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",position="0"} 1.79e+09
"""  # noqa: E501

SGLANG_SAMPLE = """\
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.75
# HELP sglang:spec_accept_rate Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{engine_type="unified",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.583
# HELP sglang:spec_num_steps Currently active speculative_num_steps.
# TYPE sglang:spec_num_steps gauge
sglang:spec_num_steps{engine_type="unified",model_name="Qwen/Qwen2.5-Coder-7B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{engine_type="unified",model_name="Qwen/Qwen2.5-Coder-7B-Instruct"} 1234.0
"""  # noqa: E501

# what llama-server build 11434 (--metrics, a draft model) answered at /metrics after one request
LLAMACPP_SAMPLE = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 12
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 4
# HELP llamacpp:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 9
# HELP llamacpp:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 8
# HELP llamacpp:spec_decode_num_drafts_total Number of drafts.
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 3
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per position.
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 1
"""

PROMPTS = ["Write a loop.", "Say hello."]
PROMPTS4 = [*PROMPTS, "Sort a list.", "Name a colour."]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- metric families --------------------------------------------------------------------------------------------


def test_metric_names_are_the_pinned_engines_own() -> None:
    assert CHECK_ENV is not None, ".venv-check (make check-env) holds the pinned engines' sources"
    vllm = (CHECK_ENV / "vllm" / "v1" / "spec_decode" / "metrics.py").read_text()
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"):  # fmt: skip
        assert f'"{name}"' in vllm
    sglang = (CHECK_ENV / "sglang" / "srt" / "observability" / "metrics_collector.py").read_text()
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_verify_calls_total"):
        assert f'name="{name}"' in sglang


def test_vllm_counters_from_its_exposition() -> None:
    c = parse_metrics(VLLM_SAMPLE, "Qwen/Qwen2.5-Coder-7B-Instruct")
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (4.0, 12.0, 6.0)
    assert c.accepted_per_position == {0: 3.0, 1: 2.0, 2: 1.0}  # the _created gauges are ignored
    assert c.engines == {"vllm"} and c.source() == "counters"
    assert c.draft_acceptance_rate() == pytest.approx(0.5)  # accepted / draft tokens
    assert c.mean_acceptance_length() == pytest.approx(2.5)  # 1 + accepted / drafts
    assert c.per_position_acceptance() == pytest.approx([3 / 4, 2 / 3, 1 / 2])  # conditional


def test_sglang_gauges_and_verify_counter_from_its_exposition() -> None:
    c = parse_metrics(SGLANG_SAMPLE)
    assert c.engines == {"sglang"} and c.verify_calls == 1234.0
    assert (c.mean_acceptance_length(), c.draft_acceptance_rate()) == (2.75, 0.583)
    assert c.source() == "gauges" and c.per_position_acceptance() is None
    later = parse_metrics(SGLANG_SAMPLE.replace("1234.0", "1300.0").replace("2.75", "3.0"))
    delta = later.minus(c)
    assert delta.verify_calls == 66.0 and delta.accept_length == 3.0  # gauges are read, never differenced


def test_llamacpp_counters_and_differences() -> None:
    c = parse_metrics(LLAMACPP_SAMPLE)
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (3, 9, 8) and c.engines == {"llama.cpp"}
    assert c.mean_acceptance_length() == pytest.approx(1 + 8 / 3)
    delta = c.minus(ServerCounters(drafts=1, draft_tokens=3, accepted_tokens=2, accepted_per_position={0: 1}))
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (2, 6, 6)
    assert delta.accepted_per_position[0] == 2 and delta.accepted_per_position[3] == 1


def test_counters_of_the_model_under_test_only_when_several_are_served() -> None:
    other = VLLM_SAMPLE.replace("Qwen/Qwen2.5-Coder-7B-Instruct", "other/model")
    both = VLLM_SAMPLE + "\n".join(line for line in other.splitlines() if not line.startswith("#")) + "\n"
    assert parse_metrics(both, "other/model").drafts == 4.0
    assert parse_metrics(both, "").drafts == 8.0  # no model named: every label set counts


@pytest.mark.parametrize("text", ["<html><body>metrics</body></html>", '{"drafts": 4}', "this is not prometheus"])
def test_a_page_that_is_not_prometheus_text_is_one_clear_error(text: str) -> None:
    with pytest.raises(EndpointError, match="not Prometheus text") as info:
        parse_metrics(text)
    assert info.value.kind == "metrics_malformed"


# --- settings and caps -------------------------------------------------------------------------------------------


def test_urls_are_normalised_and_secrets_in_them_refused() -> None:
    assert Endpoint("http://127.0.0.1:8000/v1/").url == "http://127.0.0.1:8000"
    assert Endpoint("https://gw.example/vllm/v1/chat/completions").url == "https://gw.example/vllm"
    for bad, needle in [("http://user:pw@host", "credentials"), ("http://h/v1?api_key=x", "query"),
                        ("ftp://h", "http"), ("", "no"), ("http://:80", "host")]:  # fmt: skip
        with pytest.raises(SettingsError, match=needle):
            Endpoint(bad)
    with pytest.raises(SettingsError, match="name"):
        Endpoint("http://h", api_key_env="sk-live-123 key")


def test_levels_and_hard_caps() -> None:
    assert parse_levels("8, 1,2 4,4") == [1, 2, 4, 8]
    for bad in ("0", "65", "a", ""):
        with pytest.raises(SettingsError):
            parse_levels(bad)
    for field, value in [("max_requests", 0), ("max_requests", 10**6), ("max_duration_s", 0),
                         ("max_duration_s", 10**5), ("request_timeout_s", 10**4), ("max_new_tokens", 0)]:  # fmt: skip
        with pytest.raises(SettingsError):
            SweepLimits(**{field: value})
    with pytest.raises(SettingsError, match="unknown endpoint settings"):
        EndpointSessionSettings.from_dict({"url": "http://h", "api_key": "sk-secret"})


def test_the_api_key_comes_from_the_named_variable_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECTUNE_TEST_KEY", raising=False)
    assert api_key("") is None
    with pytest.raises(SettingsError, match="SPECTUNE_TEST_KEY is not set"):
        api_key("SPECTUNE_TEST_KEY")
    monkeypatch.setenv("SPECTUNE_TEST_KEY", "s3cret")
    assert api_key("SPECTUNE_TEST_KEY") == "s3cret"


def test_request_bodies_per_engine_and_api() -> None:
    limits = SweepLimits(max_new_tokens=16, ignore_eos=True)
    path, body = build_request(Endpoint("http://h", api="chat"), "vllm", "m", "hi", limits)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream"] and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] and body["max_tokens"] == 16 and body["model"] == "m"
    path, body = build_request(Endpoint("http://h"), "sglang", "", "hi", limits)
    assert path == "/v1/completions" and body["prompt"] == "hi" and body["return_spec_tokens_details"]
    assert "model" not in body
    _, body = build_request(Endpoint("http://h"), "openai", "m", "hi", limits)
    assert body["stream_options"] == {"include_usage": True} and "ignore_eos" not in body


# --- sweeps against stand-ins, through the one sweep driver ---------------------------------------------------


class Rows(Hooks):
    """Keeps every request row the driver hands over; `after_first` runs once, after the first round."""

    def __init__(self, after_first: Any = None, stop: bool = False) -> None:
        self.rows: list[dict[str, Any]] = []
        self.after_first = after_first
        self.stop = stop

    def requests(self, run: Any, rows: list[dict[str, Any]]) -> None:
        if not self.rows and self.after_first is not None:
            self.after_first()
        self.rows += rows

    def should_stop(self) -> bool:
        return self.stop


def sweep(url: str, levels=(1, 2), prompts=PROMPTS4, hooks: Hooks | None = None, max_new_tokens: int = 8,
          **settings: Any) -> dict[str, Any]:  # fmt: skip
    """An endpoint session's sweep, run now: its endpoint report, `stopped` included."""
    endpoint = {"url": url, "concurrency": list(levels), "max_requests": 4, "request_timeout_s": 5.0} | settings
    spec = endpoint_spec(endpoint, max_new_tokens)
    report = registry.sweep(spec, [PromptText(str(i), t) for i, t in enumerate(prompts)], hooks)
    assert report.engine == "endpoint" and report.stopped == report.engine_info["endpoint"]["stopped"]
    return report.engine_info["endpoint"]


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llama.cpp", "openai"])
def test_each_engine_is_detected_and_its_acceptance_read(flavor: str) -> None:
    with StandIn(flavor=flavor, tokens=8) as server:
        report = sweep(server.url)
    assert report["stopped"] is None
    ep = report["endpoints"][0]
    assert ep["engine"] == flavor and ep["model"] == MODEL
    assert ep["server_version"] == {"vllm": "0.33.0", "sglang": "0.5.23", "llama.cpp": "b11434-standin",
                                    "openai": None}[flavor]  # fmt: skip
    fig = spec_figures(8)
    for level in ep["levels"]:
        assert (level["requests"], level["errors"], level["output_tokens"]) == (4, 0, 32)
        assert level["tokens_per_s"] > 0 and level["ttft_p50_s"] is not None and level["itl_p95_s"] is not None
        if flavor == "openai":
            assert level["draft_acceptance_rate"] is None and level["mean_acceptance_length"] is None
            continue
        assert level["draft_acceptance_rate"] == pytest.approx(fig["accepted"] / fig["draft_tokens"])
        assert level["mean_acceptance_length"] == pytest.approx(1 + fig["accepted"] / fig["steps"])
        if flavor in ("vllm", "llama.cpp"):
            assert level["acceptance_source"] == "counters" and level["drafts"] == 4 * fig["steps"]
            assert level["per_position_acceptance"][0] == pytest.approx(fig["per_pos"][0] / fig["steps"])
        else:
            assert level["acceptance_source"] == "responses"  # SGLang's sglext, exact over the level
        if flavor in ("sglang", "llama.cpp"):  # the server's counters agree with what each response said
            assert level["response_accepted_tokens"] == 4 * fig["accepted"]


def test_the_driver_measures_a_deployment_like_any_engine() -> None:
    """The endpoint's runs carry the driver's figures: tokens per call from its counters, per-prompt speedups
    against the baseline endpoint with their spread and noise verdict, no fidelity verdict (text only)."""
    with StandIn(flavor="vllm", tokens=8) as spec, StandIn(flavor="openai", tokens=8) as base:
        endpoint = {"url": spec.url, "baseline_url": base.url, "concurrency": [1, 2], "max_requests": 4,
                    "request_timeout_s": 5.0}  # fmt: skip
        hooks = Rows()
        report = registry.sweep(endpoint_spec(endpoint, 8), [PromptText(str(i), t) for i, t in enumerate(PROMPTS4)],
                                hooks)  # fmt: skip
        urls = spec.url, base.url
    runs = {(r["kind"], r["concurrency"] if "concurrency" in r else 1): r for r in report.runs + report.baselines}
    under_test = runs[("speculative", 1)]
    fig = spec_figures(8)
    assert under_test["draft"] == urls[0] and under_test["method"] == "deployment"
    assert under_test["tokens_per_call"] == pytest.approx(8 / (8 - fig["accepted"]))  # every call
    assert under_test["mean_acceptance_length"] == pytest.approx(1 + fig["accepted"] / fig["steps"])  # vLLM's
    assert under_test["speedup_measured"] > 0 and sum(under_test["speedup_spread"][k] for k in ("n", "dropped")) == 4
    assert under_test["speedup_noisy"] in (True, False) and under_test["speedup_predicted"] is None
    assert under_test["divergences"] == [None] * 4 and "fidelity" in report.unavailable
    assert report.hardware == f"remote endpoint: {urls[0]}, {urls[1]}"
    assert len(hooks.rows) == 2 * 2 * 4 and {r["endpoint"] for r in hooks.rows} == {"speculative", "baseline"}


def test_chat_api_and_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_TEST_KEY", "s3cret")
    with StandIn(flavor="vllm", api_key="s3cret") as server:
        report = sweep(server.url, [1], api="chat", api_key_env="SPECTUNE_TEST_KEY")
        assert report["stopped"] is None and report["endpoints"][0]["levels"][0]["errors"] == 0
        assert set(server.auth_headers) == {"Bearer s3cret"}
        assert "/v1/chat/completions" in server.paths and "/v1/completions" not in server.paths
        monkeypatch.setenv("SPECTUNE_TEST_KEY", "wrong")
        denied = sweep(server.url, [1], api_key_env="SPECTUNE_TEST_KEY")
    assert "401" in denied["stopped"] and "API key" in denied["stopped"]


def test_a_refused_port_is_one_clear_message() -> None:
    port = free_port()
    report = sweep(f"http://127.0.0.1:{port}")
    assert report["stopped"].endswith("refused: nothing is listening there (is the server up?)")
    assert f"127.0.0.1:{port}" in report["stopped"]


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("unauthorized", "401"),
        ("rate_limited", "429 Too Many Requests (rate limited): rate limit reached, slow down (after 2 retries)"),
        ("garbage", "sent a stream event that is not JSON"),
        ("truncated", "the stream ended without [DONE]"),
        ("not_streaming", "did not stream"),
        ("error_event", "reported an error mid-stream: CUDA out of memory"),
    ],
)
def test_a_misbehaving_server_stops_the_sweep_with_what_it_said(mode: str, needle: str) -> None:
    hooks = Rows()
    with StandIn(mode=mode) as server:
        report = sweep(server.url, hooks=hooks, max_consecutive_errors=3)
    assert needle in report["stopped"]
    if mode != "unauthorized":  # a 401 stops before any measured request
        assert len(hooks.rows) == 3 and not any(r["ok"] for r in hooks.rows)  # the same round sent again
        assert "after 3 failed requests in a row" in report["stopped"]
        assert [lv["concurrency"] for lv in report["endpoints"][0]["levels"]] == [1]  # no other level sent one


def test_a_429_is_retried_and_the_retry_recorded() -> None:
    hooks = Rows()
    with StandIn(mode="rate_limited", fail_first=2) as server:  # the first request gets 429 twice
        report = sweep(server.url, [1], hooks=hooks, warmup_requests=0)
    assert report["stopped"] is None and all(r["ok"] for r in hooks.rows)
    assert hooks.rows[0]["retries"] == 2 and sum(r["retries"] for r in hooks.rows) == 2


def test_a_timeout_is_one_clear_message() -> None:
    with StandIn(mode="slow", delay_s=1.5) as server:
        started = time.monotonic()
        report = sweep(server.url, [1], request_timeout_s=0.3, max_consecutive_errors=2, warmup_requests=0)
    assert "within 0.3 s (timed out)" in report["stopped"]
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("metrics", "needle"), [
    ("missing", "answered 404: the server exports no metrics"), ("html", "is not Prometheus text (Content-Type"),
    ("garbage", "is not Prometheus text (could not convert"),
])  # fmt: skip
def test_metrics_missing_or_not_prometheus_keeps_the_sweep_going(metrics: str, needle: str) -> None:
    with StandIn(flavor="vllm", metrics=metrics) as server:
        report = sweep(server.url)
    ep = report["endpoints"][0]
    assert report["stopped"] is None and len(ep["levels"]) == 2
    assert len(ep["warnings"]) == 1 and needle in ep["warnings"][0]
    assert "the sweep goes on without server counters" in ep["warnings"][0]
    assert all(level["drafts"] is None and level["draft_acceptance_rate"] is None for level in ep["levels"])


def test_a_stop_keeps_what_was_measured_before_it() -> None:
    with StandIn(flavor="vllm") as server:

        def break_it() -> None:  # after the first round the server starts sending garbage
            server.mode = "garbage"

        hooks = Rows(after_first=break_it)
        report = sweep(server.url, (1, 2, 4), hooks=hooks)
    levels = report["endpoints"][0]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and "concurrency 2" in report["stopped"]
    assert levels[0]["ok"] == levels[0]["requests"] == 1 and levels[0]["drafts"] > 0
    assert hooks.rows[0]["ok"] and len(hooks.rows) == 1 + 2 + 2  # two rounds of 2 failed: 3 in a row stops it


def test_request_and_time_caps_hold() -> None:
    many = [f"prompt {i}" for i in range(40)]
    with StandIn(tokens=4, delay_s=0.05) as server:  # each request takes about 0.2 s
        started = time.monotonic()
        timed = sweep(server.url, [2], many, max_requests=1000, max_duration_s=0.6, max_new_tokens=4)
        elapsed = time.monotonic() - started
        capped = sweep(server.url, [4], many, max_requests=9, max_new_tokens=4)
    assert 2 <= timed["endpoints"][0]["levels"][0]["requests"] <= 12 and elapsed < 8
    assert capped["endpoints"][0]["levels"][0]["requests"] == 8  # whole rounds of 4 only
    with pytest.raises(SettingsError, match="below concurrency 4"):
        sweep("http://127.0.0.1:1", [4], many, max_requests=3)


def test_concurrency_means_requests_in_flight_together() -> None:
    with StandIn(tokens=4, delay_s=0.1) as server:  # 0.4 s per request
        one = sweep(server.url, [1], warmup_requests=0, max_new_tokens=4)
        four = sweep(server.url, [4], warmup_requests=0, max_new_tokens=4)
    assert one["endpoints"][0]["levels"][0]["wall_s"] > 1.4 and four["endpoints"][0]["levels"][0]["wall_s"] < 1.0


def test_a_cancel_ends_the_sweep() -> None:
    hooks = Rows(stop=True)
    with StandIn(tokens=4, delay_s=0.05) as server, pytest.raises(Cancelled):
        sweep(server.url, (1, 2), hooks=hooks, max_requests=50)
    assert hooks.rows == []


def test_a_baseline_endpoint_gives_the_comparison() -> None:
    with StandIn(flavor="vllm") as spec, StandIn(flavor="openai") as base:
        report = sweep(spec.url, baseline_url=base.url, ttft_slo_s=5.0)
    assert [e["label"] for e in report["endpoints"]] == ["speculative", "baseline"]
    points = report["comparison"]["points"]
    assert [p["concurrency"] for p in points] == [1, 2] and all(p["speedup"] > 0 for p in points)
    assert report["latency_target"] == {"ttft_slo_s": 5.0, "tpot_slo_s": None}


# --- the report ----------------------------------------------------------------------------------------------------


def test_percentiles_and_goodput() -> None:
    assert percentile([], 50) is None and percentile([3.0], 95) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile(list(range(101)), 95) == pytest.approx(95)
    rows = [{"ok": True, "started_at": 0.0, "duration_s": 2.0, "ttft_s": t, "tpot_s": 0.01, "output_tokens": 10,
             "itl_s": [0.01]} for t in (0.1, 0.2, 0.9)] + [{"ok": False, "started_at": 0.0, "duration_s": 1.0,
                                                            "error_kind": "timeout"}]  # fmt: skip
    stats = request_stats(rows, ttft_slo_s=0.5)
    assert stats["wall_s"] == 2.0 and stats["tokens_per_s"] == 15.0 and stats["errors"] == 1
    assert stats["goodput_rps"] == 1.0 and stats["goodput_tokens_per_s"] == 10.0
    assert stats["error_kinds"] == {"timeout": 1} and stats["slo_met"] == pytest.approx(2 / 3)


def test_the_flip_is_where_measured_speedup_falls_to_one_and_predictions_stay_apart() -> None:
    spec = [{"concurrency": c, "tokens_per_s": t, "mean_acceptance_length": 2.5, "drafts": 10, "draft_tokens": 30}
            for c, t in ((1, 30.0), (2, 50.0), (4, 70.0), (8, 80.0))]  # fmt: skip
    base = [{"concurrency": c, "tokens_per_s": t} for c, t in ((1, 15.0), (2, 30.0), (4, 60.0), (8, 100.0))]
    comp = compare(spec, base)
    assert [round(p["speedup"], 3) for p in comp["points"]] == [2.0, 1.667, 1.167, 0.8]
    assert comp["flip_concurrency"] == 8 and "stops paying at concurrency 8 (measured)" in comp["verdict"]
    assert comp["points"][0]["predicted_speedup"] == pytest.approx(2.0)  # c fitted at the lowest level
    assert all(p["predicted_speedup"] == pytest.approx(2.0) for p in comp["points"])  # the theory sees no batch
    assert compare(spec[:1], base[:1])["flip_concurrency"] is None
    assert "did not pay even" in compare(spec[-1:], base[-1:])["verdict"]


# --- the probe command ---------------------------------------------------------------------------------------------


def _probe(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "probe", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_probe_writes_one_entry_per_level(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS4) + "\n")
    out = tmp_path / "probe.json"
    with StandIn(flavor="vllm") as server:
        done = _probe(["--url", server.url + "/v1", "--prompts", str(prompts), "--concurrency", "1,2",
                       "--max-requests", "4", "--max-new-tokens", "8", "--json", str(out)])  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert (doc["engine"], doc["server_version"], doc["stopped"]) == ("vllm", "0.33.0", None)
    fields = {"concurrency", "requests", "errors", "tokens_per_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s",
              "drafts", "draft_tokens", "accepted_tokens", "draft_acceptance_rate", "mean_acceptance_length",
              "per_position_acceptance"}  # fmt: skip
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    assert all(fields <= set(lv) and lv["requests"] == 4 and lv["drafts"] > 0 for lv in doc["levels"])
    assert "concurrency 2: 4 requests, 0 errors" in done.stdout


def test_probe_failures_exit_nonzero_with_one_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    out = tmp_path / "o.json"
    bad = _probe(["--url", "http://127.0.0.1:1", "--prompts", str(prompts), "--concurrency", "65", "--json", str(out)])
    assert bad.returncode == 2 and "concurrency 65 is out of range" in bad.stderr and "Traceback" not in bad.stderr
    refused = _probe(["--url", f"http://127.0.0.1:{free_port()}", "--prompts", str(prompts), "--json", str(out)])
    assert refused.returncode == 1 and "refused" in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(out.read_text())["stopped"].endswith("(is the server up?)")
