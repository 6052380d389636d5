"""One validation before anything is queued or loaded: `submit`, `run` and the Run page's submit_session refuse a
temperature that is not a finite number, a device that is not auto/cpu/cuda[:N] or not here, a seed outside
0..2^63-1, a thread count below 1 and a prompt over the target's context (named by its number in the user's file, not
a database id), each with one line and exit 2, storing nothing; `serve --threads` is checked the same way, and
`submit --max-prompts N` stores N prompts.

Real SQLite stores in tmp_path (SPECTUNE_HOME points there), the real CLI's main(), tiny models (no weights load).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.errors import SettingsError
from engine.models.tiny import TINY_CONTEXT
from engine.service.jobs import submit_session
from engine.session.spec import SessionSpec
from foundation.paths import default_database_url
from store import open_store
from tests.cli_calls import cli, one_line
from tests.cli_calls import prompts as prompts  # noqa: F401 - a fixture

TARGET = "tiny:1:48:2:64"
DRAFT = "tiny:1:48:2:64~0.15"
LONG = "a" * (TINY_CONTEXT + 10)  # the tiny tokenizer reads one token a character


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("SPECTUNE_HOME", str(path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    return path


def stored(home: Path) -> tuple[list[dict], list[dict]]:
    """(sessions, prompt sets) in the private store."""
    store = open_store(default_database_url())
    try:
        return store.list_sessions(), store.list_prompt_sets()
    finally:
        store.close()


def submit_args(prompts: Path, *extra: str) -> list[str]:
    return ["submit", "--target", TARGET, "--draft", DRAFT, "--prompts", str(prompts), "--dtype", "float32",
            "--no-chat-template", "--max-new-tokens", "8", *extra]  # fmt: skip


BAD = [
    (("--temperature", "nan"), "temperature nan is not a finite number"),
    (("--temperature", "inf"), "temperature inf is not a finite number"),
    (("--device", "tpu"), "device 'tpu': choose auto, cpu or cuda[:N]"),
    (("--device", "cuda:99"), "device 'cuda:99'"),
    (("--seed", "99999999999999999999999"), "seed 99999999999999999999999: a whole number from 0 to"),
    (("--seed", "-1"), "seed -1: a whole number from 0 to"),
    (("--vllm-threads", "-2"), "vLLM threads = -2"),
    (("--threads", "0"), "threads = 0"),
]
if not torch.cuda.is_available():
    BAD.append((("--device", "cuda"), "device 'cuda': no CUDA GPU is available here"))


@pytest.mark.parametrize(("extra", "said"), BAD, ids=[" ".join(e) for e, _ in BAD])
def test_submit_refuses_a_bad_value_before_anything_is_stored(extra, said, home, prompts, capsys):
    code, out, err = cli(submit_args(prompts, *extra), capsys)
    assert code == 2 and "queued" not in out
    assert said in one_line(err)
    assert stored(home) == ([], [])


@pytest.mark.parametrize(("extra", "said"), BAD, ids=[" ".join(e) for e, _ in BAD])
def test_run_refuses_the_same_values_before_anything_is_read_or_loaded(extra, said, home, tmp_path, capsys):
    missing = tmp_path / "no-prompts-here.txt"  # the settings are refused before the prompt file is even read
    args = ["run", "--target", TARGET, "--draft", DRAFT, "--prompts", str(missing), "--dtype", "float32",
            "--json", str(tmp_path / "out.json"), *extra]  # fmt: skip
    code, _, err = cli(args, capsys)
    assert code == 2
    assert said in one_line(err)
    assert not (tmp_path / "out.json").exists()


def test_serve_refuses_a_thread_count_below_one(home, capsys):
    code, _, err = cli(["serve", "--threads", "-5"], capsys)
    assert code == 2
    assert one_line(err) == "error: --threads -5: 1 to 1024, or leave it out for llama-server's default"


def test_submit_max_prompts_stores_only_the_prompts_it_decodes(home, tmp_path, capsys):
    many = tmp_path / "many.txt"
    many.write_text("".join(f"prompt number {i}\n" for i in range(1, 501)))
    code, out, err = cli(submit_args(many, "--max-prompts", "2"), capsys)
    assert code == 0, err
    assert "2 new prompts" in out
    sessions, sets = stored(home)
    assert [s["n_prompts"] for s in sessions] == [2] and [p["n_prompts"] for p in sets] == [2]
    store = open_store(default_database_url())
    assert [p["text"] for p in store.get_prompts(sets[0]["id"])] == ["prompt number 1", "prompt number 2"]
    store.close()
    # stratified by category: the prompts the sample picks, one of each category, are the ones stored
    mixed = tmp_path / "mixed.jsonl"
    rows = [{"prompt": f"{cat} {i}", "category": cat} for cat in ("code", "prose") for i in range(50)]
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = cli(submit_args(mixed, "--max-prompts", "2"), capsys)
    assert code == 0, err
    store = open_store(default_database_url())
    newest = store.list_sessions()[0]
    assert [p["text"] for p in store.get_prompts(newest["prompt_set_id"])] == ["code 0", "prose 0"]
    assert newest["n_prompts"] == 2
    store.close()
    code, _, err = cli(submit_args(many, "--max-prompts", "0"), capsys)
    assert code == 2 and "--max-prompts 0: must be at least 1" in one_line(err)


def test_a_prompt_over_the_context_is_named_by_its_number_in_the_file(home, tmp_path, capsys):
    store = open_store(default_database_url())
    store.add_prompt_set("earlier", None, [{"text": f"an earlier prompt {i}"} for i in range(5)])  # ids move on
    store.close()
    path = tmp_path / "long.txt"
    path.write_text(f"a short prompt\n\n{LONG}\nanother short one\n")
    code, out, err = cli(submit_args(path), capsys)
    assert code == 2 and "queued" not in out
    line = one_line(err)
    assert line.startswith("error: prompt 2 (line 3): ") and "exceed the model context of 4096 tokens" in line, line
    sessions, sets = stored(home)
    assert sessions == [] and [s["name"] for s in sets] == ["earlier"]
    code, _, err = cli(submit_args(path, "--max-prompts", "1"), capsys)  # the long prompt is not decoded: queued
    assert code == 0, err


def test_the_run_page_s_submit_names_the_prompt_by_its_place_in_the_set(home):
    store = open_store(default_database_url())
    store.add_prompt_set("earlier", None, [{"text": f"an earlier prompt {i}"} for i in range(5)])
    set_id, _, _ = store.add_prompt_set("upload", "upload.txt", [{"text": "short"}, {"text": LONG}])
    spec = SessionSpec(target=TARGET, drafts=[DRAFT], gammas=[2], max_new_tokens=8, dtype="float32", device="cpu",
                       chat_template=False)  # fmt: skip
    long_id = store.get_prompts(set_id)[1]["id"]
    assert long_id != 2
    with pytest.raises(SettingsError, match=r"^prompt 2: \d+ prompt tokens \+ 8 new tokens exceed") as refused:
        submit_session(store, spec, set_id)
    assert f"prompt {long_id}" not in str(refused.value)
    assert store.list_sessions() == []
    assert submit_session(store, spec, set_id, 1) > 0  # the first prompt alone fits
    store.close()
