"""How long a session will take and how much memory its models hold, said before it starts.

Time: the newest finished session on this machine (the same hardware line) in the same engine, with the same
target and dtype, gave seconds per configuration × prompt × new token, its whole wall time included (model loads,
the v(k) probe, the drafts' recorded passes); the new session's plan is charged at that rate. Memory: the PyTorch
loop holds each model's parameters at the dtype's width; a llama-server maps its GGUF (its KV cache and buffers
come on top: the session's own plan says them before the servers start, engine.engines.llamacpp.memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.analysis.export.refs import prepared_gguf
from engine.drafts.kinds import draft_kind
from engine.engines import registry
from engine.engines.entry import EngineEntry
from engine.errors import SpectuneError
from engine.models.bundled import parameter_count
from engine.service.sizing.pace_probe import PaceProbe, ProbeProgress, latest, probe_for
from engine.service.sizing.plan import optional_configurations, planned_configurations, planned_decodes, planned_runs
from engine.session.runner import PromptText
from engine.session.spec import SessionSpec, session_engine

LONG_S = 15 * 60  # past this, the estimate suggests a cheaper session
BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class SessionEstimate:
    configurations: int  # live configurations (runs) the session plans, baselines included
    seconds: float | None  # None: no comparable session has run on this machine yet
    source: str | None
    memory_bytes: int | None  # the models' weights (None: not known before loading)
    memory_what: str = ""  # a clause saying the bytes and what holds them
    cheaper: tuple[str, ...] = ()  # what would take less, for a long session
    optional: int = 0  # of the configurations, those a full session runs only when its grid lacks the headline
    rough: bool = False  # a probe's pace: the target's load once and every prompt decode at the target-alone pace
    setup: str | None = None  # the engine's sentence on its setup before decoding (a compile), if any
    decodes: int = 0  # the prompt decodes the progress bar will count (planned_decodes)

    def sentences(self) -> list[str]:
        work = f"{self.configurations} configuration(s) to run live"
        if self.optional:
            work += f" ({self.optional} of them only if the grid does not measure the recommendation)"
        if self.decodes:
            work += f", {self.decodes} prompt decodes on the progress bar (the A/A check's included)"
        if self.seconds is None:
            lines = [
                f"{work}; time unknown until a session with this target, engine and dtype has run here "
                "(or a probe of its pace)."
            ]
        elif self.rough:  # a probe's pace: what is known is the target alone decoding
            least = self.seconds * (self.configurations - self.optional) / self.configurations
            lines = [
                f"{work}: the target alone would decode their tokens in about {_minutes(least)} here "
                f"({self.source}); the session takes longer: its drafts' loads, v(k), the drafts' recorded "
                "pass, the batch sweep and any draft slower than it pays come on top, and a session run "
                "once gives the whole time."
            ]
        else:
            least = self.seconds * (self.configurations - self.optional) / self.configurations
            took = _minutes(self.seconds) if not self.optional else f"{_minutes(least)} to {_minutes(self.seconds)}"
            lines = [f"{work}: about {took} on this machine ({self.source})."]
        if self.setup:
            lines.append(self.setup)
        if self.memory_bytes is not None:
            lines.append(f"Memory: {self.memory_what.rstrip('.')}.")
        if self.seconds is not None and self.seconds > LONG_S:
            lines.append(f"That is long: {', '.join(self.cheaper)} would take less.")
        return lines


def gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def pace(sessions: Sequence[Mapping[str, Any]], spec: SessionSpec, hardware: str) -> tuple[float, str] | None:
    """Seconds per configuration × prompt × token of the newest comparable finished session, and which it was."""
    fixed_weights = registry.get(spec.engine).fixed_weights
    for s in sessions:
        same = (
            s.get("status") == "done"
            and s.get("hardware") == hardware
            and s.get("target") == spec.target
            and session_engine(s) == spec.engine
            and (s.get("dtype") == spec.dtype or fixed_weights)
        )
        summary = s.get("summary") or {}
        runs = len(summary.get("runs") or []) + len(summary.get("baselines") or [])
        work = runs * int(s.get("n_prompts") or 0) * int(s.get("max_new_tokens") or 0)
        if not same or not work or s.get("started_at") is None or s.get("finished_at") is None:
            continue
        wall = (s["finished_at"] - s["started_at"]).total_seconds()
        if wall > 0:
            return (
                wall / work,
                f"at the pace of session #{s['id']}: {wall / 60:.1f} min for {runs} × "
                f"{s['n_prompts']} × {s['max_new_tokens']} tokens",
            )
    return None


def probe_seconds(spec: SessionSpec, n_prompts: int, setup_s: float, token_s: float) -> float:
    """The time a probe's pace gives the plan: the target's setup once, then every prompt decode the progress bar
    counts (each configuration's, each prompt's A/A check, a confirmation at its most) at the target-alone pace per
    token; a deployment's, which has no decodes counted, each configuration's."""
    decodes = planned_decodes(spec, n_prompts) or planned_configurations(spec) * n_prompts
    return setup_s + token_s * decodes * spec.max_new_tokens


def memory(spec: SessionSpec, entry: EngineEntry) -> tuple[int | None, str]:
    """The bytes the session will hold at most, and what holds them: its engine's own account (llama.cpp: every
    llama-server with its KV cache, and how many fit at once), else its models' weights."""
    if (account := entry.memory) is not None:
        try:
            return account(spec, planned_runs(spec))
        except (SpectuneError, OSError):  # a model not prepared yet: its file sizes, below, if they are known
            pass
    return weights(spec, entry)


