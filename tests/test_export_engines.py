"""Every export is accepted by the engine it names, and transformers really drafts the recommended γ.

* vLLM 0.33.0 and SGLang 0.5.23 cannot run here: their exports are checked with their own code, installed
  without dependencies in .venv-check (`make check-env`): scripts/check_vllm_export.py validates the
  speculative config against vllm/config/speculative.py and vLLM's schedule validator,
  scripts/check_sglang_export.py parses the flags with the parser SGLang builds from its own Spec dataclass.
* llama.cpp: the flags are parsed against the option table of build 11434's `llama-server --help`
  (tests/data/llama-server-b11434-spec-help.txt, compared with the installed binary when there is one).
* transformers 5.24: the exported JSON is applied to real models (a tiny pair here, the bundled Qwen pair in
  the real_model tests), every speculative step's draft is counted, and the output must equal target-alone
  greedy decoding in fp32.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_export import draft_rec, ngram_rec, off_rec

from engine.analysis.export import (
    HF_ORIGIN,
    LLAMACPP_BUILD,
    SGLANG_VERSION,
    VLLM_VERSION,
    export,
)
from engine.analysis.recommend import Recommendation
from engine.engines import registry

ROOT = Path(__file__).resolve().parents[1]
CHECK_PYTHON = ROOT / ".venv-check" / "bin" / "python"
CHECK_VLLM = ROOT / "scripts" / "check_vllm_export.py"
CHECK_SGLANG = ROOT / "scripts" / "check_sglang_export.py"
LLAMA_HELP = ROOT / "tests" / "data" / f"llama-server-b{LLAMACPP_BUILD}-spec-help.txt"
TARGET = "qwen2.5-coder-1.5b"


def cases() -> dict[str, tuple[Recommendation, str | None, dict[int, int] | None]]:
    """name -> (recommendation, target, schedule): the shapes an export can take."""
    bundled = draft_rec()
    bundled.model_ref = "qwen2.5-coder-0.5b"
    sampled = draft_rec(temperature=0.7)
    sampled.model_ref = "qwen2.5-coder-0.5b"
    scheduled = draft_rec()
    scheduled.model_ref = "qwen2.5-coder-0.5b"
    smol = draft_rec()
    smol.model_ref = "smollm2-135m"
    odd = draft_rec()
    odd.model_ref = "/models/my draft's dir"
    gguf = draft_rec()
    gguf.model_ref = "/models/draft-q4_k_m.gguf"
    in_llamacpp = ngram_rec()  # measured in llama-server's ngram-simple: one n-gram length, min = max
    assert in_llamacpp.measurement is not None
    in_llamacpp.measurement.drafting_loop = registry.drafting_loop("llama.cpp")
    return {
        "draft-bundled": (bundled, TARGET, None),
        "draft-hub-id": (draft_rec(), None, None),
        "draft-sampled": (sampled, TARGET, None),
        "draft-odd-path": (odd, None, None),
        "draft-gguf-file": (gguf, None, None),
        "ngram": (ngram_rec(), None, None),
        "ngram-measured-in-llamacpp": (in_llamacpp, None, None),
        "off": (off_rec(), None, None),
        "varying-schedule": (scheduled, TARGET, {1: scheduled.gamma, 4: scheduled.gamma, 16: 1, 32: 0}),
        "other-tokenizer": (smol, TARGET, None),
    }


CASES = cases()


def exported(name: str, fmt: str, **kw: Any) -> str:
    rec, target, schedule = CASES[name]
    return export(rec, fmt, schedule=schedule, target=target, **kw)[1]


@pytest.fixture(scope="module")
def check_python() -> Path:
    if not CHECK_PYTHON.is_file():
        pytest.fail(
            f"{CHECK_PYTHON.relative_to(ROOT)} is missing: run `make check-env` (`make test` does it first); it "
            f"installs vllm=={VLLM_VERSION} and sglang=={SGLANG_VERSION} without dependencies to check exports against"
        )
    return CHECK_PYTHON


def run_checker(python: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), *map(str, args)], capture_output=True, text=True, timeout=120)


# --- vLLM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_accepts_the_export(name: str, check_python: Path, tmp_path: Path) -> None:
    path = tmp_path / "vllm.json"
    path.write_text(exported(name, "vllm"))
    result = run_checker(check_python, CHECK_VLLM, path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"vllm {VLLM_VERSION}" in result.stdout or "null" in result.stdout
    config = json.loads(path.read_text())["speculative_config"]
    if config is not None:
        assert ("num_speculative_tokens_per_batch_size" in config) == (name == "varying-schedule")
        assert config.get("use_heterogeneous_vocab", False) == (name == "other-tokenizer")


def test_vllm_checker_rejects_what_vllm_rejects(check_python: Path, tmp_path: Path) -> None:
    """The checker is not a rubber stamp: an unknown key, a bad schedule and a bad method fail."""
    bad = [
        {"method": "draft_model", "model": "m", "num_speculative_tokens": 3, "draft_max": 3},
        {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[0, 4, 2]]},
        {"method": "draft-model", "model": "m", "num_speculative_tokens": 3},
    ]
    for i, config in enumerate(bad):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps({"speculative_config": config}))
        result = run_checker(check_python, CHECK_VLLM, path)
        assert result.returncode == 1, (config, result.stdout, result.stderr)


# --- SGLang --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_accepts_the_export(name: str, check_python: Path, tmp_path: Path) -> None:
    path = tmp_path / "sglang-flags.txt"
    text = exported(name, "sglang")
    path.write_text(text)
    result = run_checker(check_python, CHECK_SGLANG, "--flags-file", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sglang {SGLANG_VERSION}" in result.stdout
    args = shlex.split(text, comments=True)
    if name in ("off", "other-tokenizer"):
        assert args == []  # SGLang 0.5.23 cannot use a draft with another vocabulary: no config, a reason
    else:
        assert "--speculative-algorithm" in args


def test_sglang_rejects_the_removed_ngram_window_flags(check_python: Path) -> None:
    """What spectune exported before: --speculative-ngram-{min,max}-match-window-size, gone since SGLang 0.5.10."""
    old = "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4 --speculative-ngram-max-match-window-size 3"
    result = run_checker(check_python, CHECK_SGLANG, "--", *shlex.split(old))
    assert result.returncode == 1 and "match-window-size" in result.stderr


# --- llama.cpp -----------------------------------------------------------------------------------


@dataclass
class LlamaOptions:
    """The option table of one llama-server build, read from its --help output."""

    takes_value: dict[str, bool]
    removed: set[str]
    spec_types: set[str]

    @classmethod
    def parse(cls, text: str) -> LlamaOptions:
        takes_value: dict[str, bool] = {}
        removed: set[str] = set()
        spec_types: set[str] = set()
        for line in text.splitlines():
            if not line.startswith("-") or line.startswith("-----"):
                continue
            head, *rest = re.split(r"\s{2,}", line, maxsplit=1)
            description = rest[0] if rest else ""
            *names, last = head.split(", ")
            last_name, _, metavar = last.partition(" ")
            names.append(last_name)
            for n in names:
                takes_value[n] = bool(metavar)
            if "the argument has been removed" in description:
                removed.update(names)
            if "--spec-type" in names:
                spec_types = set(metavar.split(","))
        return cls(takes_value, removed, spec_types)

    def problems(self, args: list[str]) -> list[str]:
        out, i = [], 0
        while i < len(args):
            flag = args[i]
            if flag not in self.takes_value:
                out.append(f"{flag}: not an option of this build")
                i += 1
                continue
            if flag in self.removed:
                out.append(f"{flag}: removed in this build")
            if self.takes_value[flag]:
                if i + 1 >= len(args):
                    out.append(f"{flag}: missing its value")
                    break
                val = args[i + 1]
                if flag == "--spec-type" and not set(val.split(",")) <= self.spec_types:
                    out.append(f"--spec-type {val}: not one of {sorted(self.spec_types)}")
                i += 2
            else:
                i += 1
        return out


@pytest.fixture(scope="module")
def llama_options() -> LlamaOptions:
    options = LlamaOptions.parse(LLAMA_HELP.read_text())
    assert len(options.takes_value) > 60 and "draft-simple" in options.spec_types  # the fixture parsed
    return options


@pytest.mark.parametrize("name", list(CASES))
def test_llama_server_accepts_the_export(name: str, llama_options: LlamaOptions) -> None:
    text = exported(name, "llamacpp")
    assert text.startswith(f"# llama-server flags for llama.cpp build {LLAMACPP_BUILD} ")
    args = shlex.split(text, comments=True)
    assert llama_options.problems(args) == []
    if "--spec-draft-model" in args:  # -md alone loads the draft but does not speculate in this build
        assert args[args.index("--spec-type") + 1] == "draft-simple"
    if name in ("off", "other-tokenizer"):
        assert args == []
    else:
        assert "--spec-type" in args


def test_llama_server_options_reject_the_old_flags(llama_options: LlamaOptions) -> None:
    """What spectune exported before (-md … --draft-max γ --draft-min 0), and misspellings, are refused."""
    old = ["-md", "d.gguf", "--draft-max", "4", "--draft-min", "0", "--draft-p-min", "0"]
    assert llama_options.problems(old) == ["--draft-max: removed in this build", "--draft-min: removed in this build"]
    assert llama_options.problems(["--spec-type", "draft"]) != []
    assert llama_options.problems(["--spec-draft-max", "4"])[0] == "--spec-draft-max: not an option of this build"
    older_build = exported("draft-bundled", "llamacpp", llamacpp_build=8000)
    assert llama_options.problems(shlex.split(older_build, comments=True)) != []  # its flags are another build's


def test_the_help_fixture_is_the_installed_build() -> None:
    """The fixture is what `llama-server --help` of the build the project installs prints."""
    from engine.engines.llamacpp.binaries import PROJECT_BUILD, find_llama

    assert PROJECT_BUILD == LLAMACPP_BUILD
    build = find_llama()  # LlamaCppMissing (run `make setup`) fails the test: the build is part of the project
    assert build.build == LLAMACPP_BUILD, f"installed llama.cpp is build {build.build}, the fixture {LLAMACPP_BUILD}"
    live = subprocess.run([str(build.server), "--help"], capture_output=True, text=True, timeout=60).stdout
    section = re.search(r"^----- speculative params -----\n.*?(?=^----- )", live, re.S | re.M)
    assert section is not None
    fixture = "".join(line + "\n" for line in LLAMA_HELP.read_text().splitlines() if not line.startswith("#"))
    assert section.group(0) == fixture


# --- transformers: applied to real models --------------------------------------------------------


def apply_transformers_export(doc: dict[str, Any], objects: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """What a user does with the transformers export: load what "load" names, set the assistant's generation_config.

    `objects` stands in for from_pretrained (no hub here): (loader, reference) -> the loaded object.
    """
    kwargs = dict(doc["generate_kwargs"])
    for key, loader in doc.get("load", {}).items():
        kwargs[key] = objects[(loader, kwargs[key])]
    for field, setting in doc.get("assistant_generation_config", {}).items():
        setattr(kwargs["assistant_model"].generation_config, field, setting)
    return kwargs


@contextlib.contextmanager
def recorded_steps(draft_model: Any) -> Iterator[list[dict[str, int]]]:
    """Per speculative step: γ the candidate generator intended, target tokens drafted, room left, draft forwards."""
    from transformers.generation.candidate_generator import (
        AssistedCandidateGenerator,
        AssistedCandidateGeneratorDifferentTokenizers,
    )

    steps: list[dict[str, int]] = []
    forwards = [0]
    classes = (AssistedCandidateGenerator, AssistedCandidateGeneratorDifferentTokenizers)
    originals = {cls: cls.__dict__["get_candidates"] for cls in classes}

    def wrap(original: Any) -> Any:
        def get_candidates(self: Any, input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            gamma, before = int(self.num_assistant_tokens), forwards[0]
            out, logits = original(self, input_ids, *args, **kwargs)
            steps.append(
                {
                    "gamma": gamma,
                    "drafted": out.shape[1] - input_ids.shape[1],
                    "room": self.main_model_max_length - input_ids.shape[1] - 1,
                    "forwards": forwards[0] - before,
                    "threshold": self.assistant_generation_config.assistant_confidence_threshold,
                }
            )
            return out, logits

        return get_candidates

    hook = draft_model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    for cls in classes:
        cls.get_candidates = wrap(originals[cls])
    try:
        yield steps
    finally:
        hook.remove()
        for cls, original in originals.items():
            cls.get_candidates = original


def closed_loop(doc: dict[str, Any], target: Any, draft: Any, objects: dict, prompt_ids: Any, new_tokens: int):
    """Apply the export, generate assisted and alone (greedy, fp32); return (steps, assisted ids, alone ids)."""
    import torch

    saved = copy.deepcopy(draft.generation_config)
    try:
        kwargs = apply_transformers_export(doc, objects)
        assert kwargs["assistant_model"] is draft
        with torch.no_grad(), recorded_steps(draft) as steps:
            assisted = target.generate(prompt_ids, max_new_tokens=new_tokens, **kwargs)
        with torch.no_grad():
            alone = target.generate(prompt_ids, max_new_tokens=new_tokens, do_sample=False)
    finally:
        draft.generation_config = saved
    return steps, assisted, alone


def assert_exactly_gamma(steps: list[dict[str, int]], gamma: int) -> None:
    assert len(steps) >= 2, steps
    assert [s["gamma"] for s in steps] == [gamma] * len(steps), steps
    assert all(s["threshold"] == 0.0 for s in steps), steps
    # every step drafts γ tokens, except where the token budget leaves less room (the last steps)
    assert [s["drafted"] for s in steps] == [min(gamma, s["room"]) for s in steps], steps
    assert steps[0]["drafted"] == gamma


def tiny_models() -> tuple[Any, Any]:
    from engine.models.tiny import load_tiny

    target = load_tiny("tiny:1:48:2:64", dtype="float32")
    draft = load_tiny("tiny:1:48:2:64~0.15", dtype="float32")
    for m in (target, draft):  # no EOS: a drafted EOS would rightly cut a draft short
        m.model.generation_config.eos_token_id = None
        m.model.generation_config.pad_token_id = 0
    return target, draft


def test_transformers_export_drafts_exactly_gamma_tiny() -> None:
    import torch

    target, draft = tiny_models()
    rec = draft_rec()
    rec.model_ref, rec.gamma = "tiny:1:48:2:64~0.15", 4
    doc = json.loads(export(rec, "transformers")[1])
    objects = {("AutoModelForCausalLM", rec.model_ref): draft.model}
    prompt = target.tokenizer("the quick brown fox jumps over the lazy dog. the quick", return_tensors="pt")
    steps, assisted, alone = closed_loop(doc, target.model, draft.model, objects, prompt["input_ids"], 20)
    assert_exactly_gamma(steps, 4)
    assert [s["forwards"] for s in steps] == [min(4, s["room"]) for s in steps]
    assert torch.equal(assisted, alone)

    # the control: γ as a generate() kwarg, as spectune exported it before, is ignored by transformers
    saved = copy.deepcopy(draft.model.generation_config)
    try:
        with torch.no_grad(), recorded_steps(draft.model) as naive:
            target.model.generate(
                prompt["input_ids"], assistant_model=draft.model, max_new_tokens=20, do_sample=False,
                num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
            )  # fmt: skip
    finally:
        draft.model.generation_config = saved
    assert naive and {s["gamma"] for s in naive} != {4}


@pytest.mark.real_model
def test_transformers_export_drafts_exactly_gamma_real_pair() -> None:
    """The bundled Qwen2.5-Coder pair: 1.5B target, 0.5B draft (same tokenizer), fp32, 16 new tokens."""
    import torch
    from conftest import REAL_PROMPTS, real_pair

    target, draft = real_pair("float32")
    rec = draft_rec()
    rec.model_ref, rec.gamma = "qwen2.5-coder-0.5b", 3
    doc = json.loads(export(rec, "transformers", target=TARGET)[1])
    assert "tokenizer" not in doc["generate_kwargs"]
    objects = {("AutoModelForCausalLM", HF_ORIGIN["qwen2.5-coder-0.5b"]): draft.model}
    prompt = target.tokenizer(REAL_PROMPTS[2], return_tensors="pt")
    steps, assisted, alone = closed_loop(doc, target.model, draft.model, objects, prompt["input_ids"], 16)
    assert_exactly_gamma(steps, 3)
    assert torch.equal(assisted, alone)


@pytest.mark.real_model
def test_transformers_export_other_tokenizer_real() -> None:
    """SmolLM2-135M drafting for the Qwen 1.5B target: the tokenizer kwargs make generate() re-tokenise;
    every step runs γ draft forwards with the exported γ, and the output is the target's own."""
    import torch
    from conftest import REAL_PROMPTS, real_pair

    from engine.models.pool import ModelPool

    target, _ = real_pair("float32")
    smol = ModelPool().get("smollm2-135m", "float32")
    rec = draft_rec()
    rec.model_ref, rec.gamma = "smollm2-135m", 3
    doc = json.loads(export(rec, "transformers", target=TARGET)[1])
    objects = {
        ("AutoModelForCausalLM", HF_ORIGIN["smollm2-135m"]): smol.model,
        ("AutoTokenizer", HF_ORIGIN[TARGET]): target.tokenizer,
        ("AutoTokenizer", HF_ORIGIN["smollm2-135m"]): smol.tokenizer,
    }
    prompt = target.tokenizer(REAL_PROMPTS[2], return_tensors="pt")
    steps, assisted, alone = closed_loop(doc, target.model, smol.model, objects, prompt["input_ids"], 16)
    assert len(steps) >= 2 and [s["gamma"] for s in steps] == [3] * len(steps), steps
    assert all(s["threshold"] == 0.0 for s in steps)
    assert [s["forwards"] for s in steps[:-1]] == [3] * (len(steps) - 1), steps
    assert torch.equal(assisted, alone)


