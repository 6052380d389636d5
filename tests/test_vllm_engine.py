"""vLLM as a session engine, the parts that need no server: the plan at concurrency levels, the configurations'
speculative configs, the dtype chosen per CPU, the settings it refuses, the spec stored and read back, the
registry entry and the CLI's one-line errors. (The servers themselves: tests/test_vllm_server.py and
tests/test_vllm_real.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_suffix_export import suffix_rec

from engine.analysis.export import export
from engine.core.policy import parse_policy
from engine.engines import registry
from engine.engines.vllm.binaries import find_vllm
from engine.engines.vllm.options import VllmOptions
from engine.engines.vllm.runner import choose_dtype, speculative_config
from engine.engines.vllm.server import VllmConfig
from engine.errors import SettingsError
from engine.measure.hardware import cpu_has_bf16
from engine.session.runner import RunKey, plan_runs
from engine.session.spec import SessionSpec

ROOT = Path(__file__).resolve().parents[1]
AVX512_ONLY = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
WITH_BF16 = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


def spec(**kw) -> SessionSpec:
    return SessionSpec(**{"target": "smollm2-135m", "drafts": ["ngram"], "gammas": [2], "engine": "vllm", **kw})


def test_the_plan_measures_every_configuration_at_every_level() -> None:
    plan = plan_runs(spec(temperatures=[0.0, 0.8]), levels=[1, 4])
    assert [k for k in plan if k.kind == "baseline"] == [
        RunKey("none", 0, 0.0), RunKey("none", 0, 0.8), RunKey("none", 0, 0.0, concurrency=4),
        RunKey("none", 0, 0.8, concurrency=4),
    ]  # fmt: skip
    assert RunKey("ngram", 2, 0.8, concurrency=4).baseline() == RunKey("none", 0, 0.8, concurrency=4)
    assert len(plan) == 8 and plan_runs(spec()) == [RunKey("none", 0, 0.0), RunKey("ngram", 2, 0.0)]
    assert RunKey("ngram", 2, 0.0, concurrency=4).label() == "ngram γ=2 T=0 ×4"
    assert "concurrency" not in RunKey("ngram", 2, 0.0).as_dict()


def test_each_configuration_is_the_speculative_config_vllm_takes() -> None:
    assert speculative_config(RunKey("none", 0, 0.0), None) is None
    assert speculative_config(RunKey("ngram:2-4", 3, 0.0), None) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    }  # fmt: skip
    assert speculative_config(RunKey("d", 5, 0.0), "/m/d") == {"method": "draft_model", "model": "/m/d",
                                                                 "num_speculative_tokens": 5}  # fmt: skip
    scheduled = RunKey("ngram", 0, 0.0, parse_policy("batch:1=3,2=1,8=0"), concurrency=2)
    assert speculative_config(scheduled, None) == {  # as the vLLM export writes a schedule (vllm_schedule)
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 7, 1], [8, 8, 0]],
    }  # fmt: skip
    rec = suffix_rec("suffix:16:1.5:0.2:0")  # a session launches exactly what the export writes
    suffix = speculative_config(RunKey("suffix:16:1.5:0.2:0", rec.gamma, 0.0), None)
    assert suffix == json.loads(export(rec, "vllm")[1])["speculative_config"]
    assert suffix == {"method": "suffix", "num_speculative_tokens": rec.gamma, "suffix_decoding_max_tree_depth": 16,
                      "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 1.5,
                      "suffix_decoding_min_token_prob": 0.2}  # fmt: skip
    config = VllmConfig.with_speculation(Path("/m/t"), {"method": "ngram", "num_speculative_tokens": 1})
    flags = config.flags()
    assert flags[flags.index("--speculative-config") + 1] == '{"method":"ngram","num_speculative_tokens":1}'
    assert "--enforce-eager" in flags and "--no-enable-prefix-caching" in flags
    assert VllmConfig.from_json(config.to_json()) == config
    assert config.environment("cpu")["VLLM_CPU_OMP_THREADS_BIND"].startswith("0")
    assert config.environment("cuda") == {}


def test_the_dtype_is_chosen_per_cpu() -> None:
    assert not cpu_has_bf16(AVX512_ONLY) and cpu_has_bf16(WITH_BF16)
    dtype, note = choose_dtype("bfloat16", "cpu", AVX512_ONLY)
    assert dtype == "float32" and "no bf16 instructions" in note
    assert choose_dtype("bfloat16", "cpu", WITH_BF16) == ("bfloat16", None)
    assert choose_dtype("float32", "cpu", WITH_BF16) == ("float32", None)
    assert choose_dtype("bfloat16", "cuda", AVX512_ONLY) == ("bfloat16", None)


def test_what_vllm_sessions_refuse() -> None:
    with pytest.raises(SettingsError, match="fixed γ and γ by batch size"):
        registry.validate(spec(policies=["confidence:0.6:8:0"]))
    registry.validate(spec(gammas=[], policies=["batch:1=3,2=1"]))  # γ by batch size: vLLM runs it
    registry.validate(spec(drafts=["suffix"]))  # suffix decoding: vLLM runs it (Arctic Inference's tree)
    with pytest.raises(SettingsError, match="bad suffix spec 'suffix:x'"):
        registry.validate(spec(drafts=["suffix:x"]))
    with pytest.raises(SettingsError, match="concurrency 0"):
        registry.validate(spec(concurrency=[0, 2]))
    with pytest.raises(SettingsError, match="each level once"):
        registry.validate(spec(concurrency=[2, 2]))
    with pytest.raises(SettingsError, match="one request at a time"):
        registry.concurrency_for("spectune", [1, 2])
    assert registry.concurrency_for("vllm", None) == [1, 2, 4, 8]
    assert registry.concurrency_for("llama.cpp", None) == [1]


def test_the_levels_and_vllm_options_are_stored_and_an_older_row_reads_back_with_defaults() -> None:
    row = spec(concurrency=[1, 2, 8], engine_options=VllmOptions(threads=2, kv_cache_mib=256)).to_row()
    stored = {"threads": 2, "kv_cache_mib": 256, "max_model_len": 4096, "enforce_eager": True}
    assert row["options"]["engine_options"] == stored
    back = SessionSpec.from_row(json.loads(json.dumps(row)))
    assert back.concurrency == [1, 2, 8] and back.engine_options == VllmOptions(threads=2, kv_cache_mib=256)
    del row["options"]["engine_options"]
    row["options"]["vllm"] = stored  # where a row from before engine options kept them
    assert SessionSpec.from_row(row).engine_options == VllmOptions(threads=2, kv_cache_mib=256)
    del row["options"]["concurrency"], row["options"]["vllm"]
    old = SessionSpec.from_row(row)
    assert old.concurrency == [1] and old.engine_options == VllmOptions()
    with pytest.raises(SettingsError, match="vLLM threads = 0"):
        registry.validate(spec(engine_options=VllmOptions(threads=0)))


def test_the_registry_entry_says_vllm_batches_and_names_its_version() -> None:
    entry = registry.get("vllm")
    assert entry.batches and entry.export_format == "vllm" and "vllm" in registry.sweep_cli_choices()
    usable, line = entry.availability()
    assert usable and f"vLLM {find_vllm().version}" in line


def test_a_missing_vllm_is_one_clear_line(tmp_path: Path) -> None:
    env = {"SPECTUNE_VLLM_PYTHON": str(tmp_path / "nope" / "python"), "PATH": "/usr/bin:/bin"}
    code = "from engine.engines import registry; print(registry.get('vllm').availability())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "(False, 'vLLM is not available: vLLM is not installed" in done.stdout and "make setup" in done.stdout
    run = [sys.executable, "-m", "engine", "run", "--engine", "vllm", "--target", "smollm2-135m", "--draft", "ngram",
           "--prompts", str(ROOT / "samples" / "prose.txt"), "--json", str(tmp_path / "o.json")]  # fmt: skip
    failed = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and "vLLM is not installed" in failed.stderr and "Traceback" not in failed.stderr
    bad = subprocess.run([*run[:-2], "--concurrency", "1,x", "--json", "o.json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "comma-separated" in bad.stderr and "Traceback" not in bad.stderr


def test_the_sessions_page_draws_the_gamma_by_concurrency_surface() -> None:
    from app import charts, data
    from app import sessions_view as sv

    def run(draft: str, gamma: int, level: int, speedup: float | None) -> dict:
        kind = "baseline" if draft == "none" else "speculative"
        return {"kind": kind, "draft": draft, "gamma": gamma, "temperature": 0.0, "speedup_measured": speedup,
                "summary": {"concurrency": level}}  # fmt: skip

    runs = [run("none", 0, 1, 1.0), run("none", 0, 4, 1.0), run("ngram", 2, 1, 1.3), run("ngram", 2, 4, 0.95),
            run("ngram", 4, 1, 1.5), run("ngram", 4, 4, 1.1)]  # fmt: skip
    assert data.run_label(runs[3]) == "ngram γ=2 T=0 ×4" and data.run_label(runs[2]) == "ngram γ=2 T=0"
    surface = sv.concurrency_surface(runs)
    assert sorted(zip(surface["γ"], surface["concurrency"], surface["speedup"], strict=True)) == [
        (2, 1, 1.3), (2, 4, 0.95), (4, 1, 1.5), (4, 4, 1.1)]  # fmt: skip
    assert sv.stops_paying(runs) == ["ngram T=0 γ=2: stops paying at concurrency 4 (measured)",
                                        "ngram T=0 γ=4: pays at every level measured (up to 4)"]  # fmt: skip
    assert charts.vega_spec(charts.concurrency_surface(surface))["layer"]
    scheduled = [{"kind": "speculative", "draft": "ngram", "gamma": 0, "temperature": 0.0, "speedup_measured": None,
                  "summary": {"concurrency": n, "policy": "batch:1=3,4=1", "policy_live": {"speedup_measured": x}}}
                 for n, x in ((1, 1.4), (4, 1.05))]  # fmt: skip
    assert sv.stops_paying(runs[:2] + scheduled) == [
        "ngram batch:1=3,4=1 T=0: pays at every level measured (up to 4)"]  # fmt: skip
    assert sv.concurrency_surface(runs[:1] + runs[2:3]).empty  # one level: no surface


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "missing"])
def test_the_run_page_names_the_vllm_version_or_why_it_cannot_run(
    installed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    from engine.engines.vllm import binaries

    monkeypatch.setenv("SPECTUNE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECTUNE_DB_URL", raising=False)
    if not installed:
        monkeypatch.setenv("SPECTUNE_VLLM_PYTHON", str(tmp_path / "no-vllm" / "python"))
    binaries._find.cache_clear()
    at = AppTest.from_file(str(ROOT / "app" / "Home.py"), default_timeout=60)
    at.switch_page("pages/2_Run.py")
    at.run()
    at.radio(key="engine").set_value("vllm").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(str(e.value) for e in [*at.caption, *at.error]).replace("\\", "")
    if installed:
        assert "vLLM 0.32.0 (vllm-cpu, cpu build)" in shown and "each concurrency" in shown
    else:
        assert "vLLM is not available" in shown and "make setup" in shown
        assert any("vLLM is not available" in str(e.value).replace("\\", "") for e in at.error)


def test_a_request_alone_in_flight_gives_the_runs_drafting_step_and_batches_give_none() -> None:
    """vLLM times neither its draft nor its verify apart: a run's whole drafting step, in units of the same
    prompt's target-alone step with one request in flight, is its LoopPoint (the step overhead is fitted to it)."""
    from engine.analysis.step_overhead import LoopPoint
    from engine.core.counters import SpecCounters
    from engine.engines.vllm.runner import VllmRunner
    from engine.session.runner import DecodeContext

    runner = VllmRunner()
    base, fixed, wide = RunKey("none", 0, 0.0), RunKey("ngram", 3, 0.0), RunKey("ngram", 3, 0.0, concurrency=2)
    for index, step_s in ((0, 0.02), (1, 0.04)):
        runner._time_split(base, index, SpecCounters(target_calls=32, emitted=32), 32 * step_s)
        # 12 drafting steps of 3 draft tokens (each twice a target step) and 8 plain steps
        spec_counters = SpecCounters(drafts=12, draft_tokens=36, accepted_tokens=12, target_calls=20, emitted=32)
        runner._time_split(fixed, index, spec_counters, (12 * 2 + 8) * step_s)
        runner._time_split(wide, index, spec_counters, 1.0)  # two in flight: a batch's steps, not one request's
    ctx = DecodeContext(on_step=lambda r: None, should_stop=lambda: False, phase=lambda *a: None)
    points = runner.finish({}, ctx).loop_points
    assert list(points) == [fixed]
    assert points[fixed] == LoopPoint(k=4.0, v=pytest.approx(2.0), steps=24)
