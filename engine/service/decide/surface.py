"""The measured speedup surface γ × concurrency of a session measured at several concurrency levels (vLLM).

An engine that batches continuously measures every configuration at each concurrency of the session's sweep,
each against the target alone at the same level, side by side (engine.session.sweep). Here those stored runs
become rows: one cell per configuration, γ and concurrency with its measured speedup and noise verdict, and one
line per configuration and γ saying at which measured concurrency speculation stops paying (speedup ≤ 1). The
Recommend page renders them; nothing here is predicted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.analysis.schedule import off_range_line
from engine.measure.noise import stored_noisy
from engine.service.report.runs import run_concurrency, run_spread
from engine.session.summarise import run_speedup, stored_speedup_flag


@dataclass(frozen=True)
class SurfaceCell:
    """One speculative run: a configuration at one concurrency level, against the baseline at that level."""

    configuration: str  # the draft, its policy when it has one, and the temperature: "ngram T=0"
    gamma: int  # 0 for a policy run (its γ varies step by step)
    concurrency: int
    speedup: float
    verdict: str | None  # engine.measure.noise's verdict on the per-prompt speedups; None when none was stored
    noisy: bool | None  # too noisy to calibrate to (straddling 1×, or widely spread); None when no spread was stored
    flag: str | None = None  # the run's stored bound verdict: why its speedup is impossible (never a choice)

    @property
    def pays(self) -> bool:
        return self.speedup > 1.0


@dataclass(frozen=True)
class StopsPaying:
    """Per configuration and γ: the lowest measured concurrency where the speedup is ≤ 1, or None."""

    configuration: str
    gamma: int
    at: int | None
    highest: int  # the highest concurrency measured
    noisy: bool  # the measurement at `at` is too noisy to tell

    def line(self) -> str:
        name = f"{self.configuration}{f' γ={self.gamma}' if self.gamma else ''}"
        if self.at is None:
            return f"{name}: pays at every level measured (up to {self.highest})"
        return f"{name}: stops paying at concurrency {self.at} (measured{', too noisy to tell' if self.noisy else ''})"


@dataclass(frozen=True)
class Surface:
    """A session's surface: its cells (configuration, γ, concurrency order), levels and where each γ stops paying."""

    session_id: int
    name: str
    levels: list[int]
    cells: list[SurfaceCell]
    stops: list[StopsPaying]


def noise_of(spread: Mapping[str, Any] | None) -> tuple[str | None, bool | None]:
    """A stored spread's verdict and whether it is too noisy to calibrate to (engine.measure.noise.stored_noisy)."""
    if spread is None:
        return None, None
    return str(spread.get("verdict") or "") or None, stored_noisy(spread)


def _temperature(x: Any) -> str:
    try:
        return f"{float(x):g}"
    except (TypeError, ValueError):
        return str(x)


def surface_cells(runs: Sequence[Mapping[str, Any]]) -> list[SurfaceCell]:
    """The speculative runs with a measured speedup as cells; [] when every run was measured at one level."""
    if len({run_concurrency(r) for r in runs}) < 2:
        return []
    cells = []
    for run in runs:
        summary = run.get("summary") or {}
        speedup = run_speedup(run)
        if run.get("kind") == "baseline" or speedup is None or run.get("status", "done") != "done":
            continue
        policy = run.get("policy") or summary.get("policy")
        verdict, noisy = noise_of(run_spread(run))
        how = f" {policy}" if policy else ""
        cells.append(
            SurfaceCell(
                configuration=f"{run.get('draft')}{how} T={_temperature(run.get('temperature'))}",
                gamma=int(run.get("gamma") or 0),
                concurrency=run_concurrency(run),
                speedup=float(speedup),
                verdict=verdict,
                noisy=noisy,
                flag=stored_speedup_flag(run),
            )
        )
    order = {c.configuration: i for i, c in reversed(list(enumerate(cells)))}
    return sorted(cells, key=lambda c: (order[c.configuration], c.gamma, c.concurrency))


def stops_paying(cells: Sequence[SurfaceCell]) -> list[StopsPaying]:
    """Per configuration and γ (in the cells' order), the lowest measured concurrency where speedup ≤ 1 (cells
    whose speedup breaks its bound left out, unless every one does)."""
    groups: dict[tuple[str, int], list[SurfaceCell]] = {}
    for cell in cells:
        groups.setdefault((cell.configuration, cell.gamma), []).append(cell)
    out = []
    for (configuration, gamma), group in groups.items():
        judged = [c for c in group if not c.flag] or group  # an impossible speedup says nothing about paying
        losing = sorted((c for c in judged if not c.pays), key=lambda c: c.concurrency)
        first = losing[0] if losing else None
        out.append(
            StopsPaying(
                configuration,
                gamma,
                first.concurrency if first else None,
                max(c.concurrency for c in judged),
                bool(first and first.noisy),
            )
        )
    return out


