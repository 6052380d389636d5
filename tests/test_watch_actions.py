"""What a verdict offers as a file: γ by batch size where speculation costs at the observed load, speculation off
where acceptance collapsed; each in the deployment's export format, read back as check-export reads it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.analysis.export.vllm import vllm_schedule
from engine.analysis.export.vllm_read import read_vllm_export
from engine.analysis.theory import COMPUTE_BOUND, MEMORY_BOUND
from engine.errors import SettingsError
from engine.service.export_check import export_check_spec
from engine.service.watch import deployment_for, record
from engine.service.watch_actions import action_file
from engine.watch.actions import best_gamma, derived_schedule, is_off, schedule_batches
from engine.watch.verdict import COLLAPSED, COSTING, PAYING, Deployment, judge
from engine.watch.window import Window
from foundation.paths import default_database_url
from store import open_store
from tests.test_cli import engine
from tests.test_recommend_surface import store_vllm_session
from tests.test_watch_verdicts import NGRAM
from tests.watch_parts import DRAFT, KNEE_AT_16, ngram_session

KNEE = 16  # KNEE_AT_16's: a verify of batch·(γ+1) rows at or past it is compute-bound


def by_width(batch: int, gamma: int) -> str:
    return COMPUTE_BOUND if batch * (gamma + 1) >= KNEE else MEMORY_BOUND


def test_the_schedule_keeps_the_best_gamma_per_batch_and_drafts_nothing_where_none_pays() -> None:
    dep = Deployment(NGRAM, 4, (0.5, 0.95), by_width)
    assert best_gamma(dep, [0.9], 1.0, 1)[0] == 4  # memory-bound: the most tokens per verify
    assert best_gamma(dep, [0.9], 1.0, 8) == (0, 1.0)  # 8 × 2 rows ≥ the knee even at γ 1: nothing is above 1×
    schedule = derived_schedule(dep, [0.9], 1.0, schedule_batches(6))
    assert schedule == {1: 4, 4: 2, 6: 1, 8: 0}  # at 4, γ 4 verifies 20 rows (compute-bound), γ 2 only 12
    assert not is_off(schedule)
    assert is_off(derived_schedule(dep, [0.05], 1.0, schedule_batches(1)))  # at α 0.05 nothing pays anywhere
    assert schedule_batches(6, [3]) == [1, 2, 3, 4, 6, 8, 16, 32, 64]
    assert schedule_batches(100)[-3:] == [64, 100, 128]  # powers of two up to twice the observed batch


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    store = open_store(default_database_url())
    vllm = store_vllm_session(store)
    store.set_regime(vllm, KNEE_AT_16)
    yield SimpleNamespace(store=store, vllm=vllm, llama=ngram_session(store), home=tmp_path)
    store.close()


def stored(store, sid: int, window: Window, draft: str, gamma: int, engine_seen: str | None = None,
           windows: int = 1) -> tuple[str, dict]:  # fmt: skip
    """`window` judged `windows` times in a row against session `sid` as the watcher judges it: (verdict, figures)."""
    dep = deployment_for(store, sid, draft, gamma)
    window.engine = engine_seen
    earlier: list[float | None] = []
    for _ in range(windows):
        verdict = judge(window, dep, earlier)
        earlier.append(verdict.predicted_speedup)
    return verdict.verdict, json.loads(json.dumps(record(window, verdict, dep)))


def loaded(mal: float, running: float, rates: list[float]) -> Window:
    return Window(0.0, 15.0, num_drafts=100.0, num_draft_tokens=400.0, num_accepted_tokens=(mal - 1) * 100,
                  mean_acceptance_length=mal, per_position_acceptance=rates, requests_running=running,
                  drafting_fraction=1.0)  # fmt: skip


def test_costing_you_at_high_load_offers_a_vllm_schedule_that_check_export_reads(stores) -> None:
    """Four requests in flight past the session's knee: predicted below 1× three windows in a row, so the file is
    γ by batch size at the observed acceptance, exported as vLLM runs it and read back as check-export launches it."""
    verdict, figures = stored(stores.store, stores.vllm, loaded(3.0, 8.0, [0.8, 0.6, 0.5, 0.4]), "ngram", 4,
                              "vllm", windows=3)  # fmt: skip
    assert verdict == COSTING and figures["session"] == stores.vllm and figures["engine"] == "vllm"
    offered = action_file(stores.store, verdict, figures)
    assert offered is not None and offered.fmt == "vllm" and offered.checkable
    config = json.loads(offered.text)["speculative_config"]
    ranges = config["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[0][2] >= 1 and ranges[-1][2] == 0, ranges  # drafts at 1, nothing at 8
    exported = read_vllm_export(offered.text)
    assert vllm_schedule(exported.schedule) == ranges and not exported.off
    spec = export_check_spec(stores.store, stores.vllm, exported)
    assert spec.drafts == ["ngram"] and spec.policies == [exported.policy().spec()]
    assert "γ by batch size" in offered.says


def test_collapsed_offers_speculation_off_naming_what_it_replaces_and_check_export_queues_it(stores) -> None:
    verdict, figures = stored(stores.store, stores.vllm, loaded(1.01, 1.0, [0.01]), "ngram", 4, "vllm")
    assert verdict == COLLAPSED
    offered = action_file(stores.store, verdict, figures)
    assert offered is not None and offered.checkable
    doc = json.loads(offered.text)
    assert doc["speculative_config"] is None and "acceptance collapsed" in doc["reason"]
    assert doc["replaces"]["speculative_config"]["num_speculative_tokens"] == 4
    exported = read_vllm_export(offered.text)
    assert exported.off and (exported.draft, exported.gamma) == ("ngram", 4)
    path = stores.home / "off.json"
    path.write_text(offered.text)
    done = engine("check-export", str(path), "--session", str(stores.vllm), env_home=stores.home)
    assert done.returncode == 0, done.stderr
    queued = int(done.stdout.split()[2].rstrip(":"))
    checked = stores.store.get_session(queued)
    assert checked["drafts"] == ["ngram"] and checked["gammas"] == [4]


def test_a_llamacpp_deployment_gets_its_own_flags_and_a_paying_window_gets_nothing(stores) -> None:
    """llama-server has no γ by batch size: the session measured at v(5) = 2.4 steps, so at α 0.3 only γ 1 pays
    and its file drafts 1; a collapsed window turns it off in llama.cpp's flags."""
    costly = loaded(1.425, 1.0, [0.3, 0.3, 0.3, 0.3])
    verdict, figures = stored(stores.store, stores.llama, costly, DRAFT, 4, "llama.cpp", windows=3)
    assert verdict == COSTING
    offered = action_file(stores.store, verdict, figures)
    assert offered is not None and offered.fmt == "llamacpp" and not offered.checkable
    assert "--spec-ngram-simple-size-m 1" in offered.text and "γ 1 at every batch" in offered.says, offered
    assert figures["action"].startswith("draft γ=1 at batch 1 instead (predicted 1.0")  # the verdict says the same
    verdict, figures = stored(stores.store, stores.llama, loaded(1.0, 1.0, [0.0]), DRAFT, 4)
    offered = action_file(stores.store, verdict, figures)  # the window names no engine: the session's own
    assert verdict == COLLAPSED and offered is not None and offered.fmt == "llamacpp"
    assert "speculation off" in offered.says and "acceptance collapsed" in offered.text
    assert not [line for line in offered.text.splitlines() if line.strip() and not line.startswith("#")]  # no flag
    verdict, figures = stored(stores.store, stores.llama, loaded(4.5, 1.0, [0.95] * 4), DRAFT, 4)
    assert verdict == PAYING and action_file(stores.store, verdict, figures) is None
    assert action_file(stores.store, COLLAPSED, {"verdict": COLLAPSED}) is None  # stored before windows named it


