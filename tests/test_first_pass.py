"""The eager loop's prime is measured: it stops once a prompt's first pass is shown to cost no more than a later one,
and a first-pass cost that shows up after that lands on the A/A floor."""

from __future__ import annotations

import pytest

from engine.engines import registry
from engine.engines.spectune.options import LoopOptions
from engine.measure.first_pass import FIRST_PASS_PROMPTS, FIRST_PASS_TOLERANCE, FirstPass
from engine.models.pool import ModelPool
from engine.models.tiny import load_tiny
from engine.session.aa_check import aa_prompts
from engine.session.spec import SessionSpec
from tests.test_measurement_floor import TARGET, ModelClock, _assert_caught, prompts, timed_forwards


def _measured(pairs: list[tuple[float, float]]) -> FirstPass:
    seen = FirstPass()
    for index, (first, later) in enumerate(pairs):
        assert seen.needs_prime()
        seen.primed(index, first)
        seen.timed(index, later)
    return seen


def test_the_prime_stops_only_once_the_median_first_pass_costs_nothing() -> None:
    assert FIRST_PASS_PROMPTS == 3
    assert _measured([(10.0, 10.0), (10.2, 10.0)]).needs_prime()  # two prompts are not yet enough
    settled = _measured([(10.0, 10.0), (10.2, 10.0), (9.9, 10.0)])
    assert not settled.needs_prime() and settled.settled
    assert settled.sentence(10).startswith(
        "Primed 3 of 10 prompts: a prompt's first pass took 1.00× (0.99–1.02×, 3 prompts) the time of a later one"
    )
    assert "the rest decoded unprimed" in str(settled.sentence(10))
    outlier = _measured([(10.0, 10.0), (16.0, 10.0), (10.1, 10.0)])  # one slow outlier: the median is 1.01
    assert not outlier.needs_prime()
    costly = _measured([(14.0, 10.0), (13.0, 10.0), (10.0, 10.0), (10.0, 10.0)])  # median 1.15 over four
    assert costly.needs_prime() and "every prompt was primed" in str(costly.sentence(4))
    edge = 1.0 + FIRST_PASS_TOLERANCE
    assert not _measured([(edge * 10, 10.0)] * 3).needs_prime()
    assert _measured([(edge * 10 + 0.01, 10.0)] * 3).needs_prime()


def test_only_a_primed_prompts_first_timing_counts() -> None:
    seen = FirstPass()
    seen.timed(0, 10.0)  # no prime: nothing to compare
    assert seen.ratios == {} and seen.sentence(3) is None
    seen.primed(1, 12.0)
    seen.timed(1, 10.0)
    seen.timed(1, 6.0)  # a second timing of the same prompt (another temperature) does not replace the first
    assert seen.ratios == {1: pytest.approx(1.2)}
    assert seen.to_dict(3) == {"primed": 1, "prompts": 3, "settled": False, "first_over_later": [1.2]}


def _session(model, n_prompts: int, clock: ModelClock) -> dict:
    pool = ModelPool()
    pool.adopt(model)
    spec = SessionSpec(target=TARGET, drafts=["ngram"], gammas=[3], max_new_tokens=24, dtype="float32",
                       device="cpu", chat_template=False, engine_options=LoopOptions("eager"))  # fmt: skip
    with clock.installed():
        return registry.sweep(spec, prompts(n_prompts), pool=pool).to_dict()


def test_the_session_primes_as_its_own_first_passes_measured():
    """On a loop with no first-pass cost (every forward costs the same on model time), the first three prompts'
    first pass costs what a later one does: the prime stops there, the rest decode unprimed, and the report and its
    notes say so."""
    clock = ModelClock()
    report = _session(timed_forwards(load_tiny(TARGET, logit_scale=4.0), clock), 7, clock)
    seen = report["first_pass"]
    assert (seen["prompts"], seen["primed"], seen["settled"]) == (7, FIRST_PASS_PROMPTS, True)
    assert seen["first_over_later"] == pytest.approx([1.0] * FIRST_PASS_PROMPTS)
    assert any("the rest decoded unprimed" in note for note in report["notes"])
    assert report["measurement_overhead"]["prime_s"] > 0


def test_a_first_pass_cost_after_the_prime_stopped_lands_on_the_floor(monkeypatch):
    """The prime stops after three prompts (on model time their first pass costs what a later one does); then every
    new length starts to cost a first pass. The unprimed prompts the A/A check covers carry that cost onto
    the baseline or its twin, and the floor does not hold."""
    from engine.engines.spectune.runner import SpectuneRunner

    state = {"primes": 0}
    prime = SpectuneRunner.prime

    def counted(self, index, ctx):
        prime(self, index, ctx)
        state["primes"] = len(self.first_pass.prime_ms)

    monkeypatch.setattr(SpectuneRunner, "prime", counted)
    seen: set[int] = set()

    def first_pass_after_the_prime(total: int) -> float:  # from the fourth prompt on: each length not reached before
        if state["primes"] >= FIRST_PASS_PROMPTS and total not in seen:
            seen.add(total)
            return 0.05
        return 0.0

    clock = ModelClock()
    model = timed_forwards(load_tiny(TARGET, logit_scale=4.0), clock, first_pass_after_the_prime)
    assert [i for i in aa_prompts([None] * 8, 2) if i >= FIRST_PASS_PROMPTS]  # the check covers unprimed prompts
    report = _session(model, 8, clock)
    assert report["first_pass"]["primed"] == FIRST_PASS_PROMPTS and report["first_pass"]["settled"]
    _assert_caught(report)


def test_the_session_page_and_report_read_the_stored_record_as_the_session_said_it() -> None:
    """The loop note the Sessions page and the report show carries the same sentence, from the stored record."""
    from engine.service.report.measurement_notes import loop_note

    seen = _measured([(10.0, 10.0), (10.2, 10.0), (9.9, 10.0)])
    stored = seen.to_dict(12)
    summary = {"loop": "eager", "loop_basis": "as set", "first_pass": stored}
    note = loop_note(summary)
    assert note is not None and note.startswith("Decoded in the eager loop (as set). Primed 3 of 12 prompts:")
    assert note.endswith(str(seen.sentence(12)))
    assert loop_note({"loop": "compiled", "first_pass": None}) == "Decoded in the compiled loop (as set)."
