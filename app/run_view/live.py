"""The live view's numbers: the run being decoded, its speed against the target alone, its caption and output."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app import data
from app.run_view.progress import is_decoding, progress_bar


def session_to_watch(sessions: Sequence[Mapping[str, Any]]) -> int | None:
    """The session the live view opens on: the running one, else the next queued, else the newest."""
    for status in ("running", "queued"):
        found = next((s["id"] for s in sessions if s.get("status") == status), None)
        if found is not None:
            return found
    return sessions[0]["id"] if sessions else None


def run_numbers(store: Any, run: Mapping[str, Any] | None, final: bool) -> dict[str, Any]:
    """A run's speed and acceptance: its final measured numbers when ``final``, else live totals from its
    logged steps (tokens/s over decode-step time only, so a live run is compared on the same basis)."""
    if run is None:
        return {}
    return live_numbers(run, store.run_progress(run["id"]), final)


def live_numbers(run: Mapping[str, Any], progress: Mapping[str, Any], final: bool) -> dict[str, Any]:
    """run_numbers on an already read progress dict."""
    keys = ("tokens_per_s", "draft_acceptance_rate", "tokens_per_call", "steps")
    numbers = {key: progress.get(key) for key in keys}
    if final:
        for key in ("tokens_per_s", "tokens_per_call"):
            if run.get(key) is not None:
                numbers[key] = run[key]
    return numbers


def speed_delta(tps: float | None, base_tps: float | None, flag: str | None = None, basis: str = "") -> str | None:
    """'+50% vs baseline (1.50×)' (`basis` named after the ratio: ' whole run'); a ratio that breaks its
    bound (`flag`) is named impossible, not a gain."""
    if not tps or not base_tps:
        return None
    if flag:
        return f"{tps / base_tps:.2f}×{basis}: impossible"
    return f"{tps / base_tps - 1:+.0%} vs baseline ({tps / base_tps:.2f}×{basis})"  # basis: short, the tile is narrow


@dataclass(frozen=True)
class SpeedCheck:
    """The Tokens/s metric's delta against the baseline, and the bound it breaks (then shown grey, no arrow)."""

    delta: str | None
    flag: str | None

    @property
    def colour(self) -> str:
        return "off" if self.flag else "normal"

    @property
    def arrow(self) -> str:
        return "off" if self.flag else "auto"


def speed_check(run: Mapping[str, Any], now: Mapping[str, Any], base: Mapping[str, Any], final: bool) -> SpeedCheck:
    """The live (or final) tokens/s ratio against the baseline, checked against the one bound a measured speedup
    has (engine.session.summarise.speedup_flag: tokens per call ÷ (v_min + the draft's share)); a finished run's own
    stored verdict (the flag its summary was stored with) counts too."""
    from engine.service.api import speedup_flag, stored_speedup_flag, whole_run_speedup

    tps, base_tps = now.get("tokens_per_s"), base.get("tokens_per_s")
    if run.get("kind") == "baseline" or not tps or not base_tps:
        return SpeedCheck(speed_delta(tps, base_tps) if run.get("kind") != "baseline" else None, None)
    whole = whole_run_speedup(run) if final else None
    ratio, basis = (whole, " whole run") if whole else (tps / base_tps, "")
    flag = stored_speedup_flag(run) if final else None
    flag = flag or speedup_flag(
        ratio,
        data.most_drafted(run),
        now.get("tokens_per_call"),
        float(run.get("c") or 0.0),
        None,
        run.get("verify_cost"),
    )
    return SpeedCheck(speed_delta(ratio, 1.0, flag, basis), flag)


def current_run(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The running run, else the last one."""
    return next((r for r in reversed(runs) if r.get("status") == "running"), runs[-1])


def run_caption(run: Mapping[str, Any], session: Mapping[str, Any]) -> str:
    """The line above the live numbers (markdown, escaped): 'Current run: … (decoding …)' only while that run
    decodes; otherwise the last run measured and what the session is doing instead (its phase), so a run is
    never called running before its first step, between its prompts while the engine does something else (a
    server starting, v(k) measured), or after the session ended."""
    from app.common import ACTIVE_STATUSES, md_escape

    label, status, phase = md_escape(data.run_label(run)), session.get("status"), session.get("phase") or {}
    if run.get("status") == "done":
        state = "done; tokens/s over the whole run's decoding"
    elif status == "running" and is_decoding(phase):
        return f"Current run: **{label}** (decoding; tokens/s live, over decode-step time)"
    elif status in ACTIVE_STATUSES and _all_decoded(session):
        state = "every prompt decoded; tokens/s live, over decode-step time"
    elif status in ACTIVE_STATUSES:
        state = "paused between prompts; tokens/s live, over decode-step time"
    else:
        state = f"not finished: the session is {status}; tokens/s over the steps it logged"
    now = f" · now: {md_escape(str(phase['name']))}" if status == "running" and phase.get("name") else ""
    return f"Last run measured: **{label}** ({state}){now}"


def _all_decoded(session: Mapping[str, Any]) -> bool:
    return progress_bar(session)[0] >= 1.0


def waiting_text(session: Mapping[str, Any]) -> str:
    """What the live view says before any run has logged a step: the session's phase, never a run."""
    name = str((session.get("phase") or {}).get("name") or "loading models")
    return f"{name[:1].upper()}{name[1:]}… (no run has decoded a token yet)"


def latest_output(store: Any, runs: Sequence[Mapping[str, Any]]) -> tuple[Mapping, Mapping] | None:
    """(run, output) of the newest stored output, from the last run that has one."""
    for run in reversed(runs):
        outputs = store.get_outputs(run["id"])
        if outputs:
            return run, outputs[-1]
    return None


def output_title(run: Mapping[str, Any], output: Mapping[str, Any]) -> str:
    """'<run>, prompt 3': prompts are numbered from 1, as on the Prompts page."""
    index = output.get("prompt_index")
    number = int(index) + 1 if isinstance(index, int) else "?"
    return f"{data.run_label(run)}, prompt {number}"


def busy_note(session: Mapping[str, Any], other_cpu_pct: float | None = None) -> str | None:
    """The busy-machine warning: the finished session's own note, or while it runs, the latest reading of
    other processes' CPU share when it is above the busy threshold."""
    from engine.service.api import BUSY_OTHER_CPU_PCT, StoredSession

    note = StoredSession.of(session).machine_note
    if note:
        return note
    if session.get("status") == "running" and other_cpu_pct is not None and other_cpu_pct >= BUSY_OTHER_CPU_PCT:
        return (
            f"The machine is busy: other processes are using {other_cpu_pct:.0f}% of its CPUs right now. Each "
            "speedup is measured side by side, prompt by prompt, but expect a wider spread than on a quiet machine."
        )
    return None
