"""The measurement floor: a first pass over a prompt's shapes lands on no configuration, every session measures the
target against itself (A/A), and `engine run` judges its speedup as a session does.

The target is wrapped so that its first forward at each new sequence length costs more, as a GPU's first decode of
a prompt runs 1.5–4.5× slower than every later one. Without the untimed prime the baseline, decoded first on every
prompt, paid that cost alone and n-gram "measured" far above what its tokens per call allow.

The sessions here run on model time (ModelClock): the decoder's and the sweep's clock advance only by a fixed cost per
target forward and the costs a test adds, so every ratio they judge is exact whatever else the machine runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.engines import registry
from engine.engines.spectune.options import LoopOptions
from engine.measure.noise import MeasurementFloor, MeasurementOverhead, floor_off, spread_of
from engine.models.pool import ModelPool
from engine.models.tiny import load_tiny
from engine.prompts import load_prompt_file
from engine.session.aa_check import aa_count
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec

ROOT = Path(__file__).resolve().parents[1]
FIRST_PASS_S = 0.02
TARGET = "tiny:1:48:4:256"


FORWARD_S = 0.001  # what one target forward costs on model time


class ModelClock:
    """Time as the decoder and the sweep read it (their time.perf_counter), advanced only by the target's forwards."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    @contextmanager
    def installed(self) -> Iterator[ModelClock]:
        """The decoder and the sweep read this clock inside the block (the rest of `time` as it is)."""
        from engine.core import decoder
        from engine.session import sweep

        patched = SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
        patched.perf_counter = self.perf_counter
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(decoder, "time", patched)
            mp.setattr(sweep, "time", patched)
            yield self


def timed_forwards(
    model, clock: ModelClock, extra: Callable[[int], float] = lambda total: 0.0, cost_s: float = FORWARD_S
):
    """`model` whose every forward costs `cost_s` on `clock`, plus `extra(total length)` seconds."""
    original = model.model.forward

    def forward(*args, **kwargs):
        cache = kwargs.get("cache")
        total = (int(cache.get_seq_length()) if cache is not None else 0) + kwargs["input_ids"].shape[1]
        clock.advance(cost_s + extra(total))
        return original(*args, **kwargs)

    model.model.forward = forward
    return model


def slow_first_pass(model, clock: ModelClock, first_s: float = FIRST_PASS_S):
    """`model` whose forward costs `first_s` more the first time it reaches each sequence length (a shape's
    first-run cost)."""
    seen: set[int] = set()

    def first_pass(total: int) -> float:
        if total in seen:
            return 0.0
        seen.add(total)
        return first_s

    return timed_forwards(model, clock, first_pass)


def prompts(n: int) -> list[PromptText]:
    parsed = load_prompt_file(ROOT / "samples" / "prose.txt").prompts[:n]
    return [PromptText(p.prompt_id, p.text, p.category) for p in parsed]


@pytest.fixture(scope="module")
def slow_sweep():
    """One n-gram session on the slow-first-pass target, as `registry.sweep` runs it."""
    clock = ModelClock()
    pool = ModelPool()
    pool.adopt(slow_first_pass(load_tiny(TARGET, logit_scale=4.0), clock))
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=48, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    with clock.installed():
        return registry.sweep(spec, prompts(6), pool=pool).to_dict()


def test_the_first_pass_lands_on_no_configuration_and_the_floor_is_one(slow_sweep):
    floor = slow_sweep["measurement_floor"]
    assert floor["spread"]["n"] == floor["prompts"] == aa_count(6, 2) == 3  # one rotation: 3 of the 6 prompts
    assert abs(floor["spread"]["median"] - 1.0) <= 0.10, floor["sentence"]
    # every prime paid first passes the later decodes did not: the eager loop primed every prompt, and says so
    assert slow_sweep["first_pass"]["primed"] == 6 and not slow_sweep["first_pass"]["settled"]
    assert sorted(slow_sweep["first_pass"]["first_over_later"])[3] > 1.5  # a later prompt reaches fewer new lengths
    assert any("every prompt was primed" in note for note in slow_sweep["notes"])
    run = slow_sweep["runs"][0]
    # the whole run's speedup at most its tokens per call (and 10% of noise): before the prime it read 5.9× at 1.58
    assert run["speedup_whole_run"] <= run["tokens_per_call"] * 1.10, run
    assert run["speedup_measured"] <= run["tokens_per_call"] * 1.10, run


