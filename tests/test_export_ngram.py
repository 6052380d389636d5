"""An n-gram recommendation exports the n-gram sizes its session measured, in every format, or says how they differ.

The sessions are stored as a user's would be (spectune's loop and llama.cpp, each with an n-gram window) and
recommended from through the service call the CLI and the Recommend page make. What each session measured is
read from the parts that measured it: the draft source the factory builds for spectune's loop, the
llama-server the llama.cpp runner launches, and the speculative_config the vLLM runner starts vLLM with.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.analysis.export import export, format_names
from engine.drafts.factory import make_draft
from engine.drafts.ngram import NgramDraft
from engine.engines.llamacpp.runner import server_configs
from engine.engines.llamacpp.server import ServerConfig
from engine.engines.vllm.runner import speculative_config
from engine.service.decide.recommendations import recommend_and_export
from engine.session.runner import RunKey
from engine.session.spec import SessionSpec
from store import Store
from tests.test_evidence_engines import store as store  # noqa: F401 - the fixture: a fresh data home

TARGET = "qwen2.5-coder-1.5b"


def ngram_session(store: Store, engine: str, draft: str, gammas: tuple[int, ...] = (2, 4)) -> int:
    """A finished session of `draft` (an n-gram reference) at `gammas`, measured with `engine`."""
    set_id, _, _ = store.add_prompt_set(f"set-{engine}-{draft}", None, [{"text": "the cat sat; the cat sat"}])
    sid = store.create_session(target=TARGET, drafts=[draft], gammas=list(gammas), temperatures=[0.0],
                               max_new_tokens=16, prompt_set_id=set_id, n_prompts=1,
                               options={"engine": engine})  # fmt: skip
    store.claim_next_session("test:1")
    base = store.create_run(sid, "none", 0, 0.0, "baseline")
    store.finish_run(base, {"engine": engine}, tokens_per_s=10.0, tokens_per_call=1.0, speedup_measured=1.0)
    for gamma in gammas:
        run = store.create_run(sid, draft, gamma, 0.0, "speculative")
        tpc = 1.0 + 0.6 * gamma
        spread = {"median": 1.2, "min": 1.15, "max": 1.25, "n": 3, "verdict": "faster"}
        store.finish_run(run, {"engine": engine, "alpha_from_acceptance_length": 0.7, "speedup_spread": spread},
                         alpha=0.7, c=0.0, tokens_per_s=12.0, speedup_measured=1.2, tokens_per_call=tpc,
                         per_position_acceptance=[0.7] * gamma, speedup_predicted=1.2)  # fmt: skip
    store.finish_session(sid, "done", summary={})
    return sid


def recommended(store: Store, sid: int) -> tuple[Any, dict[str, str]]:
    """The recommendation and every format's export, as the service returns them."""
    result = recommend_and_export(store, [sid])
    assert not result.failed, result.failed
    assert result.recommendation.method == "ngram" and result.recommendation.gamma >= 1
    return result.recommendation, {fmt: text for fmt, (_, text) in result.files.items()}


def spectune_drafted(draft: str) -> NgramDraft:
    """The draft source spectune's loop decodes `draft` with (an n-gram source needs no model)."""
    source = make_draft(draft, None, None)  # type: ignore[arg-type]
    assert isinstance(source, NgramDraft)
    return source


def llamacpp_launched(draft: str, gamma: int) -> ServerConfig:
    """The llama-server the llama.cpp runner starts for `draft` at `gamma`."""
    key = RunKey(draft, gamma, 0.0)
    spec = SessionSpec(target=TARGET, drafts=[draft], gammas=[gamma], engine="llamacpp")
    configs, _ = server_configs(spec, [key], locate=lambda ref, role: Path(f"/models/{role}.gguf"))
    return configs[key]