# --- llama.cpp: run for real ---------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, body: dict | None = None, timeout: float = 600) -> str:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.read().decode()


@contextlib.contextmanager
def exported_llama_server(args: list[str], tmp_path: Path) -> Iterator[str]:
    """llama-server build 11434 on the bundled target with exactly the exported flags (plus host, port, threads,
    context and metrics, and --no-repack on a CPU whose repacked kernels crash: engine.engines.llamacpp.kernels,
    a fact of this machine, not of the export); yields its base URL once healthy and stops its process group
    afterwards."""
    from engine.analysis.export import bundled_gguf_path
    from engine.engines.llamacpp.binaries import find_llama
    from engine.engines.llamacpp.server import ManagedServer, ServerConfig

    build = find_llama()  # fails with "run `make setup`" when llama-server is missing
    assert build.build == LLAMACPP_BUILD
    target_gguf = bundled_gguf_path(TARGET)
    assert target_gguf.is_file(), f"{target_gguf} is not assembled: run `make setup`"
    config = ServerConfig(target_gguf, threads=2, ctx_size=1024, parallel=1, extra=tuple(args))
    with ManagedServer(config, build=build, start_timeout_s=300) as server:
        command = server.command
        assert any(command[i : i + len(args)] == list(args) for i in range(len(command))), command  # the file's flags
        yield server.url


