"""The live view's cache: the steps and samples read from the store between reruns, and the frame it draws."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app import data
from app.run_view.live import live_numbers
from engine.service.api import (
    compared_baseline,
    draft_acceptance_rate,
    tokens_per_call,
)

CHART_EVERY_S = 3.0  # charts are rebuilt at most this often, and only when new steps or samples arrived

UTIL_POINTS = 300  # utilisation samples kept per metric for the chart

NO_CHART = (
    "Per-position acceptance appears once a speculative run logs steps (an engine that logs only each request's "
    "totals gives it, where it counts by position, when the run finishes).",
    "Utilisation appears once the worker samples the device.",
)


def _totals_numbers(totals: Mapping[str, Any] | None) -> dict[str, Any]:
    """run_progress-style rates from summed step columns."""
    if not totals:
        return {"steps": 0}
    busy = totals["draft_time_s"] + totals["verify_time_s"]
    return {
        "steps": totals["steps"],
        "tokens_per_s": totals["emitted"] / busy if busy > 0 else None,
        "draft_acceptance_rate": draft_acceptance_rate(totals["proposed"], totals["accepted"]),
        "tokens_per_call": tokens_per_call(totals["emitted"], totals["target_calls"]),
    }


@dataclass
class LiveFrame:
    """What one refresh of the live view draws; ``charts_rebuilt`` says whether the charts are new."""

    session: Mapping[str, Any] | None
    runs: list[Mapping[str, Any]]
    current: Mapping[str, Any] | None
    baseline: Mapping[str, Any] | None
    now: dict[str, Any]
    base: dict[str, Any]
    positions_spec: dict[str, Any] | None
    util_spec: dict[str, Any] | None
    latest: tuple[Mapping[str, Any], Mapping[str, Any]] | None
    other_cpu_pct: float | None
    charts_rebuilt: bool


class LiveCache:
    """A session's live view state kept between refreshes (one per browser tab, in st.session_state).

    Each refresh reads ``store.live_version`` (a few small queries). Only what changed is read again: the
    session row when its state changed, the runs when one started or finished, the steps logged since the
    last refresh (summed per run, so old steps are never re-read), the newest output when there is a new one,
    utilisation samples since the last one. Charts are rebuilt, as ready-to-send Vega-Lite specs, only when
    new steps or samples arrived and at most every ``chart_every_s``; otherwise the cached specs are sent again.
    """

    def __init__(self, session_id: int, chart_every_s: float = CHART_EVERY_S) -> None:
        self.session_id = session_id
        self.chart_every_s = chart_every_s
        self.version: Any = None
        self.session: dict[str, Any] | None = None
        self._state_key: Any = None
        self.runs: list[dict[str, Any]] = []
        self._runs_key: Any = None
        self.after_step_id: int | None = None  # the newest of this session's steps summed so far
        self._newest_seen: int | None = None
        self.totals: dict[int, dict[str, Any]] = {}
        self.histogram: dict[int, dict[tuple[int, int], int]] = {}
        self.last_run_id: int | None = None
        self._outputs_seen = -1
        self.latest_output: dict[str, Any] | None = None
        self.samples: list[dict[str, Any]] = []
        self._samples_t: float | None = None
        self._charts_at: float | None = None
        self._steps_key = 0  # steps summed so far: the charts change when it does
        self._charted: Any = None
        self.positions_spec: dict[str, Any] | None = None
        self.util_spec: dict[str, Any] | None = None
        self.chart_builds = 0  # how many times the charts were rebuilt (the tests count it)

    def refresh(self, store: Any, now: float) -> LiveFrame:
        version = store.live_version(self.session_id, count_steps=False)  # steps are summed here, not counted
        self.version = version["version"]
        state_key = version["version"][1]
        if state_key != self._state_key or self.session is None:
            self.session = store.get_session(self.session_id)
            self._state_key = state_key
        runs_key = (version["runs"], version["runs_done"])
        if runs_key != self._runs_key:
            self.runs = store.list_runs(self.session_id)
            self._runs_key = runs_key
        newest = version["newest_step_id"]  # moves when any session logs a step: then read what is ours
        if newest is not None and newest != self._newest_seen:
            self._add_steps(store.step_totals_since(self.session_id, self.after_step_id))
            self._newest_seen = newest
        if version["outputs"] != self._outputs_seen:
            self.latest_output = store.latest_output(self.session_id) if version["outputs"] else None
            self._outputs_seen = version["outputs"]
        rebuilt = self._maybe_rebuild_charts(store, now, version["data_version"])
        return self._frame(rebuilt)

    def _add_steps(self, new: Mapping[str, Any]) -> None:
        for run_id, totals in new["runs"].items():
            mine = self.totals.setdefault(run_id, dict.fromkeys(totals, 0))
            for key, value in totals.items():
                mine[key] += value
        for run_id, rows in new["histogram"].items():
            counts = self.histogram.setdefault(run_id, {})
            for gamma, accepted, n in rows:
                counts[(gamma, accepted)] = counts.get((gamma, accepted), 0) + n
        if new["last_run_id"] is not None:
            self.last_run_id = new["last_run_id"]
        self.after_step_id = new["max_step_id"]
        self._steps_key = sum(t["steps"] for t in self.totals.values())

    def _maybe_rebuild_charts(self, store: Any, now: float, data_version: Any) -> bool:
        same_run = self._charted is not None and self._charted[3] == self.current_run_id()
        if same_run and self._charts_at is not None and now - self._charts_at < self.chart_every_s:
            return False  # a new current run is charted at once: the chart is always of the run beside it
        new_samples = store.utilisation_series(self.session_id, since_t=self._samples_t, max_points=UTIL_POINTS)
        if new_samples:
            self.samples = _thin([*self.samples, *new_samples], UTIL_POINTS)
            self._samples_t = float(new_samples[-1]["t"])
        key = (self._steps_key, data_version[3:], self._samples_t, self.current_run_id())
        if key == self._charted:
            self._charts_at = now  # nothing new: look again after chart_every_s
            return False
        from app import charts

        current = self.current_run()
        positions = None
        if current is not None and current.get("kind") == "speculative":
            positions = live_positions(store, current, self.histogram.get(current["id"], {}))
        self.positions_spec = (
            charts.vega_spec(charts.acceptance_by_position(positions))
            if positions is not None and not positions.empty
            else None
        )
        util = data.utilisation_long(self.samples)
        self.util_spec = charts.vega_spec(charts.utilisation(util)) if not util.empty else None
        self._charted, self._charts_at = key, now
        self.chart_builds += 1
        return True

    def current_run_id(self) -> int | None:
        current = self.current_run()
        return current["id"] if current is not None else None

    def current_run(self) -> Mapping[str, Any] | None:
        """The run that logged the newest step (every run is open at once in an interleaved sweep), else the
        last run that logged one or finished; None before any run has logged a step."""
        by_id = {r["id"]: r for r in self.runs}
        if self.last_run_id in by_id:
            return by_id[self.last_run_id]
        started = [r for r in self.runs if r["id"] in self.totals or r.get("status") == "done"]
        return started[-1] if started else None  # none before a run logs its first step

    def _frame(self, rebuilt: bool) -> LiveFrame:
        current = self.current_run()
        baseline = compared_baseline(self.runs, current)

        def numbers(run: Mapping[str, Any] | None) -> dict[str, Any]:
            if run is None:
                return {}
            final = run.get("status") == "done" and current is not None and current.get("status") == "done"
            return live_numbers(run, _totals_numbers(self.totals.get(run["id"])), final)

        latest = None
        if self.latest_output is not None:
            run = next((r for r in self.runs if r["id"] == self.latest_output.get("run_id")), None)
            latest = (run, self.latest_output) if run is not None else None
        other = next(
            (s["metrics"].get("other_cpu_pct") for s in reversed(self.samples) if "other_cpu_pct" in s["metrics"]),
            None,
        )
        return LiveFrame(
            session=self.session,
            runs=self.runs,
            current=current,
            baseline=baseline,
            now=numbers(current),
            base=numbers(baseline),
            positions_spec=self.positions_spec,
            util_spec=self.util_spec,
            latest=latest,
            other_cpu_pct=other,
            charts_rebuilt=rebuilt,
        )


def live_positions(store: Any, run: Mapping[str, Any], counts: Mapping[tuple[int, int], int]) -> Any:
    """The per-position chart's frame, in the convention of engine.core.counters' glossary (the conditional rate:
    accepted at p ÷ drafts that reached p) from the run's single steps; where the engine logs only a request's
    totals (no step says which position was accepted), the per-position rates the finished run was stored with.
    Never more positions than the run drafts in a step (its γ; a policy: its widest draft)."""
    rows = store.positions_from_histogram([(g, a, n) for (g, a), n in counts.items()])
    if not rows and run.get("status") == "done":
        rows = [
            {"position": p, "rate": rate, "evaluated": None}
            for p, rate in enumerate(run.get("per_position_acceptance") or [])
        ]
    top = data.most_drafted(run)
    return data.positions_frame([r for r in rows if not top or int(r["position"]) < top])


def _thin(samples: list[dict[str, Any]], per_source: int) -> list[dict[str, Any]]:
    """At most about ``per_source`` samples per source, evenly kept (every other one, as often as needed)."""
    while True:
        counts: dict[Any, int] = {}
        for s in samples:
            counts[s.get("source")] = counts.get(s.get("source"), 0) + 1
        if not counts or max(counts.values()) <= per_source:
            return samples
        samples = samples[::2] if len(counts) == 1 else _halve_by_source(samples)


def _halve_by_source(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[Any, int] = {}
    kept = []
    for s in samples:
        n = seen.get(s.get("source"), 0)
        seen[s.get("source")] = n + 1
        if n % 2 == 0:
            kept.append(s)
    return kept


def live_cache(state: Any, session_id: int) -> LiveCache:
    """The tab's LiveCache for this session (a new one when the tab watches another session)."""
    cache = state.get("run_live_cache")
    if not isinstance(cache, LiveCache) or cache.session_id != session_id:
        cache = LiveCache(session_id)
        state["run_live_cache"] = cache
    return cache
