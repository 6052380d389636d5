"""A session sized to a time budget: its plan cut, step by step, until its estimate fits, each cut said with why.

The time is the estimate's (engine.service.sizing.estimate): a pace in seconds per configuration × prompt × new
token, from
the newest comparable finished session here, else from a probe of the target alone (its load once on top, and every
prompt decode charged: each configuration's, the A/A check's, a confirmation's at its most). When the
plan does not fit, it is cut in this order, each step only while it still does not fit:

1. the batch sweep after the session (it is not on the way to a recommendation);
2. new tokens per prompt down to SOFT_TOKENS, then prompts down to SOFT_PROMPTS (still stratified by category);
3. γs, the widest first, while one fewer makes fewer runs (a full session: each γ is a run of every prompt);
4. drafts, the last named first, keeping one;
5. new tokens down to MIN_TOKENS, then prompts down to MIN_PROMPTS.

After a cut of γs or drafts, new tokens and prompts grow back as far as the budget allows (never above the plan's).
Nothing is guessed: with no pace known, the plan is kept as it is and the sentence says to probe.

A session keeps its budget (SessionSpec.time_budget_s); once it is done, budget_outcome says whether its wall time,
from its start to its end, kept within it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from engine.engines import registry
from engine.errors import SettingsError
from engine.service.sizing.estimate import pace
from engine.service.sizing.pace_probe import PaceProbe, latest
from engine.service.sizing.plan import planned_configurations, planned_decodes
from engine.session.estimates import batch_sweep_eta_s
from engine.session.spec import SessionSpec

DEFAULT_BUDGET_S = 600.0  # on a machine without a GPU
SOFT_TOKENS, SOFT_PROMPTS = 32, 6  # a quick session's figures that reached a confirmed recommendation in ≈3 min
MIN_TOKENS, MIN_PROMPTS = 16, 1  # the fewest the plan is cut to
TOKEN_STEP = 8  # new tokens are cut to a multiple of this
MAX_BUDGET_S = 7 * 24 * 3600.0
_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)")
PROBE_HINT = "probe its pace (the Run page's Probe, or `submit --estimate --probe`) to size it"


def parse_budget(text: str | None) -> float | None:
    """Seconds from '600s', '10m', '1.5h'; None for nothing, 'none' or 'off'; SettingsError for anything else."""
    said = (text or "").strip().lower()
    if said in ("", "none", "off"):
        return None
    match = _DURATION.fullmatch(said)
    if match is None:
        raise SettingsError(f"time budget '{text}': a duration such as 600s, 10m or 1.5h (or none)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 1 <= seconds <= MAX_BUDGET_S:
        raise SettingsError(f"time budget '{text}': from 1 s to 7 days")
    return seconds


def default_budget(hardware: Mapping[str, Any]) -> float | None:
    """DEFAULT_BUDGET_S on a machine without a GPU (engine.measure.hardware's description), else none."""
    return DEFAULT_BUDGET_S if hardware.get("kind", "cpu") == "cpu" else None


def minutes(seconds: float) -> str:
    """'10 min', '45 s', '1.5 h': a duration as a budget is said."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class Pace:
    """What a plan's time is charged at: `token_s` per configuration × prompt × new token (a probe's: per prompt
    decode × new token), `setup_s` once (a probe's load), `step_s` one decode step of the target alone (the batch
    sweep's unit; None: not known apart)."""

    token_s: float
    setup_s: float = 0.0
    step_s: float | None = None
    source: str = ""
    probed: bool = False  # a probe's: every prompt decode is charged (estimate.probe_seconds), not each run


def pace_from(
    sessions: Sequence[Mapping[str, Any]], spec: SessionSpec, hardware: str, probe: PaceProbe | None
) -> Pace | None:
    """The pace the estimate uses: the newest comparable finished session's (its batch sweep inside its wall
    time), else the probe's; None when neither is known."""
    if (rate := pace(sessions, spec, hardware)) is not None:
        return Pace(rate[0], source=rate[1])
    if probe is None:
        return None
    return Pace(probe.token_s, probe.setup_s, probe.token_s, f"from {probe.describe()}", probed=True)


@dataclass(frozen=True)
class Cut:
    """One thing the sizing cut: what, as it was and as it is, the seconds that saves, and why it could go."""

    what: str
    before: str
    after: str
    saved_s: float
    why: str = ""

    def sentence(self) -> str:
        why = f"{self.why}; " if self.why else ""
        return f"{self.what} {self.before} → {self.after} ({why}saves about {minutes(self.saved_s)})"


@dataclass(frozen=True)
class SizedPlan:
    """The spec and prompt count to run, the time they take at `pace`, and what was cut from the plan asked for."""

    spec: SessionSpec
    n_prompts: int
    budget_s: float | None
    seconds: float | None
    pace: Pace | None
    cuts: tuple[Cut, ...] = ()
    fitted: bool = True  # cut to fit; False: the plan kept as given, the budget only warns

    @property
    def over(self) -> bool:
        """Whether the plan's estimate exceeds its budget (False when either is unknown)."""
        return self.budget_s is not None and self.seconds is not None and self.seconds > self.budget_s

    def sentences(self) -> list[str]:
        """What the sizing did, in words: nothing to do, the cuts, or that the pace is unknown or still over."""
        if self.budget_s is None:
            return []
        budget = minutes(self.budget_s)
        if self.pace is None or self.seconds is None:
            return [
                f"No pace is known for this target, engine and dtype on this machine: the plan is not sized to "
                f"the {budget} budget; {PROBE_HINT}."
            ]
        took = f"about {minutes(self.seconds)} ({self.pace.source})"
        if self.over and not self.fitted:
            return [f"{(self.warning() or '').rstrip('.')} ({self.pace.source})."]
        if self.over:
            return [
                *self._cut_lines(budget),
                f"Over the {budget} budget: the plan takes {took}, even cut to the "
                "fewest prompts and tokens; a larger budget or a faster engine would fit it.",
            ]
        if not self.cuts:
            return [f"Fits the {budget} budget: {took}."]
        return [*self._cut_lines(budget), f"The plan now takes {took}; widen any of it, the budget then only warns."]

    def _cut_lines(self, budget: str) -> list[str]:
        return (
            [f"Sized to the {budget} budget: " + "; ".join(c.sentence() for c in self.cuts) + "."] if self.cuts else []
        )

    def warning(self) -> str | None:
        """One line before the session starts when its estimate exceeds its budget, else None."""
        if not self.over:
            return None
        took, budget = minutes(self.seconds or 0), minutes(self.budget_s or 0)
        return f"This session's estimate, about {took}, exceeds its {budget} budget."


def plan_seconds(spec: SessionSpec, n_prompts: int, at: Pace) -> float:
    """The estimate's time for the plan (its configurations × prompts × new tokens at the pace, or a probe's every
    prompt decode, the setup once), with the batch sweep where it runs and its step is known."""
    seconds = at.setup_s + at.token_s * _decodes(spec, n_prompts, at) * spec.max_new_tokens
    return seconds + _sweep_s(spec, at)


def _decodes(spec: SessionSpec, n_prompts: int, at: Pace) -> int:
    """The prompt decodes whose new tokens are charged: each configuration's, or at a probe's pace every prompt
    decode the progress bar counts."""
    configurations = planned_configurations(spec) * n_prompts
    return (planned_decodes(spec, n_prompts) or configurations) if at.probed else configurations


def _sweep_s(spec: SessionSpec, at: Pace) -> float:
    if not (spec.detect_regime and registry.get(spec.engine).in_process):
        return 0.0
    return batch_sweep_eta_s(at.step_s, spec.serving_batch) or 0.0


def size_to_budget(
    spec: SessionSpec, n_prompts: int, at: Pace | None, budget_s: float | None, fit: bool = True
) -> SizedPlan:
    """The plan cut to fit `budget_s` at pace `at` (the module's order); unchanged when either is None, or when not
    `fit` (the budget then only warns)."""
    seconds = plan_seconds(spec, n_prompts, at) if at else None
    if budget_s is None or at is None or seconds is None or seconds <= budget_s or not fit:
        return SizedPlan(spec, n_prompts, budget_s, seconds, at, fitted=fit)
    sized = replace(spec, detect_regime=False) if _sweep_s(spec, at) else spec
    for shape in _fewer_runs(sized):
        tokens, prompts = _fill(shape, n_prompts, spec.max_new_tokens, at, budget_s, (SOFT_TOKENS, SOFT_PROMPTS))
        if plan_seconds(replace(shape, max_new_tokens=tokens), prompts, at) <= budget_s:
            break
    else:
        tokens, prompts = _fill(shape, n_prompts, spec.max_new_tokens, at, budget_s, (MIN_TOKENS, MIN_PROMPTS))
    final = replace(shape, max_new_tokens=tokens)
    return SizedPlan(
        final,
        prompts,
        budget_s,
        plan_seconds(final, prompts, at),
        at,
        tuple(_cuts(spec, n_prompts, final, prompts, at)),
    )


def _fewer_runs(spec: SessionSpec) -> list[SessionSpec]:
    """The spec, then with one γ fewer at a time (the widest first) while that makes fewer runs, then one draft
    fewer at a time (the last first), each step keeping what came before."""
    shapes = [spec]
    while len(shapes[-1].gammas) > 1:
        fewer = replace(shapes[-1], gammas=sorted(shapes[-1].gammas)[:-1])
        if planned_configurations(fewer) >= planned_configurations(shapes[-1]):
            break
        shapes.append(fewer)
    while len(shapes[-1].drafts) > 1:
        shapes.append(replace(shapes[-1], drafts=shapes[-1].drafts[:-1]))
    return shapes


def _fill(
    shape: SessionSpec, n_prompts: int, tokens: int, at: Pace, budget_s: float, floors: tuple[int, int]
) -> tuple[int, int]:
    """The most new tokens, then prompts, that fit `budget_s` for `shape`'s runs, neither below its floor (nor above
    the plan's own)."""
    room = budget_s - at.setup_s - _sweep_s(shape, at)

    def seconds_per_token(prompts: int) -> float:
        return at.token_s * _decodes(shape, prompts, at)

    per_token = seconds_per_token(n_prompts)
    fit = math.floor(room / per_token) if room > 0 and per_token > 0 else 0
    tokens_fit = max(min(floors[0], tokens), min(fit // TOKEN_STEP * TOKEN_STEP, tokens))
    fewest = min(floors[1], n_prompts)
    fitting = [p for p in range(fewest, n_prompts + 1) if seconds_per_token(p) * tokens_fit <= room]
    return tokens_fit, max(fitting, default=fewest)


def _cuts(spec: SessionSpec, n_prompts: int, final: SessionSpec, prompts: int, at: Pace) -> list[Cut]:
    """What differs between the plan asked for and the sized one, in the module's order, each with the seconds it
    saves after the cuts before it."""
    steps = [
        ("batch sweep", spec.detect_regime, final.detect_regime,
         lambda s: replace(s, detect_regime=final.detect_regime), lambda v: "on" if v else "off"),
        ("new tokens per prompt", spec.max_new_tokens, final.max_new_tokens,
         lambda s: replace(s, max_new_tokens=final.max_new_tokens), str),
        ("γs", spec.gammas, final.gammas, lambda s: replace(s, gammas=final.gammas), _listed),
        ("drafts", spec.drafts, final.drafts, lambda s: replace(s, drafts=final.drafts), _listed),
    ]  # fmt: skip
    cuts, now = [], spec
    for what, before, after, apply, say in steps:
        if before != after:
            then = apply(now)
            saved = plan_seconds(now, n_prompts, at) - plan_seconds(then, n_prompts, at)
            cuts.append(Cut(what, say(before), say(after), saved, WHY[what]))
            now = then
    if prompts != n_prompts:
        saved = plan_seconds(now, n_prompts, at) - plan_seconds(now, prompts, at)
        why = "still stratified by category" if spec.prompt_sample == "stratified" else "the first in the set"
        cuts.append(Cut("prompts", str(n_prompts), str(prompts), saved, why))
    return cuts


WHY = {  # why each could go, said beside the cut
    "batch sweep": "a recommendation does not need it",
    "new tokens per prompt": "every decode is that much shorter",
    "γs": "each γ is a run of every prompt",
    "drafts": "each draft is a run of every prompt; the first named is kept",
}


def _listed(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


def sized_for(store: Any, spec: SessionSpec, n_prompts: int, budget_s: float | None, fit: bool = True) -> SizedPlan:
    """The plan sized to `budget_s` (or only checked against it, when not `fit`) at the pace this store's sessions,
    or this machine's kept probe, give."""
    from engine.measure.hardware import describe_hardware

    hardware = str(describe_hardware()["label"])
    at = pace_from(store.list_sessions(limit=100), spec, hardware, latest(spec, hardware))
    return size_to_budget(spec, n_prompts, at, budget_s, fit)


# ----------------------------------------------------------------------------------------------------------------------
# a stored session's budget, and how it kept it


def kept_budget(session: Mapping[str, Any]) -> float | None:
    """The time budget, in seconds, a stored session was submitted with; None when it had none."""
    value = (session.get("options") or {}).get("time_budget_s")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def wall_s(session: Mapping[str, Any]) -> float | None:
    """A session's wall time from its start to its end, in seconds (the pace's, engine.service.sizing.estimate); None
    while either is not stored."""
    start, end = (_when(session.get(key)) for key in ("started_at", "finished_at"))
    return (end - start).total_seconds() if start is not None and end is not None else None


def _when(value: Any) -> datetime | None:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return value if isinstance(value, datetime) else None


def budget_outcome(session: Mapping[str, Any]) -> str | None:
    """'10 min: took 8.2 min (within)' or '10 min: took 13.1 min (over by 31%)' for a finished session with a time
    budget, '10 min' for one not finished; None for a session without one."""
    budget_s = kept_budget(session)
    if budget_s is None:
        return None
    took = wall_s(session) if session.get("status") == "done" else None
    if took is None:
        return minutes(budget_s)
    spent = f"{took / 60:.1f} min" if took >= 90 else f"{took:.0f} s"
    over = "within" if took <= budget_s else f"over by {max(1, round(100 * (took / budget_s - 1)))}%"
    return f"{minutes(budget_s)}: took {spent} ({over})"


def budget_facts(session: Mapping[str, Any]) -> list[tuple[str, str]]:
    """[('time budget', budget_outcome)] for a session with a time budget, else nothing."""
    return [("time budget", said)] if (said := budget_outcome(session)) is not None else []