def session_surface(store: Any, session_id: int) -> Surface | None:
    """The stored session's surface, or None when it was measured at one concurrency level (or has no run)."""
    session = store.get_session(int(session_id))
    if session is None:
        return None
    runs = store.list_runs(int(session_id))
    cells = surface_cells(runs)
    if not cells:
        return None
    levels = sorted({run_concurrency(r) for r in runs})
    return Surface(
        int(session_id), str(session.get("name") or f"session #{session_id}"), levels, cells, stops_paying(cells)
    )


def surfaces(store: Any, session_ids: Sequence[int]) -> list[Surface]:
    """The surfaces of those sessions that were measured at several concurrency levels, in the order given."""
    found = (session_surface(store, sid) for sid in session_ids)
    return [s for s in found if s is not None]


@dataclass(frozen=True)
class LevelChoice:
    """What a draft's surface measured at one concurrency level: its best fixed γ there (0: none measured pays) and
    that γ's measured speedup."""

    level: int
    gamma: int
    speedup: float
    noisy: bool

    def outcome(self) -> str:
        """'γ=2 (1.15× measured)', or 'off (best 0.95× measured, too noisy to tell)'."""
        noise = ", too noisy to tell" if self.noisy else ""
        if self.gamma:
            return f"γ={self.gamma} ({self.speedup:.2f}× measured{noise})"
        return f"off (best {self.speedup:.2f}× measured{noise})"

    def text(self) -> str:
        return f"{self.level} → {self.outcome()}"


def measured_choices(cells: Sequence[SurfaceCell], draft: str, temperature: float) -> list[LevelChoice]:
    """Per measured level, the draft's fixed γ with the best measured speedup at `temperature` (policy runs left
    out: their γ varies; a speedup that breaks its bound is no measurement to choose by)."""
    configuration = f"{draft} T={_temperature(temperature)}"
    best: dict[int, SurfaceCell] = {}
    for cell in cells:
        if cell.configuration == configuration and cell.gamma > 0 and cell.flag is None:
            if cell.concurrency not in best or cell.speedup > best[cell.concurrency].speedup:
                best[cell.concurrency] = cell
    return [LevelChoice(level, c.gamma if c.pays else 0, c.speedup, bool(c.noisy)) for level, c in sorted(best.items())]


def measured_schedule(predicted: Mapping[int, int], choices: Sequence[LevelChoice], serving: int) -> dict[int, int]:
    """γ per batch size, measured where the surface measured it and predicted elsewhere.

    The serving batch keeps `predicted`'s γ (the headline: one answer at the user's batch). Another measured level
    takes its best measured γ; a batch between two measured levels takes the γ of the level below it (the bucket it
    falls in); a batch past the highest measured level takes the predicted γ, capped at that level's γ (a
    prediction never turns speculation back up where measurement turned it down)."""
    if not choices:
        return dict(predicted)
    measured = {c.level: c.gamma for c in choices}
    levels = sorted(measured)
    out: dict[int, int] = {}
    for b in sorted(set(predicted) | set(levels) | {serving}):
        below = [level for level in levels if level <= b]
        if b == serving:
            out[b] = predicted[b]
        elif b in measured:
            out[b] = measured[b]
        elif not below:
            out[b] = predicted[b]
        elif b < levels[-1]:  # every batch below b was set already: the ascending order
            out[b] = out[below[-1]]
        else:
            out[b] = min(predicted[b], out[levels[-1]])
    return out


def with_measured_schedule(rec: Any, store: Any, session_ids: Sequence[int]) -> None:
    """`rec` (an engine.analysis.recommend Recommendation) with its γ-by-batch schedule read from the sessions'
    measured surfaces where they measured its draft (measured_schedule), and notes saying which batches were
    measured; unchanged when no surface measured the draft at a fixed γ."""
    if rec.off or not rec.schedule or rec.draft_name is None:
        return
    cells = [cell for surface in surfaces(store, session_ids) for cell in surface.cells]
    choices = measured_choices(cells, rec.draft_name, rec.temperature)
    others = [c for c in choices if c.level != rec.batch_size]
    if not others:
        return
    rec.schedule = measured_schedule(rec.schedule, choices, rec.batch_size)
    rec.schedule_measured = [c.level for c in others]
    beyond = max(c.level for c in choices)
    rec.notes.append(
        f"γ by batch size from the measured surface of {rec.draft_name}: concurrency "
        + "; ".join(c.text() for c in others)
        + f"; batch {rec.batch_size} keeps the headline's γ; past {beyond} predicted, capped at "
        f"{beyond}'s γ"
    )
    rec.off_range_speedups = {c.level: c.speedup for c in choices if rec.schedule.get(c.level) == 0}
    if rec.off_range_speedups:  # where it speculates: the headline (predicted) and the measured levels that pay
        on = {c.level: c.speedup for c in others if rec.schedule.get(c.level)} | {rec.batch_size: rec.predicted_speedup}
        rec.notes.append(off_range_line(on, rec.off_range_speedups))
    serving = next((c for c in choices if c.level == rec.batch_size), None)
    if serving is not None and serving.gamma != rec.gamma:
        rec.notes.append(
            f"at concurrency {rec.batch_size} the surface measured {serving.outcome()} "
            f"best among its measured γ; the headline's γ={rec.gamma} is the one model's choice over "
            "every γ (calibrated to those measurements)"
        )
