"""One window of a watched deployment: counter deltas over W seconds and the figures derived from them.

A window is the difference of two readings of a server's cumulative counters (or, from a Prometheus server, the
increase it computed). Figures use vLLM's names: num_drafts, num_draft_tokens, num_accepted_tokens (and per
position), mean acceptance length, draft acceptance rate. A window whose counters went down (the server restarted
in between) is in state "reset" and carries no figures; a window without a draft is "idle". Per-position counts
that do not add up to the accepted tokens are left out (the single α stands in for them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from engine.serving.load import Load
from engine.serving.metrics import ServerCounters

OK, RESET, IDLE, DOWN, MALFORMED = "ok", "reset", "idle", "source down", "malformed"
STATES = (OK, RESET, IDLE, DOWN, MALFORMED)


@dataclass(frozen=True)
class Reading:
    """A server's cumulative counters and load at one moment (unix seconds)."""

    at: float
    counters: ServerCounters
    load: Load


@dataclass
class Window:
    """The figures of one window, or the state that kept it from having any."""

    start: float
    end: float
    state: str = OK
    message: str = ""
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    num_accepted_tokens_per_pos: dict[int, float] = field(default_factory=dict)
    emitted_tokens: float | None = None
    mean_acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    per_position_acceptance: list[float] | None = None
    drafting_fraction: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    time_per_output_token_s: float | None = None  # mean seconds per output token over the window (engine's own)
    engine: str | None = None  # the engine whose counters these are (engine.serving.metrics.PREFIXES), when one

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def figures(self) -> dict[str, Any]:
        """The window's figures as JSON-ready values (per-position keys as strings)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("start", "end", "state", "message")}
        out["num_accepted_tokens_per_pos"] = {str(p): v for p, v in sorted(self.num_accepted_tokens_per_pos.items())}
        return out


def _went_down(delta: ServerCounters, emitted: float | None) -> list[str]:
    """The counters that decreased in a delta (a restarted server counts from zero again)."""
    names = {
        "num_drafts": delta.drafts,
        "num_draft_tokens": delta.draft_tokens,
        "num_accepted_tokens": delta.accepted_tokens,
        "verify_calls": delta.verify_calls,
        "emitted_tokens": emitted,
    }
    down = [name for name, v in names.items() if v is not None and v < 0]
    if any(v < 0 for v in delta.accepted_per_position.values()):
        down.append("num_accepted_tokens_per_pos")
    return down


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else None


def _positions_agree(delta: ServerCounters) -> bool:
    """Whether the per-position counts add up to the accepted tokens (within 10 %). They do not where a series was
    first seen inside the window (Prometheus' increase() does not count a series' first value)."""
    accepted = delta.accepted_tokens or 0.0
    return abs(sum(delta.accepted_per_position.values()) - accepted) <= 0.1 * accepted + 1.0


def window_of(
    start: float,
    end: float,
    delta: ServerCounters,
    emitted: float | None = None,
    running: float | None = None,
    waiting: float | None = None,
    reset: bool = False,
    tpot_s: float | None = None,
) -> Window:
    """A window from counter deltas (`emitted`: tokens emitted in it; `running`, `waiting`: mean gauges; `tpot_s`:
    its time per output token)."""
    down = _went_down(delta, emitted)
    if reset or down:
        why = f"counters went down ({', '.join(down)})" if down else "counters were reset"
        return Window(
            start,
            end,
            RESET,
            f"{why}: the server restarted; this window has no figures",
            requests_running=running,
            requests_waiting=waiting,
        )
    if delta.accepted_per_position and not _positions_agree(delta):
        delta = replace(delta, accepted_per_position={})
    w = Window(
        start,
        end,
        num_drafts=delta.drafts,
        num_draft_tokens=delta.draft_tokens,
        num_accepted_tokens=delta.accepted_tokens,
        num_accepted_tokens_per_pos=dict(delta.accepted_per_position),
        emitted_tokens=emitted,
        mean_acceptance_length=delta.mean_acceptance_length(),
        draft_acceptance_rate=delta.draft_acceptance_rate(),
        per_position_acceptance=delta.per_position_acceptance(),
        requests_running=running,
        requests_waiting=waiting,
        time_per_output_token_s=tpot_s,
        engine=next(iter(delta.engines)) if len(delta.engines) == 1 else None,
    )
    if emitted and delta.drafts:
        w.drafting_fraction = delta.as_spec(int(round(emitted))).drafting_fraction()
    if w.mean_acceptance_length is None:
        w.state, w.message = IDLE, "no drafts proposed in this window"
    return w


def window_between(before: Reading, after: Reading, loads: list[Load] | None = None) -> Window:
    """The window between two readings of one server; `loads`: the gauges read within it (their mean is kept)."""
    gauges = [before.load, after.load] if loads is None else loads
    emitted = None
    if after.load.emitted is not None:
        emitted = after.load.emitted - (before.load.emitted or 0.0)
    return window_of(
        before.at,
        after.at,
        after.counters.minus(before.counters),
        emitted,
        _mean([g.running for g in gauges]),
        _mean([g.waiting for g in gauges]),
        tpot_s=tpot_between(before.load, after.load),
    )


def tpot_between(before: Load, after: Load) -> float | None:
    """The mean time per output token between two readings (None: not exposed, or nothing finished between)."""
    if None in (before.tpot_seconds, before.tpot_count, after.tpot_seconds, after.tpot_count):
        return None
    count = float(after.tpot_count) - float(before.tpot_count)  # type: ignore[arg-type]
    seconds = float(after.tpot_seconds) - float(before.tpot_seconds)  # type: ignore[arg-type]
    return seconds / count if count > 0 and seconds >= 0 else None


def failed_window(start: float, end: float, state: str, message: str) -> Window:
    """A window the source could not fill: the source down, or an answer that was not what was asked for."""
    return Window(start, end, state, message)
