"""Which loop spectune's engine decodes in, eager or compiled, and the probe that decides it when asked for auto.

The probe times the target alone on the session's first prompt in both loops, side by side (eager, compiled,
eager, compiled; each side's fastest), after the compiled loop has compiled: the compiled loop is chosen when it
is at least PROBE_MARGIN faster, and only where what it saves over the sweep's tokens pays for the widths still to
compile (the probe's compile of one width, times each model's widths not compiled yet): on a 2-core CPU a 1.5B
target compiled 55 s a width and saved 75 ms a token, which a first session's few thousand tokens do not pay back.
A probe is kept per machine, target, dtype and device in $SPECTUNE_HOME/loop_probes.json, so a machine probes a
target once. SPECTUNE_LOOP=eager|compiled overrides auto."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.core.compiled import Uncapturable, reusable, use_compiled, use_eager
from engine.core.decoder import DecodeConfig, decode_prompt
from engine.core.model import LoadedModel
from engine.core.proposal import NoDraft
from engine.core.sampling import SamplingConfig
from engine.engines.spectune.options import LoopOptions
from foundation.paths import spectune_home

PROBE_TOKENS = 16
PROBE_MARGIN = 0.10  # the compiled loop must be this much faster to be chosen: compiling costs time of its own
OVERRIDE = "SPECTUNE_LOOP"
log = logging.getLogger("spectune.loop")


@dataclass(frozen=True)
class LoopProbe:
    """What the probe measured: ms per token in each loop, the compile's seconds, and the loop it chose."""

    hardware: str
    target: str
    dtype: str
    device: str
    eager_ms: float
    compiled_ms: float | None
    compile_s: float
    loop: str
    error: str | None = None

    def key(self) -> tuple[str, str, str, str]:
        return (self.hardware, self.target, self.dtype, self.device)

    def sentence(self) -> str:
        if self.compiled_ms is None:
            return f"eager: {self.error}"
        return (
            f"{self.loop}: the probe measured {self.eager_ms:.1f} ms per token eager and {self.compiled_ms:.1f} "
            f"compiled (after a {self.compile_s:.0f} s compile)"
        )


@dataclass(frozen=True)
class LoopChoice:
    """The loop a session decodes in and why (`basis`, for the Run page and the report)."""

    loop: str
    basis: str


def _path() -> Path:
    return spectune_home() / "loop_probes.json"


def kept() -> list[LoopProbe]:
    """Every probe kept on this machine (an unreadable file: none)."""
    try:
        return [LoopProbe(**row) for row in json.loads(_path().read_text())]
    except (OSError, ValueError, TypeError):
        return []


def keep(probe: LoopProbe) -> None:
    """Store `probe`, replacing one of the same machine, target, dtype and device (written beside, then renamed)."""
    rows = [asdict(p) for p in kept() if p.key() != probe.key()] + [asdict(probe)]
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(rows, indent=1))
    temporary.replace(path)


def _ms_per_token(target: LoadedModel, ids: list[int], tokens: int) -> float:
    cfg = DecodeConfig(0, SamplingConfig(0.0), tokens, stop_on_eos=False)
    out, steps = decode_prompt(target, NoDraft(), ids, cfg)
    return (out.wall_time_s - out.prefill_time_s) * 1000.0 / max(1, len(steps))


def refusal(model: LoadedModel, exc: BaseException) -> str:
    """One line naming the model and why its compiled loop was refused: Uncapturable's own line (it names both), or
    the first line of any other failure."""
    if isinstance(exc, Uncapturable):
        return f"{exc}; decoding eagerly"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return f"{model.ref}: the compiled loop failed ({type(exc).__name__}: {first}); decoding eagerly"


def probe(target: LoadedModel, ids: list[int], need: int, widest: int, hardware: str) -> LoopProbe:
    """Time the target alone in both loops on `ids` (PROBE_TOKENS tokens, rounds side by side) and choose."""
    use_eager(target)
    _ms_per_token(target, ids, PROBE_TOKENS)  # first pass over the prompt's shapes, untimed
    eager = [_ms_per_token(target, ids, PROBE_TOKENS)]
    try:
        loop = use_compiled(target, need, widest)
        compile_s = loop.compile([1])
        _ms_per_token(target, ids, PROBE_TOKENS)
        compiled = []
        for _ in range(2):
            compiled.append(_ms_per_token(target, ids, PROBE_TOKENS))
            use_eager(target)
            eager.append(_ms_per_token(target, ids, PROBE_TOKENS))
            use_compiled(target, need, widest)
    except Exception as exc:  # noqa: BLE001 - a model or backend that does not compile decodes eagerly
        use_eager(target)
        reason = refusal(target, exc)
        log.warning("%s", reason)  # the one line a refused model gets; dynamo's own warnings were silenced
        return LoopProbe(hardware, target.ref, target.dtype, target.device, min(eager), None, 0.0, "eager", reason)
    use_eager(target)
    chosen = "compiled" if min(compiled) < min(eager) * (1.0 - PROBE_MARGIN) else "eager"
    return LoopProbe(hardware, target.ref, target.dtype, target.device, min(eager), min(compiled), compile_s, chosen)


