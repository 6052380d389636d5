"""γ by batch size from a vLLM session's measured surface, exported, read back and queued as the check session that
launches it (the real vLLM launch of that session is tests/test_vllm_real.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.analysis.export.vllm import vllm_schedule
from engine.analysis.export.vllm_read import read_vllm_export
from engine.errors import SettingsError
from engine.service.decide.recommendations import recommend_and_export
from engine.service.decide.surface import LevelChoice, measured_schedule
from engine.service.export_check import export_check_rows, export_check_spec
from engine.session.spec import SessionSpec
from foundation.paths import default_database_url
from store import open_store
from tests.test_cli import engine
from tests.test_recommend_surface import store_vllm_session

# per γ, per level: γ=4 is best alone, γ=2 at two in flight, and nothing pays at four
MEASURED = {2: {1: [1.25, 1.30, 1.35], 2: [1.10, 1.15, 1.20], 4: [0.90, 0.95, 0.97]},
            4: {1: [1.45, 1.50, 1.55], 2: [1.02, 1.05, 1.08], 4: [0.85, 0.88, 0.92]}}  # fmt: skip


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    yield SimpleNamespace(store=store, sid=store_vllm_session(store, MEASURED), home=tmp_path)
    store.close()


def test_measured_levels_set_the_schedule_and_predictions_fill_the_rest() -> None:
    predicted = {1: 4, 3: 4, 2: 4, 8: 3, 16: 2, 32: 1}
    choices = [LevelChoice(1, 4, 1.5, False), LevelChoice(2, 2, 1.15, False), LevelChoice(4, 0, 0.95, True)]
    # batch 1 keeps the headline; 2 and 4 as measured; 3 is in 2's bucket; past 4 never above 4's γ (off)
    assert measured_schedule(predicted, choices, 1) == {1: 4, 2: 2, 3: 2, 4: 0, 8: 0, 16: 0, 32: 0}
    # the serving batch keeps the headline's γ even where the surface measured another
    assert measured_schedule(predicted, choices, 2) == {1: 4, 2: 4, 3: 4, 4: 0, 8: 0, 16: 0, 32: 0}
    capped = [LevelChoice(1, 4, 1.5, False), LevelChoice(2, 3, 1.2, False)]
    assert measured_schedule(predicted, capped, 1) == {1: 4, 2: 3, 3: 3, 8: 3, 16: 2, 32: 1}
    assert measured_schedule(predicted, [], 1) == predicted


def test_a_vllm_surface_is_exported_as_gamma_by_batch_size_and_reads_back(env: SimpleNamespace) -> None:
    result = recommend_and_export(env.store, [env.sid], formats=("vllm",), engine="vllm")
    rec = result.recommendation
    assert rec.draft_name == "ngram" and rec.gamma >= 1
    assert rec.schedule_measured == [2, 4]
    assert rec.schedule[1] == rec.gamma and rec.schedule[2] == 2 and rec.schedule[4] == 0
    assert all(g == 0 for b, g in rec.schedule.items() if b > 4)  # a prediction never turns it back on
    assert any("measured surface of ngram" in n and "2 → γ=2 (1.15× measured)" in n for n in rec.notes)
    text = result.files["vllm"][1]
    config = json.loads(text)["speculative_config"]
    assert config["num_speculative_tokens_per_batch_size"] == vllm_schedule(rec.schedule)
    exported = read_vllm_export(text)
    assert (exported.draft, exported.gamma) == ("ngram", rec.gamma)
    assert vllm_schedule(exported.schedule) == config["num_speculative_tokens_per_batch_size"]  # as launched
    spec = export_check_spec(env.store, env.sid, exported)
    confirmed = store_vllm_session(env.store, MEASURED, mode="full", confirm=True)  # a source that confirmed
    assert not export_check_spec(env.store, confirmed, exported).confirm  # the check runs the file, nothing else
    assert (spec.engine, spec.drafts, spec.gammas, spec.concurrency) == ("vllm", ["ngram"], [rec.gamma], [1, 2, 4])
    assert spec.policies == [exported.policy().spec()] and spec.mode == "full"


def test_check_export_queues_the_file_as_exported_and_refuses_what_it_cannot_check(env: SimpleNamespace) -> None:
    path = env.home / "vllm.json"
    path.write_text(recommend_and_export(env.store, [env.sid], formats=("vllm",), engine="vllm").files["vllm"][1])
    done = engine("check-export", str(path), "--session", str(env.sid), env_home=env.home)
    assert done.returncode == 0, done.stderr
    queued = int(done.stdout.split()[2].rstrip(":"))
    stored = SessionSpec.from_row(env.store.get_session(queued))
    assert stored.policies and stored.policies[0].startswith("batch:1=") and stored.concurrency == [1, 2, 4]
    assert env.store.get_session(queued)["prompt_set_id"] == env.store.get_session(env.sid)["prompt_set_id"]
    off = env.home / "off.json"
    off.write_text(json.dumps({"engine": "vllm", "speculative_config": None}))
    bad = {"not json": "{", "off": off.read_text(), "llama.cpp": json.dumps({"engine": "llama.cpp"}),
           "gap": json.dumps({"engine": "vllm", "speculative_config": {
               "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
               "num_speculative_tokens_per_batch_size": [[1, 1, 3], [3, 8, 1]]}})}  # fmt: skip
    for why, text in bad.items():
        path.write_text(text)
        refused = engine("check-export", str(path), "--session", str(env.sid), env_home=env.home)
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, (why, refused.stderr)
    with pytest.raises(SettingsError, match="nothing to measure"):
        read_vllm_export(off.read_text())
    assert len(env.store.list_sessions()) == 2  # nothing queued by a refused file, nothing lost


def test_a_finished_check_reads_back_per_level(env: SimpleNamespace) -> None:
    rows = export_check_rows(env.store, env.sid)  # the surface session itself: its fixed γ runs, no schedule
    assert [r.level for r in rows] == [1, 2, 4]
    assert all(r.baseline_tokens_per_s and r.fixed and r.schedule is None for r in rows)
    # without a schedule the fixed γ is set against the target alone: nothing pays at four requests in flight
    assert [r.winner().removesuffix(" (inside the noise)") for r in rows] == ["fixed γ", "fixed γ", "target alone"]