def test_no_decode_records_top_logits_and_the_target_top_is_asked_only_at_a_divergence(monkeypatch):
    """No decode records top logits, the prime included: the timed baseline and its A/A twin do the same work. The
    target's top is asked for once where a greedy output leaves the baseline's, at that position, and the verdict
    reads its margin there; an output that never diverges asks for nothing."""
    from engine.engines.spectune import runner as spectune

    asked: list[int] = []
    decode = spectune.decode_prompt

    def spy(target, source, ids, cfg, **kwargs):
        asked.append(cfg.record_top_logits)
        return decode(target, source, ids, cfg, **kwargs)

    monkeypatch.setattr(spectune, "decode_prompt", spy)
    tops: list[tuple[int, int]] = []
    reference_at = spectune.SpectuneRunner.reference_at

    def asked_top(self, index, prefix):
        tops.append((index, len(prefix)))
        return reference_at(self, index, prefix)

    monkeypatch.setattr(spectune.SpectuneRunner, "reference_at", asked_top)
    decode_one = spectune.SpectuneRunner.decode

    def one_token_off(self, key, index, ctx, reference):  # prompt 1's n-gram output leaves the target's at token 5
        decoded = decode_one(self, key, index, ctx, reference)
        if key.kind != "baseline" and index == 1:
            decoded.output.token_ids[5] = (decoded.output.token_ids[5] + 1) % 256
        return decoded

    monkeypatch.setattr(spectune.SpectuneRunner, "decode", one_token_off)
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=12, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    report = registry.sweep(spec, prompts(3), pool=ModelPool()).to_dict()
    assert set(asked) == {0}
    assert tops == [(1, 5)]
    verdicts = report["runs"][0]["divergences"]
    assert [d["identical"] for d in verdicts] == [True, False, True]
    off = verdicts[1]
    assert off["position"] == 5 and off["verdict"] == "bug" and off["margin"] > off["tolerance"], off
    assert report["measurement_overhead"]["reference_s"] > 0


def test_the_target_top_after_a_prefix_is_what_the_target_decodes_next():
    """reference_at reads the target's logits after the prompt and a prefix of its own greedy output: its best token
    is the one the target decoded there, at every position."""
    from engine.engines.spectune import runner as spectune

    runner = spectune.SpectuneRunner(ModelPool())
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=10, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    plan = registry.get(spec.engine).plan(spec, registry.levels_of(spec))
    ctx = spectune.DecodeContext(on_step=lambda r: None, should_stop=lambda: False, phase=lambda *a: None)
    runner.start(spec, prompts(1), plan, ctx)
    try:
        baseline = next(key for key in plan if key.kind == "baseline")
        output = runner.decode(baseline, 0, ctx, reference=True).output.token_ids
        for pos, token in enumerate(output):
            top = runner.reference_at(0, output[:pos])
            assert top is not None and top.ids[0] == token and top.values == sorted(top.values, reverse=True)
    finally:
        runner.stop()


@pytest.mark.parametrize("n_prompts", [3, 8])
def test_a_floor_outside_its_noise_band_marks_every_speedup_too_noisy(monkeypatch, n_prompts):
    """Without the prime the baseline pays the first pass alone: target ÷ target reads far above 1, and the
    session says so instead of offering a speedup, whether the A/A check covers every prompt or a subset."""
    from engine.engines.spectune.runner import SpectuneRunner

    monkeypatch.setattr(SpectuneRunner, "prime", lambda self, index, ctx: None)
    report = _slow_session(n_prompts)
    assert report["measurement_floor"]["prompts"] == aa_count(n_prompts, 2) == 3  # all 3, or 3 of 8
    _assert_caught(report)


