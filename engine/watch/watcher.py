"""The watch loop: one Window per W seconds from a source, a down source or a malformed answer as a state.

A /metrics source is read `polls` times a window (its gauges averaged, its counters differenced between the
window's first and last reading); a Prometheus source is asked once a window for the increases over it. A read
that fails gives a window in state "source down" (or "malformed"), never an exception: the loop goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from engine.serving.load import Load
from engine.serving.transport import EndpointError
from engine.watch.prometheus import PrometheusSource
from engine.watch.scrape import MetricsSource
from engine.watch.window import DOWN, MALFORMED, Reading, Window, failed_window, window_between

MALFORMED_KINDS = frozenset({"metrics_malformed", "malformed"})


def failed(start: float, end: float, exc: EndpointError) -> Window:
    """The window a failed read leaves: malformed when the answer was not what was asked for, else source down."""
    return failed_window(start, end, MALFORMED if exc.kind in MALFORMED_KINDS else DOWN, str(exc))


def _try_read(source: MetricsSource) -> Reading | EndpointError:
    try:
        return source.read()
    except EndpointError as exc:
        return exc


def metrics_windows(
    source: MetricsSource,
    seconds: float,
    count: int | None,
    polls: int = 5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Iterator[Window]:
    """Windows of `seconds` from a /metrics source (`count` None: until the caller stops)."""
    base = _try_read(source)
    start = clock()
    done = 0
    while count is None or done < count:
        loads: list[Load] = [base.load] if isinstance(base, Reading) else []
        last: Reading | EndpointError = base
        for i in range(1, max(polls, 1) + 1):
            sleep(max(start + seconds * i / max(polls, 1) - clock(), 0.0))
            last = _try_read(source)
            if isinstance(last, Reading):
                loads.append(last.load)
        end = clock()
        if isinstance(last, EndpointError):
            yield failed(start, end, last)
        elif isinstance(base, EndpointError):
            yield failed_window(start, end, DOWN, f"{source.where} answers again; the next window counts from here")
        else:
            yield window_between(base, last, loads)
        base, start, done = last, end, done + 1


def prometheus_windows(
    source: PrometheusSource,
    seconds: float,
    count: int | None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Iterator[Window]:
    """Windows of `seconds` from a Prometheus server, each asked for once it has passed."""
    done = 0
    start = clock()
    while count is None or done < count:
        sleep(max(start + seconds - clock(), 0.0))
        end = clock()
        try:
            up = source.targets_up(end)
            if up is None:
                yield failed_window(start, end, DOWN, f"{source.url} scrapes no target that matches: nothing to watch")
            elif up < 1:
                yield failed_window(start, end, DOWN, f"{source.url}: the deployment's scrape target is down")
            else:
                yield source.window(seconds, end)
        except EndpointError as exc:
            yield failed(start, end, exc)
        start, done = end, done + 1
