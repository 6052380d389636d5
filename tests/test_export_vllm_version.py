"""The vLLM export names the vLLM version the user deploys, and its keys follow that version.

The default is the version spectune checks its exports against (VLLM_VERSION, whose source is in .venv-check);
a vLLM before VLLM_SCHEDULE_SINCE has no num_speculative_tokens_per_batch_size, so a γ schedule becomes the
headline γ, fixed, and a note says so; a malformed or unknown version is refused with one clear line, on the
command line (exit 2, no traceback) and on the Recommend page (an error in the export section, the other
formats still exported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import streamlit as st
from test_export import draft_rec

from engine.analysis.export import (
    VLLM_OLDEST,
    VLLM_SCHEDULE_SINCE,
    VLLM_VERSION,
    check_vllm_version,
    export,
    export_policy,
)
from engine.analysis.recommend import Recommendation
from engine.core.policy import BatchSchedule
from engine.errors import SettingsError
from foundation.paths import default_database_url
from store import open_store
from tests.t5_sessions import T5, store_session
from tests.test_app_pages import assert_clean, texts, unescape_md
from tests.test_app_pages import page as app_page

ROOT = Path(__file__).resolve().parents[1]
CHECK_PYTHON = ROOT / ".venv-check" / "bin" / "python"
CHECK_VLLM = ROOT / "scripts" / "check_vllm_export.py"
TARGET = "qwen2.5-coder-1.5b"
BAD = ["banana", "0.33", "1.2.3.4", "0.99.0", "0.9.2"]


def scheduled() -> tuple[Recommendation, dict[int, int]]:
    rec = draft_rec()
    rec.model_ref = "qwen2.5-coder-0.5b"
    return rec, {1: rec.gamma, 4: rec.gamma, 16: 1, 32: 0}


def vllm_doc(version: str | None) -> dict:
    rec, schedule = scheduled()
    return json.loads(export(rec, "vllm", schedule=schedule, target=TARGET, vllm_version=version)[1])


def test_the_export_names_the_version_deployed() -> None:
    assert vllm_doc(None)["engine_version"] == VLLM_VERSION  # the default: the version spectune checks against
    assert vllm_doc("0.30.1")["engine_version"] == "0.30.1"
    assert vllm_doc("v0.32.0+cpu")["engine_version"] == "0.32.0+cpu"
    assert vllm_doc(" 0.28.0rc1 ")["engine_version"] == "0.28.0rc1"


def test_a_vllm_with_dynamic_gamma_gets_the_schedule() -> None:
    for version in (VLLM_SCHEDULE_SINCE, VLLM_VERSION):
        config = vllm_doc(version)["speculative_config"]
        assert config["num_speculative_tokens_per_batch_size"] == [[1, 15, 3], [16, 31, 1], [32, 32, 0]]
        assert not any("has no num_speculative_tokens_per_batch_size" in n for n in vllm_doc(version)["notes"])
        # an off range (K 0) still runs vLLM's speculative path: the file says so, as check-export measured it
        assert any("a range with K 0 is not the target alone" in c for c in vllm_doc(version)["comments"])


def test_a_vllm_without_dynamic_gamma_gets_a_fixed_gamma_and_a_note() -> None:
    rec, _ = scheduled()
    doc = vllm_doc("0.23.2")
    config = doc["speculative_config"]
    assert "num_speculative_tokens_per_batch_size" not in config
    assert config["num_speculative_tokens"] == rec.gamma and config["method"] == "draft_model"
    (note,) = [n for n in doc["notes"] if "num_speculative_tokens_per_batch_size" in n]
    assert "vLLM 0.23.2" in note and VLLM_SCHEDULE_SINCE in note and f"fixed γ = {rec.gamma}" in note
    assert not any("num_speculative_tokens_per_batch_size" in c for c in doc.get("comments", []))
    # a γ-by-batch policy: exact where vLLM has the schedule, a fixed K and what is lost where it has not
    policy = BatchSchedule(((1, 4), (8, 2)), 1)
    assert export_policy(rec, policy, "vllm", target=TARGET).exact
    old = export_policy(rec, policy, "vllm", target=TARGET, vllm_version="0.20.0")
    assert not old.exact and old.runs == "K = 4" and "vLLM 0.20.0 has no K by batch size" in old.lost[0]
    assert "num_speculative_tokens_per_batch_size" not in json.loads(old.text)["speculative_config"]


@pytest.mark.parametrize("bad", BAD)
def test_a_malformed_or_unknown_version_is_refused(bad: str) -> None:
    with pytest.raises(SettingsError, match="vLLM"):
        check_vllm_version(bad)
    rec, schedule = scheduled()
    with pytest.raises(SettingsError):
        export(rec, "vllm", schedule=schedule, vllm_version=bad)
    assert export(rec, "sglang", vllm_version=bad)[1]  # only the vLLM file depends on it


def test_the_known_range_is_stated() -> None:
    assert check_vllm_version(VLLM_OLDEST) == VLLM_OLDEST and check_vllm_version(None) == VLLM_VERSION
    with pytest.raises(SettingsError, match=f"newest vLLM it knows is {VLLM_VERSION}"):
        check_vllm_version("0.34.0")
    with pytest.raises(SettingsError, match=f"written for vLLM {VLLM_OLDEST} to {VLLM_VERSION}"):
        check_vllm_version("0.9.2")


@pytest.mark.parametrize("version", [None, VLLM_SCHEDULE_SINCE, "0.20.0"])
def test_vllms_own_check_accepts_the_export(version: str | None, tmp_path: Path) -> None:
    """scripts/check_vllm_export.py reads .venv-check's vLLM (VLLM_VERSION): the checked version's export, and the
    older versions' (fewer keys), pass it."""
    if not CHECK_PYTHON.is_file():
        pytest.fail(f"{CHECK_PYTHON.relative_to(ROOT)} is missing: run `make check-env` (`make test` does it first)")
    path = tmp_path / "vllm.json"
    rec, schedule = scheduled()
    path.write_text(export(rec, "vllm", schedule=schedule, target=TARGET, vllm_version=version)[1])
    result = subprocess.run([str(CHECK_PYTHON), str(CHECK_VLLM), str(path)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"vllm {VLLM_VERSION}" in result.stdout


# --- the command line and the page ----------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    import engine.service.api

    monkeypatch.setattr(engine.service.api, "worker_alive", lambda: None)
    st.cache_data.clear()
    store = open_store(default_database_url())
    sid = store_session(store, {"t5-small": T5["t5-small"]}, verify_cost={1: 1.0, 2: 1.01, 4: 1.02, 8: 1.04})
    yield SimpleNamespace(store=store, home=tmp_path, sid=sid)
    store.close()


def cli(env: SimpleNamespace, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "SPECTUNE_HOME": str(env.home)}
    environ.pop("SPECTUNE_DB_URL", None)
    environ.pop("SPECTUNE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "engine", "recommend", "--session", str(env.sid), *args], cwd=ROOT,
                          env=environ, capture_output=True, text=True, timeout=180)  # fmt: skip


def test_the_cli_writes_the_version_named_and_refuses_a_bad_one(env: SimpleNamespace) -> None:
    ok = cli(env, "--export", "vllm", "--vllm-version", "0.30.0")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["engine_version"] == "0.30.0"
    for bad in ("banana", "0.99.0"):
        result = cli(env, "--export", "vllm", "--vllm-version", bad)
        assert result.returncode in (1, 2), result
        assert result.returncode == 2 and result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: vLLM") and bad in lines[0], result.stderr
        assert "Traceback" not in result.stderr
    saved = env.store.list_recommendations()
    assert [r["payload"]["inputs"].get("vllm_version") for r in saved] == ["0.30.0"]  # the refused ones saved nothing


def vllm_code(at) -> str | None:
    return next((c.value for c in at.code if '"engine": "vllm"' in c.value), None)


def test_the_recommend_page_takes_the_version_and_refuses_a_bad_one(env: SimpleNamespace) -> None:
    at = app_page("pages/5_Recommend.py", {"session": str(env.sid)})
    assert_clean(at)
    assert json.loads(vllm_code(at))["engine_version"] == VLLM_VERSION
    assert at.text_input(key="rec_vllm_version").value == VLLM_VERSION

    at.text_input(key="rec_vllm_version").set_value("0.21.0").run()
    assert_clean(at)
    assert json.loads(vllm_code(at))["engine_version"] == "0.21.0"

    at.text_input(key="rec_vllm_version").set_value("banana").run()
    assert_clean(at)
    errors = unescape_md(texts(at.error))
    assert "export for vLLM" in errors and "'banana' is not a version number" in errors, errors
    assert vllm_code(at) is None  # no vLLM file for a version that is not one
    assert len(at.code) == 4  # the other formats are still exported
    assert "Traceback" not in errors