def spec_counters(base: str) -> dict[str, float]:
    """llama-server's speculation counters from /metrics (name -> value)."""
    return {
        line.split()[0]: float(line.split()[1])
        for line in _http(f"{base}/metrics").splitlines()
        if line.startswith("llamacpp:spec_decode_num_")
    }


@pytest.mark.real_model
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_llama_server_runs_the_export(method: str, tmp_path: Path) -> None:
    """llama-server build 11434 starts with exactly the exported flags and speculates: drafts ≤ γ per step."""
    if method == "ngram":
        rec, prompt = ngram_rec(), "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat"
    else:
        rec, prompt = CASES["draft-bundled"][0], "def fibonacci(n):\n"
    args = shlex.split(export(rec, "llamacpp", target=TARGET)[1], comments=True)
    assert args
    with exported_llama_server(args, tmp_path) as base:
        done = json.loads(_http(f"{base}/completion", {"prompt": prompt, "n_predict": 24, "temperature": 0}))
        timings = done["timings"]
        assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"], timings
        counters = spec_counters(base)
        drafts = counters["llamacpp:spec_decode_num_drafts_total"]
        draft_tokens = counters["llamacpp:spec_decode_num_draft_tokens_total"]
        assert drafts > 0 and draft_tokens == timings["draft_n"]
        assert draft_tokens <= rec.gamma * drafts  # never more than γ per step
        assert counters["llamacpp:spec_decode_num_accepted_tokens_total"] == timings["draft_n_accepted"]
