"""Noise: per-prompt speedups from recorded step-time series, their spread and verdict; the machine's load
(other processes' CPU share, other processes on the GPU through a fake NVML) and the busy-machine note; the
stratified prompt sample."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from engine.measure import noise, telemetry, telemetry_cpu
from engine.measure.noise import Spread, busy_note, is_busy, is_noisy, load_summary, ratios, spread_of
from engine.session.sampling import choose, has_categories, sample_indices, session_prompts

TOKENS = 32  # tokens per prompt decode in the recorded series below

# Step times (seconds per decode step) recorded per prompt, baseline and candidate decoded side by side.
# A quiet machine: the candidate is steadily ~1.3× faster on every prompt.
QUIET_BASE = [[0.050] * TOKENS, [0.052] * TOKENS, [0.049] * TOKENS, [0.051] * TOKENS]
QUIET_CAND = [[0.050] * 24, [0.052] * 25, [0.049] * 24, [0.051] * 25]  # fewer steps: accepted draft tokens
# A busy machine: a CPU hog came and went, so some prompts' candidate ran slowed down, others' baseline.
BUSY_BASE = [[0.050] * TOKENS, [0.110] * TOKENS, [0.051] * TOKENS, [0.049] * TOKENS]
BUSY_CAND = [[0.050] * 24, [0.052] * 25, [0.130] * 24, [0.051] * 25]


def rate(step_times: list[float]) -> float:
    return TOKENS / sum(step_times)


def spread_from(base: list[list[float]], cand: list[list[float]]) -> Spread | None:
    return spread_of(ratios([(rate(b), rate(c)) for b, c in zip(base, cand, strict=True)]))


def test_a_steady_speedup_on_a_quiet_machine_is_faster_and_not_noisy() -> None:
    spread = spread_from(QUIET_BASE, QUIET_CAND)
    assert spread is not None and spread.n == 4 and spread.verdict == "faster"
    assert 1.25 < spread.min <= spread.median <= spread.max < 1.36
    assert not is_noisy(spread)


def test_a_wide_spread_from_a_busy_machine_is_flagged() -> None:
    spread = spread_from(BUSY_BASE, BUSY_CAND)
    assert spread is not None and spread.max / spread.min > noise.WIDE_SPREAD
    assert spread.verdict == "too noisy to tell"  # one prompt says 2.8×, another 0.5×
    assert is_noisy(spread)
    # the same wide spread entirely above 1 is too noisy to tell too: never "faster" beside "noisy"
    wide = spread_of([1.1, 1.3, 2.4])
    assert wide is not None and wide.verdict == "too noisy to tell" and is_noisy(wide)


def test_verdicts_at_the_edges() -> None:
    assert spread_of([]) is None and is_noisy(None)
    single = spread_of([1.4])
    assert single is not None and single.verdict == "single measurement" and not is_noisy(single)
    assert spread_of([0.8, 0.9]).verdict == "slower"  # type: ignore[union-attr]
    assert spread_of([0.98, 1.02, 1.01]).verdict == "too noisy to tell"  # type: ignore[union-attr]
    assert ratios([(0.0, 5.0), (5.0, 0.0), (2.0, 3.0)]) == [1.5]  # a rate of 0 gives no ratio
    assert Spread(**spread_of([1.1, 1.2]).to_dict()) == spread_of([1.1, 1.2])  # type: ignore[union-attr]


def test_load_summary_and_the_busy_machine_note() -> None:
    quiet = load_summary([{"other_cpu_pct": v} for v in (2.0, 5.0, 3.0)])
    assert quiet == {"other_cpu_pct_median": 3.0, "other_cpu_pct_max": 5.0, "n": 3}
    assert not is_busy(quiet) and busy_note(quiet) is None
    busy = load_summary([{"other_cpu_pct": v} for v in (40.0, 55.0, 10.0, 70.0)])
    assert busy is not None and busy["other_cpu_pct_median"] == 47.5 and busy["other_cpu_pct_max"] == 70.0
    assert is_busy(busy)
    note = busy_note(busy)
    assert note is not None and "busy machine" in note and "48%" in note and "70%" in note
    gpu = load_summary([{"other_cpu_pct": 1.0, "other_gpu_util_pct": 30.0}, {"other_cpu_pct": 2.0}])
    assert gpu is not None and gpu["other_gpu_util_pct_median"] == 30.0 and is_busy(gpu)
    assert "GPU" in (busy_note(gpu) or "")
    assert load_summary([{}, {}]) is None and not is_busy(None)


def test_other_cpu_share_is_system_cpu_minus_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic counters: over the interval the machine was 60% busy, this process used 10% of it."""
    machine = iter([(100.0, 1000.0), (160.0, 1100.0)])  # (busy, total) CPU seconds summed over the CPUs
    ours = iter([5.0, 15.0])
    monkeypatch.setattr(telemetry_cpu, "_busy_total", lambda: next(machine))  # where OtherCpu looks it up
    monkeypatch.setattr(telemetry.OtherCpu, "_own_seconds", lambda self: next(ours))
    other = telemetry.OtherCpu()
    assert other.read() == {"cpu_util_pct": 60.0, "own_cpu_pct": 10.0, "other_cpu_pct": 50.0}