def test_an_off_file_that_names_nothing_it_replaces_is_refused() -> None:
    with pytest.raises(SettingsError, match="names no speculation it replaces"):
        read_vllm_export(json.dumps({"engine": "vllm", "speculative_config": None, "replaces": {"x": 1}}))
    scheduled = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                 "num_speculative_tokens_per_batch_size": [[1, 4, 2]]}  # fmt: skip
    off = {"engine": "vllm", "speculative_config": None, "replaces": {"speculative_config": scheduled}}
    with pytest.raises(SettingsError, match="fixed num_speculative_tokens"):
        read_vllm_export(json.dumps(off))


def test_the_cli_writes_the_offered_file_and_says_how_to_check_it(stores, tmp_path: Path) -> None:
    from engine.service.cli.watch import offer
    from engine.service.watch import Judged

    dep = deployment_for(stores.store, stores.vllm, "ngram", 4)
    window = loaded(1.01, 1.0, [0.01])
    window.engine = "vllm"
    judged = Judged(window, judge(window, dep), 1)
    said: list[str] = []
    assert offer(stores.store, judged, dep, str(tmp_path), said.append) == COLLAPSED
    written = tmp_path / "acceptance-collapsed-vllm-speculative-config.json"
    assert read_vllm_export(written.read_text()).off
    says = action_file(stores.store, COLLAPSED, record(window, judged.verdict, dep)).says
    assert said == [f"  wrote {written}: {says}; measure it first: python -m engine check-export {written} "
                    f"--session {stores.vllm}"]  # fmt: skip
    said.clear()
    assert offer(stores.store, judged, dep, None, said.append) == COLLAPSED  # no folder: said, not written
    assert said[0].startswith("  offered: speculation off") and "--action-dir DIR" in said[0]
    calm = Judged(loaded(1.6, 1.0, [0.4, 0.3, 0.2, 0.1]), judge(loaded(1.6, 1.0, [0.4, 0.3, 0.2, 0.1]), dep), 2)
    assert calm.verdict.verdict == PAYING and offer(stores.store, calm, dep, str(tmp_path), said.append) is None
    done = engine("watch", "--metrics-url", "http://127.0.0.1:9", "--session", str(stores.vllm), "--action-dir",
                  str(tmp_path / "missing"), env_home=stores.home)  # fmt: skip
    assert done.returncode == 2 and "folder does not exist" in done.stderr and "Traceback" not in done.stderr