def test_a_short_prime_leaves_a_shape_cost_the_floor_catches(monkeypatch):
    """The compiled loop's shapes are static, so its prime decodes only a few tokens. On a loop whose every new
    length costs a first pass (this test model's), those few tokens leave the cost on the timed decodes, and the A/A
    floor, on its subset of the prompts, catches it."""
    from engine.engines.spectune import runner as spectune

    prime = spectune.SpectuneRunner.prime

    def as_compiled(self, index, ctx):
        loop, self.loop = self.loop, spectune.LoopChoice("compiled", "the short prime under test")
        try:
            prime(self, index, ctx)
        finally:
            self.loop = loop

    monkeypatch.setattr(spectune.SpectuneRunner, "prime", as_compiled)
    report = _slow_session(8)
    assert report["measurement_floor"]["prompts"] == aa_count(8, 2) == 3
    _assert_caught(report)


def _slow_session(n_prompts: int) -> dict:
    clock = ModelClock()
    pool = ModelPool()
    pool.adopt(slow_first_pass(load_tiny(TARGET, logit_scale=4.0), clock, first_s=0.05))
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=24, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    with clock.installed():
        return registry.sweep(spec, prompts(n_prompts), pool=pool).to_dict()


def _assert_caught(report: dict) -> None:
    assert report["measurement_floor"]["holds"] is False
    assert floor_off(report["measurement_floor"])
    assert "it does not hold" in report["measurement_floor"]["sentence"]
    assert report["measurement_floor"]["sentence"] in report["notes"]
    run = report["runs"][0]
    assert run["speedup_noisy"] is True
    assert run["speedup_spread"]["verdict"] == "too noisy to tell"


def test_the_floor_holds_within_its_band_and_reads_back():
    assert MeasurementFloor((0.97, 1.02, 1.01)).holds
    assert MeasurementFloor((1.03, 1.05)).holds  # within 5% of 1
    assert not MeasurementFloor((1.2, 1.3, 1.25)).holds
    assert not MeasurementFloor((0.9, 1.25, 1.3)).holds  # 1 inside its own spread is not enough: median 1.25
    wide = MeasurementFloor((0.17, 1.07, 7.16, 1.0, 0.9, 1.1))  # the walk's floor: median 1.03, 42× apart
    assert not wide.holds and "landed up to 42.12× apart" in wide.sentence()
    assert not MeasurementFloor((0.74, 1.0, 1.51)).holds  # 2.04× apart
    assert MeasurementFloor((0.95, 1.0, 1.3)).holds  # 1.37× apart, median 1.00
    assert "over 3 prompts, 6 A/A pairs" in MeasurementFloor((1.0,) * 6, 3).sentence()
    stored = MeasurementFloor((1.2, 1.3)).to_dict()
    assert MeasurementFloor.from_dict(stored) == MeasurementFloor((1.2, 1.3))
    assert not floor_off(None)


def test_a_wide_spread_is_never_called_faster():
    spread = spread_of([1.1, 1.9, 1.3])
    assert spread is not None and spread.verdict == "too noisy to tell"
    assert spread_of([1.1, 1.2]).verdict == "faster"


def test_engine_run_judges_its_speedup_as_a_session_does(tmp_path):
    """`run` prints the verdict word beside the speedup, the bound check and the floor; its JSON carries them."""
    out = tmp_path / "run.json"
    env_home = tmp_path / "home"
    env_home.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "engine", "run", "--target", "tiny:1", "--draft", "ngram", "--prompts",
         str(ROOT / "samples" / "prose.txt"), "--max-prompts", "3", "--gamma", "3", "--max-new-tokens", "16",
         "--dtype", "float32", "--loop", "eager", "--threads", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "SPECTUNE_HOME": str(env_home)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    flat = json.loads(out.read_text())
    assert flat["measurement_floor"]["spread"]["n"] == 3
    assert flat["loop"] == "eager" and flat["threads"] == 1
    assert "speedup_flag" in flat
    words = "too noisy to tell" if flat["speedup_noisy"] else flat["speedup_measured_spread"]["verdict"]
    assert words in done.stdout
    assert "Measurement floor (target ÷ target, A/A)" in done.stdout
    if flat["speedup_noisy"]:
        assert "faster" not in done.stdout.split("measured")[1].split(")")[0]