def choose_loop(
    asked: str,
    target: LoadedModel,
    ids: list[int],
    need: int,
    widest: int,
    hardware: str,
    phase: Callable[[str], None] = lambda text: None,
    tokens: int | None = None,
    to_compile: Callable[[], int] = lambda: 0,
) -> LoopChoice:
    """The loop for a session that asked for `asked` (eager, compiled or auto): as asked; for auto, SPECTUNE_LOOP,
    else this machine's kept probe for the target, else a probe now (kept), the compiled loop only where it pays
    back over the sweep's `tokens` the `to_compile()` widths still to compile (pays_back)."""
    if asked != "auto":
        return LoopChoice(asked, "as set")
    override = os.environ.get(OVERRIDE, "").strip()
    if override in ("eager", "compiled"):
        return LoopChoice(override, f"{OVERRIDE}={override}")
    wanted = (hardware, target.ref, target.dtype, target.device)
    found = next((p for p in kept() if p.key() == wanted), None)
    if found is not None:
        choice = LoopChoice(found.loop, "kept probe, " + found.sentence())
    else:
        phase("probing eager against compiled")
        started = time.perf_counter()
        found = probe(target, ids, need, widest, hardware)
        keep(found)
        choice = LoopChoice(found.loop, f"probed in {time.perf_counter() - started:.0f} s, " + found.sentence())
    why_not = pays_back(found, tokens, to_compile()) if choice.loop == "compiled" and tokens else None
    return LoopChoice("eager", f"{choice.basis}; {why_not}") if why_not else choice


def widths_to_compile(model: LoadedModel, need: int, widest: int) -> int:
    """How many of widths 1..`widest` `model` would still compile for sequences of `need` positions (a loop that
    does not fit them compiles anew)."""
    loop = reusable(model, need, widest)
    if loop is None:
        return widest
    return len(set(range(1, widest + 1)) - loop.compiled_widths)


def pays_back(found: LoopProbe, tokens: int, widths: int) -> str | None:
    """Why compiling `widths` more widths would not pay back over `tokens` decoded tokens, at the probe's compile
    time per width and its per-token saving; None where it does."""
    if found.compiled_ms is None or widths <= 0:
        return None
    saved_s = (found.eager_ms - found.compiled_ms) / 1000.0 * tokens
    cost_s = found.compile_s * widths
    if saved_s >= cost_s:
        return None
    return (
        f"eager for this sweep: compiling {widths} width(s) would take about {cost_s:.0f} s and save about "
        f"{saved_s:.0f} s over its {tokens} tokens"
    )


def setup_note(spec: Any, hardware: str) -> str | None:
    """What the estimate says of the loop before a session starts: a compile and its time, or the probe to come."""

    asked = LoopOptions.of(spec).kind
    if asked == "eager" or (asked == "auto" and os.environ.get(OVERRIDE, "").strip() == "eager"):
        return None
    device = "cuda" if str(spec.device).startswith("cuda") else spec.device
    found = [
        p
        for p in kept()
        if p.hardware == hardware
        and p.target == spec.target
        and p.dtype == spec.dtype
        and (device == "auto" or p.device.startswith(device))
    ]
    if asked == "auto" and not found:
        return (
            "Compiling: the first session with this target and dtype here probes the eager loop against the "
            "compiled one first (a compile of each model: tens of seconds on a GPU, minutes on a CPU)."
        )
    if asked == "auto" and found[-1].loop == "eager":
        return None
    took = f"about {found[-1].compile_s:.0f} s per model, as the probe here measured" if found else "not yet timed here"
    return (
        f"Compiling: each model compiles once per worker before decoding ({took}); a phase of its own, "
        "not counted in the time above."
    )
