"""A Prometheus server's HTTP API as a watch source: PromQL increases of the engine's counters over a window.

Queries go to /api/v1/query (instant queries at the window's end); the JSON answer is parsed by json. The counter
names are engine.serving.metrics' (with Prometheus' `_total` suffix) and engine.serving.load's; only the names the
server holds are asked for. A window with a counter reset (Prometheus' resets()) is in state "reset".
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from engine.serving.load import EMITTED, RUNNING, TPOT, WAITING
from engine.serving.metrics import COUNTERS, PER_POSITION, PREFIXES, ServerCounters
from engine.serving.transport import Connection, EndpointError
from engine.watch.window import Window, window_of

_PREFIXES = "|".join(PREFIXES)
_SELECTOR = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"\\]*"\s*,?\s*)*$')


class PrometheusSource:
    """A Prometheus server under `url`; `match`: label matchers that pick the deployment (e.g. job="llama")."""

    def __init__(
        self, url: str, match: str = "", timeout_s: float = 5.0, clock: Callable[[], float] = time.time
    ) -> None:
        if match and not _SELECTOR.match(match):
            raise ValueError(f'match {match!r}: write label matchers such as job="llama"')
        self.url = url.rstrip("/")
        self.match = match.strip().rstrip(",")
        self.conn = Connection(self.url, None, timeout_s)
        self.clock = clock

    def _query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """The vector an instant query answers; EndpointError for an error answer or one not shaped as asked."""
        try:
            answer = self.conn.get_json("/api/v1/query?" + urlencode({"query": promql, "time": f"{at:.3f}"}))
        except EndpointError as exc:
            if exc.status in (404, 405):
                raise EndpointError("malformed", f"{self.url} has no Prometheus query API ({exc})", exc.status) from exc
            raise
        if not isinstance(answer, dict) or answer.get("status") != "success":
            said = answer.get("error") if isinstance(answer, dict) else None
            raise EndpointError("malformed", f"{self.url} did not answer the query {promql!r}: {said or answer!r}")
        data = answer.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise EndpointError("malformed", f"{self.url} answered {promql!r} with no vector")
        return data["result"]

    def _value(self, sample: dict[str, Any]) -> float:
        try:
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EndpointError("malformed", f"{self.url} answered a sample without a value: {sample!r}") from exc
        return value

    def _sum(self, promql: str, at: float) -> float | None:
        result = self._query(promql, at)
        values = [v for s in result if math.isfinite(v := self._value(s))]
        return sum(values) if values else None

    def _sel(self, name: str) -> str:
        return f"{name}{{{self.match}}}" if self.match else name

    def names(self, at: float) -> set[str]:
        """The engine metric names the server holds for this deployment."""
        matchers = f'__name__=~"({_PREFIXES}).*"' + (f",{self.match}" if self.match else "")
        result = self._query(f"count by (__name__) ({{{matchers}}})", at)
        return {str(s.get("metric", {}).get("__name__")) for s in result if isinstance(s, dict)}

    def positions(self, at: float | None = None) -> int | None:
        """How many draft positions the deployment's servers count acceptance at (their γ, as far as they have
        drafted); None where they count none yet."""
        at = self.clock() if at is None else at
        counted: set[int] = set()
        for name in PER_POSITION:
            for sample in self._query(f"count by (position) ({self._sel(name + '_total')})", at):
                try:
                    counted.add(int(sample["metric"]["position"]))
                except (KeyError, TypeError, ValueError):
                    continue
        return max(counted) + 1 if counted else None

    def targets_up(self, at: float) -> float | None:
        """How many of the deployment's scrape targets are up (None: Prometheus scrapes none that match)."""
        result = self._query(self._sel("up"), at)
        return sum(self._value(s) for s in result) if result else None

    def window(self, seconds: float, end: float | None = None) -> Window:
        """The window of `seconds` ending at `end` (default now)."""
        end = self.clock() if end is None else end
        start, span = end - seconds, f"{max(int(round(seconds)), 1)}s"
        held = self.names(end)
        delta, reset = ServerCounters(), False
        delta.engines = {engine for prefix, engine in PREFIXES.items() if any(n.startswith(prefix) for n in held)}
        for base, field in COUNTERS.items():
            name = base + "_total"
            if name not in held:
                continue
            setattr(delta, field, self._sum(f"sum(increase({self._sel(name)}[{span}]))", end))
            reset = reset or bool(self._sum(f"sum(resets({self._sel(name)}[{span}]))", end))
        for base in PER_POSITION:
            if base + "_total" in held:
                q = f"sum by (position) (increase({self._sel(base + '_total')}[{span}]))"
                for s in self._query(q, end):
                    try:
                        delta.accepted_per_position[int(s["metric"]["position"])] = self._value(s)
                    except (KeyError, TypeError, ValueError):
                        continue
        emitted = self._total([n + "_total" for n in EMITTED if n + "_total" in held], "increase", span, end)
        running = self._total([n for n in RUNNING if n in held], "avg_over_time", span, end)
        waiting = self._total([n for n in WAITING if n in held], "avg_over_time", span, end)
        return window_of(start, end, delta, emitted, running, waiting, reset, self._tpot(held, span, end))

    def _tpot(self, held: set[str], span: str, at: float) -> float | None:
        """The mean time per output token over the window, from the engine's (seconds, count) pair."""
        for seconds, count in TPOT:
            if seconds in held and count in held:
                took = self._sum(f"sum(increase({self._sel(seconds)}[{span}]))", at)
                tokens = self._sum(f"sum(increase({self._sel(count)}[{span}]))", at)
                if took is not None and tokens:
                    return took / tokens
        return None

    def _total(self, names: list[str], fn: str, span: str, at: float) -> float | None:
        values = [v for n in names if (v := self._sum(f"sum({fn}({self._sel(n)}[{span}]))", at)) is not None]
        return sum(values) if values else None

    def close(self) -> None:
        self.conn.close()