def test_load_meter_reads_the_real_machine() -> None:
    meter = telemetry.LoadMeter()
    meter.mark()
    sum(i * i for i in range(200_000))  # some CPU of our own
    reading = meter.read()
    assert set(reading) == {"other_cpu_pct"} and 0.0 <= reading["other_cpu_pct"] <= 100.0


def test_load_meter_sums_other_processes_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: "h0")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "Fake GPU")
    monkeypatch.setattr(pynvml, "nvmlGpmQueryDeviceSupport", lambda h: SimpleNamespace(isSupportedDevice=0))
    samples = [SimpleNamespace(pid=os.getpid(), smUtil=80), SimpleNamespace(pid=999_999, smUtil=20),
               SimpleNamespace(pid=999_999, smUtil=40), SimpleNamespace(pid=888_888, smUtil=5)]  # fmt: skip
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", lambda h, since: samples)
    meter = telemetry.LoadMeter(gpu=True)
    reading = meter.read()
    assert reading["other_gpu_util_pct"] == 35.0  # 999999's mean 30 + 888888's 5; our own 80 is not noise
    meter.close()


# ---------------------------------------------------------------------------------------------------------------------
# stratified prompt sample

CATS = ["code"] * 6 + ["prose"] * 3 + ["math"] * 2 + [None]  # a file sorted by category


def test_first_takes_the_first_n_in_file_order() -> None:
    assert sample_indices(CATS, 3, "first") == [0, 1, 2]  # all "code": the other categories left out
    assert sample_indices(CATS, None) == list(range(len(CATS)))
    assert sample_indices(CATS, 99, "stratified") == list(range(len(CATS)))


@pytest.mark.parametrize("n", range(4, len(CATS) + 1))
def test_stratified_covers_every_category(n: int) -> None:
    chosen = sample_indices(CATS, n, "stratified")
    assert len(chosen) == n and chosen == sorted(set(chosen))
    assert {CATS[i] for i in chosen} == set(CATS)  # every category, the uncategorised ones too
    assert chosen == sample_indices(CATS, n, "stratified")  # deterministic


def test_stratified_shares_the_rest_in_proportion_and_keeps_file_order() -> None:
    chosen = sample_indices(CATS, 8, "stratified")
    counts = {c: sum(CATS[i] == c for i in chosen) for c in set(CATS)}
    assert counts == {"code": 4, "prose": 2, "math": 1, None: 1}
    for category in ("code", "prose"):
        mine = [i for i in chosen if CATS[i] == category]
        assert mine == [i for i, c in enumerate(CATS) if c == category][: len(mine)]  # its first ones


def test_stratified_with_fewer_prompts_than_categories_takes_the_largest() -> None:
    assert [CATS[i] for i in sample_indices(CATS, 2, "stratified")] == ["code", "prose"]
    with pytest.raises(ValueError, match="choose one of"):
        sample_indices(CATS, 2, "random")


def test_choose_and_session_prompts_on_stored_rows() -> None:
    rows = [{"id": 10 + i, "text": f"p{i}", "category": c} for i, c in enumerate(CATS)]
    assert has_categories(CATS) and not has_categories(["a", "a", None])
    assert [r["category"] for r in choose(rows, 4, "stratified")] == ["code", "prose", "math", None]

    def get_prompts(set_id: int, limit: int | None = None) -> list[dict]:
        return rows[:limit] if limit is not None else rows

    session = {"prompt_set_id": 1, "n_prompts": 4, "options": {"prompt_sample": "stratified"}}
    assert {r["category"] for r in session_prompts(get_prompts, session)} == set(CATS)
    assert [r["id"] for r in session_prompts(get_prompts, session | {"options": {}})] == [10, 11, 12, 13]
    assert session_prompts(get_prompts, {"prompt_set_id": None}) == []
