"""A vLLM export measured as it is: a vLLM session that launches the export's speculative_config (its K by batch
size too) beside the target alone and the fixed γ the export gives one request in flight, at every concurrency
level of the session the recommendation came from, on that session's prompts.

An "off" file (speculative_config null) names the speculation it turns off under "replaces", as `watch` writes
one: it is measured as that speculation beside the target alone the file serves.

`submit_export_check` queues it (the worker runs it like any session); `export_check_rows` reads the finished
session back as one row per level: what the schedule and the fixed γ measured there against the target alone,
and which won (with the noise verdict: a win inside the noise is said to be one); without a schedule, whether
the fixed γ beat the target alone."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine.analysis.export.vllm_read import VllmExported, read_vllm_export
from engine.engines import registry
from engine.errors import SettingsError
from engine.service.decide.surface import noise_of
from engine.service.jobs import submit_session
from engine.service.report.runs import run_concurrency, run_spread
from engine.session.spec import SessionSpec
from engine.session.summarise import run_speedup

VLLM_FORMAT = "vllm"  # the export format checked here


def export_check_spec(store: Any, session_id: int, exported: VllmExported) -> SessionSpec:
    """The session that measures `exported`: the source session's target, temperature, tokens and levels."""
    session = store.get_session(int(session_id))
    if session is None:
        raise SettingsError(f"session {session_id} does not exist")
    source = SessionSpec.from_row(session)
    engine = registry.engine_for_format(VLLM_FORMAT)
    if source.engine != engine:
        raise SettingsError(
            f"session {session_id} was measured with {source.engine}, not {engine}: check a vLLM "
            "export against a vLLM session (its prompts, target and concurrency levels)"
        )
    policy = exported.policy()
    return replace(
        source,
        drafts=[exported.draft],
        gammas=[exported.gamma],
        policies=[policy.spec()] if policy else [],
        temperatures=source.temperatures[:1],
        mode="full",
        confirm=False,
        measure_verify_cost=False,
        detect_regime=False,
        time_budget_s=None,
    )  # it measures the file as it is: no headline of its own to confirm


def submit_export_check(store: Any, session_id: int, text: str, name: str | None = None) -> int:
    """Queue the check of a vLLM export (its file's text) against session `session_id`; SettingsError when the
    file or the session cannot be checked."""
    exported = read_vllm_export(text)
    spec = export_check_spec(store, session_id, exported)
    session = store.get_session(int(session_id))
    return submit_session(
        store,
        spec,
        session["prompt_set_id"],
        session.get("n_prompts"),
        name or f"vLLM export check against session #{session_id}",
    )


@dataclass(frozen=True)
class LevelCheck:
    """One concurrency level of an export check: the target alone's tokens/s, and each side's measured speedup."""

    level: int
    baseline_tokens_per_s: float | None
    fixed: float | None
    schedule: float | None
    noisy: bool

    def winner(self) -> str:
        """The faster side: the schedule or the fixed γ; without a schedule, the fixed γ or the target alone."""
        if self.fixed is None:
            return "—"
        if self.schedule is None:
            won = "target alone" if self.fixed < 1.0 else "fixed γ"
            return f"{won} (inside the noise)" if self.noisy else won
        if abs(self.schedule - self.fixed) < 1e-9:
            return "tie"
        won = "schedule" if self.schedule > self.fixed else "fixed γ"
        return f"{won} (inside the noise)" if self.noisy else won


def export_check_rows(store: Any, session_id: int) -> list[LevelCheck]:
    """Per concurrency level of a finished export check, what each side measured."""
    rows: dict[int, dict[str, Any]] = {}
    for run in store.list_runs(int(session_id)):
        if run.get("status") != "done":
            continue
        level = rows.setdefault(run_concurrency(run), {"noisy": False})
        summary = run.get("summary") or {}
        if run["kind"] == "baseline":
            level["baseline"] = run.get("tokens_per_s")
            continue
        side = "schedule" if summary.get("policy") else "fixed"
        level[side] = run_speedup(run)
        level["noisy"] |= bool(noise_of(run_spread(run))[1])
    return [
        LevelCheck(b, r.get("baseline"), r.get("fixed"), r.get("schedule"), r["noisy"]) for b, r in sorted(rows.items())
    ]