def flags_of(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def comments_of(text: str) -> str:
    return " ".join(line for line in text.splitlines() if line.startswith("#"))


def test_every_format_is_checked_here() -> None:
    assert set(format_names()) == {"vllm", "sglang", "transformers", "llamacpp", "spectune"}


@pytest.mark.parametrize("draft", ["ngram", "ngram:2-4"])
def test_a_spectune_loop_ngram_exports_the_window_it_measured(store: Store, draft: str) -> None:
    rec, files = recommended(store, ngram_session(store, "spectune", draft))
    source = spectune_drafted(draft)  # what spectune's loop drafted with
    lo, hi = source.min_ngram, source.max_ngram
    for gamma in sorted({1, 2, rec.gamma, hi + 2}):  # γ below, at and above the longest n-gram
        files = {fmt: export(replace(rec, gamma=gamma), fmt, target=TARGET)[1] for fmt in format_names()}
        vllm = json.loads(files["vllm"])["speculative_config"]
        assert vllm == speculative_config(RunKey(draft, gamma, 0.0), None)  # what vLLM's own sessions run
        assert (vllm["prompt_lookup_min"], vllm["prompt_lookup_max"]) == (lo, hi)
        assert not [c for c in json.loads(files["vllm"]).get("comments", []) if "prompt_lookup" in c]  # none differs
        llama = flags_of(files["llamacpp"])
        assert llama == llamacpp_launched(draft, gamma).speculation_flags("user")  # what llama.cpp sessions run
        assert value(llama, "--spec-ngram-simple-size-n") == str(hi) == str(vllm["prompt_lookup_max"])
        assert value(llama, "--spec-ngram-simple-size-m") == str(gamma)
        assert f"measured: a lookup of the last {hi} down to {lo} tokens" in comments_of(files["llamacpp"])
        assert "no shorter fallback" in comments_of(files["llamacpp"])
        sglang = flags_of(files["sglang"])
        assert value(sglang, "--speculative-ngram-max-trie-depth") == str(hi + gamma)
        assert f"measured: a lookup of the last {hi} down to {lo} tokens" in comments_of(files["sglang"])
        assert "cannot set the shortest match" in comments_of(files["sglang"])
        hf = json.loads(files["transformers"])
        assert hf["generate_kwargs"]["max_matching_ngram_size"] == hi
        assert hf["generate_kwargs"]["prompt_lookup_num_tokens"] == gamma
        assert ("no shortest match" in " ".join(hf.get("comments", []))) == (lo > 1)  # transformers' floor is 1
        record = json.loads(files["spectune"])["evidence"]["measurement"]
        assert (record["ngram_min"], record["ngram_max"]) == (lo, hi)
        assert (record["ngram_looked_up"]["shortest"], record["ngram_looked_up"]["longest"]) == (lo, hi)


@pytest.mark.parametrize("draft", ["ngram", "ngram:2-4"])
def test_a_llamacpp_ngram_exports_the_one_length_its_server_looked_up(store: Store, draft: str) -> None:
    rec, files = recommended(store, ngram_session(store, "llama.cpp", draft))
    launched = llamacpp_launched(draft, rec.gamma)
    size_n = launched.ngram_size_n
    assert size_n == spectune_drafted(draft).max_ngram
    assert flags_of(files["llamacpp"]) == launched.speculation_flags("user")
    assert "as measured" in comments_of(files["llamacpp"])
    doc = json.loads(files["vllm"])
    vllm = doc["speculative_config"]
    assert (vllm["prompt_lookup_min"], vllm["prompt_lookup_max"]) == (size_n, size_n)  # exactly that length
    assert f"llama.cpp's ngram-simple, a lookup of exactly the last {size_n} tokens" in " ".join(doc["comments"])
    assert value(flags_of(files["sglang"]), "--speculative-ngram-max-trie-depth") == str(size_n + rec.gamma)
    assert f"exactly the last {size_n} tokens" in comments_of(files["sglang"])
    hf = json.loads(files["transformers"])
    assert hf["generate_kwargs"]["max_matching_ngram_size"] == size_n
    assert "no shortest match" in " ".join(hf["comments"])
    looked_up = json.loads(files["spectune"])["evidence"]["measurement"]["ngram_looked_up"]
    assert (looked_up["shortest"], looked_up["longest"]) == (size_n, size_n)


def test_the_runners_and_the_exports_share_one_window_to_size_rule() -> None:
    """A window llama.cpp cannot look up is refused where the rule lives, not silently clipped."""
    from engine.engines.llamacpp.launch import ngram_simple_size
    from engine.errors import SettingsError

    assert ngram_simple_size((1, 3)) == 3
    with pytest.raises(SettingsError):
        ngram_simple_size((3, 2))