def weights(spec: SessionSpec, entry: EngineEntry) -> tuple[int | None, str]:
    """The bytes the session's models hold as weights, and of what."""
    models = [spec.target] + [d for d in spec.drafts if draft_kind(d).needs_model]
    if entry.fixed_weights:
        sizes = []
        for ref in models:
            if (path := prepared_gguf(ref)) is None:
                return None, ""
            sizes.append(path.stat().st_size)
        return sum(
            sizes
        ), f"about {gib(sum(sizes))} for {len(models)} GGUF file(s) mapped once, each server's KV cache on top"
    counts = [parameter_count(ref) for ref in models]
    if any(c is None for c in counts):
        return None, ""
    width = BYTES_PER_VALUE.get(spec.dtype, 4)
    held = sum(counts) * width  # type: ignore[arg-type]
    return held, f"about {gib(held)} for {len(models)} model(s) in {spec.dtype}, the KV cache and activations on top"


def estimate_session(
    sessions: Sequence[Mapping[str, Any]],
    spec: SessionSpec,
    n_prompts: int,
    hardware: str,
    probe: PaceProbe | None = None,
) -> SessionEstimate:
    """Time and memory for `spec` over `n_prompts` prompts on this machine (`hardware`: its description line).

    `sessions` come newest first. With no comparable session, `probe` (the target alone, timed) gives a rough time:
    its setup once, then every prompt decode's tokens at the target's own pace (probe_seconds; the session's other
    phases come on top; a faster draft, or requests batched at a concurrency above 1, decode in less)."""
    entry = registry.get(spec.engine)
    configurations = planned_configurations(spec)
    tokens = configurations * n_prompts * spec.max_new_tokens
    rate = pace(sessions, spec, hardware)
    probed = rate is None and probe is not None
    if rate is None and probe is not None:
        rate = (probe_seconds(spec, n_prompts, probe.setup_s, probe.token_s) / tokens, f"from {probe.describe()}")
    seconds = rate[0] * tokens if rate else None
    held, what = memory(spec, entry)
    cheaper = (["a quick session"] if spec.mode != "quick" else []) + ["fewer γs, drafts, prompts or new tokens"]
    if not entry.fixed_weights:  # an engine running quantised weights is faster on a CPU
        quantised = [e for e in map(registry.get, registry.sweep_engines()) if e.fixed_weights]
        cheaper += [f"{e.label} ({e.fixed_weights})" for e in quantised if e.availability()[0]]
    return SessionEstimate(
        configurations,
        seconds,
        rate[1] if rate else None,
        held,
        what,
        tuple(cheaper),
        optional_configurations(spec),
        probed,
        entry.setup_note(spec, hardware),
        planned_decodes(spec, n_prompts),
    )


def estimate_for(store: Any, spec: SessionSpec, n_prompts: int) -> SessionEstimate:
    """The estimate for a session about to be submitted, from the sessions this store holds."""
    from engine.measure.hardware import describe_hardware

    hardware = str(describe_hardware()["label"])
    return estimate_session(store.list_sessions(limit=100), spec, n_prompts, hardware, latest(spec, hardware))


@dataclass(frozen=True)
class ProbedEstimate:
    estimate: SessionEstimate
    probe_s: float | None  # how long the probe took; None: not probed, a finished session here gives the pace
    probe: PaceProbe | None = None  # what the probe measured: its load, the tokens it timed


def estimate_with_probe(
    store: Any,
    spec: SessionSpec,
    n_prompts: int,
    prompt: PromptText,
    on_progress: Callable[[ProbeProgress], None] | None = None,
) -> ProbedEstimate:
    """The estimate after probing the target's pace on `prompt` (engine.service.sizing.pace_probe; `on_progress` told
    where it is while it runs), unless a finished comparable session already gives the pace: what the Run page's
    Probe and `submit --estimate --probe` show."""
    before = estimate_for(store, spec, n_prompts)
    if before.seconds is not None and not before.rough:
        return ProbedEstimate(before, None)
    probe, took = probe_for(store, spec, prompt, n_prompts, on_progress)
    return ProbedEstimate(estimate_for(store, spec, n_prompts), took, probe)