def test_a_slow_first_decode_after_the_prime_cancels(monkeypatch):
    """Whatever the first timed decode after a prompt's prime still pays lands on each configuration in turn, the
    baseline and the A/A decode included: the floor stays at 1.00 and no speedup is inflated by it. While the
    baseline always decoded first it paid this alone: the A/A read about 0.5× and n-gram about twice its speed."""
    from engine.engines.spectune.runner import SpectuneRunner

    state = {"armed": False, "priming": False, "forwards": 0}
    prime = SpectuneRunner.prime

    def primed(self, index, ctx):
        state["priming"] = True
        try:
            prime(self, index, ctx)
        finally:
            state.update(priming=False, armed=True, forwards=0)

    monkeypatch.setattr(SpectuneRunner, "prime", primed)

    def first_timed_step(total: int) -> float:
        if state["armed"] and not state["priming"]:
            state["forwards"] += 1
            if state["forwards"] == 2:  # the first decoding step after the prefill, inside the timed decode
                state["armed"] = False
                return 0.06
        return 0.0

    clock = ModelClock()
    pool = ModelPool()
    pool.adopt(timed_forwards(load_tiny(TARGET, logit_scale=4.0), clock, first_timed_step))
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=32, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    with clock.installed():
        report = registry.sweep(spec, prompts(9), pool=pool).to_dict()
    floor = report["measurement_floor"]
    assert floor["prompts"] == aa_count(9, 2) == 3  # the A/A check's subset: one rotation of three
    assert abs(floor["spread"]["median"] - 1.0) <= 0.10, floor["sentence"]
    run = report["runs"][0]
    assert run["speedup_measured"] <= run["tokens_per_call"] * 1.10, run
    assert all(d is not None for d in run["divergences"]), "every output judged, its baseline decoded before or after"


def test_what_measuring_costs_is_measured_and_said(slow_sweep):
    """The primes and the A/A decodes are timed beside the configurations' decodes; the share is said in words and
    a quick session adds its sweeps up."""
    from engine.measure.noise import MeasurementOverhead
    from engine.session.quick import merged_overhead

    overhead = MeasurementOverhead.from_dict(slow_sweep["measurement_overhead"])
    assert overhead is not None and overhead.prime_s > 0 and overhead.aa_s > 0 and overhead.decoding_s > 0
    # this target's prime pays every first pass (a cost at each new length): the cost lands on the prime
    assert (
        overhead.prime_s > overhead.aa_s and overhead.share == (overhead.prime_s + overhead.aa_s) / overhead.decoding_s
    )
    assert slow_sweep["measurement_overhead"]["sentence"].startswith(f"Measuring cost {overhead.share:.0%}")
    assert "more than the 25% aimed at" in MeasurementOverhead(1.0, 1.0, 4.0).sentence()
    assert "aimed at" not in MeasurementOverhead(0.5, 0.5, 8.0).sentence()
    twice = MeasurementOverhead.from_dict(merged_overhead(slow_sweep["measurement_overhead"],
                                                          slow_sweep["measurement_overhead"]))  # fmt: skip
    assert twice is not None and abs(twice.share - overhead.share) < 1e-3 and twice.decoding_s > overhead.decoding_s


def test_the_measuring_cost_sentence_shows_short_parts_to_a_tenth_of_a_second() -> None:
    short = MeasurementOverhead(prime_s=0.2, aa_s=0.3, decoding_s=0.75).sentence()
    assert short == ("Measuring cost 67% on top of decoding (the prime 0.2 s, the A/A check 0.3 s, the configurations' "
                     "decodes 0.8 s); more than the 25% aimed at.")  # fmt: skip
    assert "(the prime 12 s, the A/A check 9.0 s, the configurations' decodes 68 s)" in str(
        MeasurementOverhead(prime_s=12.0, aa_s=9.0, decoding_s=68.0).sentence())  # fmt: skip
