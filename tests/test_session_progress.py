"""The progress bar and the time left as the worker stores them (engine.service.worker.store_hooks), over a session
of two
sweeps: a quick session's probe, then a confirmation smaller than the decodes reserved for it."""

from __future__ import annotations

from typing import Any

import pytest

from engine.service.worker import progress as session_progress
from engine.service.worker.store_hooks import StoreHooks

DECODE_S = 2.0  # every decode takes this long on the fake clock
PROMPTS = 3


class Recording:
    """The store calls the hooks make for progress and phases, kept in order."""

    def __init__(self) -> None:
        self.bars: list[tuple[int, int]] = []
        self.phases: list[dict[str, Any]] = []

    def set_progress(self, session_id: int, done: int, total: int) -> None:
        self.bars.append((done, total))

    def set_phase(self, session_id: int, phase: dict[str, Any]) -> None:
        self.phases.append(phase)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def sweep(hooks: StoreHooks, clock: Clock, per_prompt: int) -> None:
    """What engine.session.sweep tells the hooks: each prompt primed, then each configuration decoded, its own
    time left (elapsed ÷ done × left, over this sweep alone) with each decode's phase."""
    total, done, started = PROMPTS * per_prompt, 0, clock.t
    hooks.progress(0, total)
    for index in range(PROMPTS):
        hooks.phase(f"priming prompt {index + 1} of {PROMPTS}", done, total, None)
        clock.t += DECODE_S
        for _ in range(per_prompt):
            eta = (clock.t - started) / done * (total - done) if done else None
            hooks.phase(f"decoding prompt {index + 1} of {PROMPTS}", done, total, eta)
            clock.t += DECODE_S
            done += 1
            hooks.progress(done, total)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(session_progress, "_now", fake)
    return fake


def quick_session(clock: Clock) -> Recording:
    """A probe of 4 decodes a prompt, 7 a prompt reserved for the confirmation, which needs 3."""
    store = Recording()
    hooks = StoreHooks(store, 1, "w")
    hooks.reserve(PROMPTS * 7)
    hooks.phase("loading models", 0, 1, None)
    clock.t += 30.0
    sweep(hooks, clock, per_prompt=4)
    hooks.phase("predicting the grid from the probe", 0, 1, None)
    clock.t += 5.0
    hooks.next_sweep()
    sweep(hooks, clock, per_prompt=3)
    hooks.all_decoded()
    return store


def test_the_total_is_what_was_planned_from_start_to_end(clock: Clock) -> None:
    bars = quick_session(clock).bars
    planned = PROMPTS * (4 + 7)
    assert {total for _, total in bars} == {planned}, bars  # never 21 + 12 → 12 + 9
    assert bars[-1] == (planned, planned)  # the decodes the confirmation did not need count as done
    assert all(later[0] >= earlier[0] for earlier, later in zip(bars, bars[1:], strict=False)), bars


def test_the_time_left_counts_down_across_the_sweeps(clock: Clock) -> None:
    phases = quick_session(clock).phases
    decoding = [p for p in phases if p["name"].startswith(("decoding", "priming"))]
    etas = [p["eta_s"] for p in decoding if p["eta_s"] is not None]
    assert len(etas) == 2 * (1 + 4) + PROMPTS * (1 + 3)  # from the second prompt's prime on: a whole prompt paces it
    assert all(later <= earlier for earlier, later in zip(etas, etas[1:], strict=False)), etas
    # the session's pace (a prime and 4 decodes: 5 × DECODE_S a prompt) times the decodes left, the reserve included
    assert etas[0] == pytest.approx(5 * DECODE_S / 4 * (PROMPTS * 11 - 4))
    assert all(isinstance(p["at"], float) for p in phases)  # the pages count down from when it was said


def test_a_quick_session_through_the_worker_keeps_the_total_it_planned(tmp_path: Any) -> None:
    """A real quick session (tiny models, SQLite): every total the bar showed is the one planned when it was queued,
    and it ends full."""
    from test_quick_session import PROMPTS as TEXTS
    from test_quick_session import run, spec

    from engine.service.sizing.estimate import planned_decodes
    from store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'spectune.db'}")
    bars: list[tuple[int, int]] = []
    recorded = store.set_progress

    def set_progress(session_id: int, done: int, total: int) -> None:
        bars.append((done, total))
        recorded(session_id, done, total)

    store.set_progress = set_progress  # type: ignore[method-assign]
    settings = spec()
    try:
        sid = run(store, settings)
        planned = planned_decodes(settings, len(TEXTS))
        assert {total for _, total in bars} == {planned}, bars
        session = store.get_session(sid)
        assert session["progress_done"] == session["progress_total"] == planned
    finally:
        store.close()
