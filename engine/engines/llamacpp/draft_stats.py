"""The draft's own time inside llama-server's speculative loop, read from the statistics the server logs.

At log verbosity 4 llama-server logs, after each request, one line per speculative implementation, counted over
the server's life:

    statistics     draft-simple: #calls(b,g,a) =    2      9      9, …, dur(b,g,a) = 0.099, 472.881, 0.009 ms

b counts the requests that began drafting, g the drafting calls and its duration the draft's generation time in
milliseconds (its forwards and its sampling). A request's share is the difference across it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

_LINE = re.compile(
    r"statistics\s+draft-simple: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?"
    r"dur\(b,g,a\) =\s*([\d.]+),\s*([\d.]+),\s*([\d.]+) ms"
)
LOG_VERBOSITY = ("-lv", "4")  # the level at which llama-server logs these statistics
TAIL_BYTES = 8192  # how much of the log's end to read for them (a request logs a few lines after its statistics)


@dataclass(frozen=True)
class DraftStats:
    """Cumulative over a server's life: requests that drafted, drafting calls, their generation time (ms)."""

    requests: int = 0
    calls: int = 0
    ms: float = 0.0

    def minus(self, before: DraftStats) -> DraftStats:
        if self.requests < before.requests:  # a restarted server counts from zero again
            return self
        return DraftStats(self.requests - before.requests, self.calls - before.calls, self.ms - before.ms)


def last_stats(log_text: str) -> DraftStats | None:
    """The last draft-simple statistics line in this log text, or None when it has none."""
    matches = list(_LINE.finditer(log_text))
    if not matches:
        return None
    match = matches[-1]
    return DraftStats(requests=int(match[1]), calls=int(match[2]), ms=float(match[5]))


def after_request(read_log: Callable[[], str], before: DraftStats, timeout_s: float = 2.0) -> DraftStats | None:
    """The statistics once the request just made has been counted (the server logs them as it releases the slot,
    from its logging thread); None when they did not appear in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = last_stats(read_log())
        if now is not None and now.requests != before.requests:  # counted, or a restarted server counting anew
            return now
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
