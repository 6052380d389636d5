"""A quick probe of this machine's pace, for the estimate of a session no comparable one has run before.

The probe is a one-configuration sweep through the session's own engine (engine.engines.registry.sweep): the target
alone on one prompt for PROBE_TOKENS tokens, in a child process, so that the models it loads and the servers it
starts end with it. What it measured is kept per machine (its hardware line), engine, target and dtype in
``$SPECTUNE_HOME/pace_probes.json``: a pace belongs to the machine that measured it, whichever store it shares.

Its figures: ``setup_s``, the seconds before the timed decode (loading the target, starting its server, warming it
up, the untimed first pass over the prompt); ``token_s``, the wall seconds per new token of the target alone while it
decoded (prefill included), over ``tokens`` tokens. The timed decode is bounded to DECODE_BOUND_S seconds: a slow
target times fewer tokens (at least one), which still gives a pace per token. While it runs, the child prints its
stage and the tokens timed so far, and the owner hands them on (ProbeProgress) with the seconds gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from engine.core.records import Cancelled
from engine.errors import SettingsError, SpectuneError
from engine.session.hooks import Hooks
from engine.session.runner import PromptText, RunKey
from engine.session.spec import SessionSpec
from foundation.paths import PROJECT_ROOT, spectune_home
from foundation.processes import die_with_parent

PROBE_TOKENS = 16
DECODE_BOUND_S = 60.0  # the most seconds the probe times decoding; loading is not bounded by it
TIMEOUT_S = 15 * 60  # a float32 model of several GB loads in minutes on a 2-core CPU
TICK_S = 1.0  # how often the owner reports a running probe's progress while the child says nothing


@dataclass(frozen=True)
class PaceProbe:
    hardware: str
    engine: str
    target: str
    dtype: str
    setup_s: float
    token_s: float
    tokens: int  # the tokens timed: PROBE_TOKENS, or fewer when decoding reached DECODE_BOUND_S
    measured_at: str
    bounded: bool = False  # decoding was stopped at DECODE_BOUND_S

    def key(self) -> tuple[str, str, str, str]:
        return self.hardware, self.engine, self.target, self.dtype

    def describe(self) -> str:
        per_token = f"{self.token_s * 1000:.0f} ms" if self.token_s < 1 else f"{self.token_s:.1f} s"
        return (
            f"a probe of the target alone: {self.setup_s:.0f} s to load, {per_token} per token over "
            f"{self.tokens} token(s)"
        )

    def timed(self) -> str:
        """'40 s to load, then 16 tokens timed in 12 s', and why fewer were timed when decoding was bounded."""
        decoding = self.token_s * self.tokens
        said = f"{self.setup_s:.0f} s to load, then {self.tokens} token(s) timed in {decoding:.0f} s"
        if self.bounded:
            said += f" (decoding stops after {DECODE_BOUND_S:.0f} s; the pace is per token: fewer tokens still give it)"
        return said


@dataclass(frozen=True)
class ProbeProgress:
    """A running probe as its owner sees it: the stage ('loading', 'priming': the untimed first pass, 'decoding'),
    the tokens timed so far, the seconds since it started, and those its loading took (None while it loads)."""

    stage: str
    tokens: int
    elapsed_s: float
    load_s: float | None = None
    stage_s: float = 0.0  # the seconds since this stage began


class ProbeHooks(Hooks):
    """The child's hooks: its stage and tokens timed said as they change (`emit`), the timed decode's clock, and a
    stop once the target alone has decoded the prompt, or has decoded for `bound_s` with at least one token timed
    (the A/A decode that would follow is not needed: nothing is compared)."""

    def __init__(self, bound_s: float, emit: Callable[[dict[str, Any]], None]) -> None:
        self.bound_s, self._emit = bound_s, emit
        self.started = self._phase_at = time.perf_counter()
        self.decode_start: float | None = None  # the timed decode's start: its phase's, prefill included
        self.last_token_at: float | None = None
        self.tokens = 0
        self.finished = False
        self.bounded = False

    def phase(self, name: str, done: int, total: int, eta_s: float | None) -> None:
        self._phase_at = time.perf_counter()
        if self.decode_start is None:
            stage = next((s for s in ("decoding", "priming") if name.startswith(s)), "loading")
            self._emit({"stage": stage, "tokens": 0})

    def step(self, run: Any, record: Any) -> None:
        self._timed(self.tokens + int(record.emitted))

    def output(self, run: Any, output: Any, divergence: dict | None) -> None:
        self._timed(len(output.token_ids))
        self.finished = True

    def _timed(self, tokens: int) -> None:
        now = time.perf_counter()
        if self.decode_start is None:
            self.decode_start = self._phase_at
        self.tokens, self.last_token_at = tokens, now
        self._emit({"stage": "decoding", "tokens": tokens})

    def should_stop(self) -> bool:
        if self.finished:
            return True
        if self.decode_start is not None and self.tokens and time.perf_counter() - self.decode_start >= self.bound_s:
            self.bounded = True
        return self.bounded


def probe_spec(spec: SessionSpec) -> SessionSpec:
    """The target alone, in `spec`'s engine and dtype, at its first temperature, for PROBE_TOKENS tokens."""
    return replace(
        spec,
        drafts=["none"],
        gammas=[1],
        policies=[],
        temperatures=spec.temperatures[:1],
        max_new_tokens=PROBE_TOKENS,
        measure_verify_cost=False,
        detect_regime=False,
        mode="full",
        confirm=False,
        concurrency=[1],
    )


def measure(
    spec: SessionSpec,
    prompt: PromptText,
    hardware: str,
    bound_s: float = DECODE_BOUND_S,
    emit: Callable[[dict[str, Any]], None] = lambda progress: None,
) -> PaceProbe:
    """The probe itself, in this process (the child's work): `emit` is told each stage and the tokens timed."""
    from engine.engines import registry

    alone = probe_spec(spec)
    plan = [RunKey("none", 0, alone.temperatures[0])]
    hooks = ProbeHooks(bound_s, emit)
    try:
        notes = registry.sweep(alone, [prompt], hooks=hooks, plan=plan).notes
    except Cancelled:  # the probe's own stop: the prompt decoded, or decoding bounded
        notes = []
    if not hooks.tokens or hooks.decode_start is None or hooks.last_token_at is None:
        raise SpectuneError(f"the probe decoded nothing: {'; '.join(notes) or 'no baseline measured'}")
    decoding = max(hooks.last_token_at - hooks.decode_start, 1e-6)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    # the timed decode's wall time, prefill and the engine's own overhead included, as a session's wall time has
    # them (llama-server's own tokens/s leaves prefill out)
    return PaceProbe(
        hardware,
        spec.engine,
        spec.target,
        _dtype(spec),
        round(hooks.decode_start - hooks.started, 2),
        round(decoding / hooks.tokens, 4),
        hooks.tokens,
        when,
        hooks.bounded,
    )


def _dtype(spec: SessionSpec) -> str:
    from engine.engines import registry

    return registry.get(spec.engine).fixed_weights or spec.dtype


def run_probe(
    spec: SessionSpec,
    prompt: PromptText,
    hardware: str,
    timeout_s: float = TIMEOUT_S,
    on_progress: Callable[[ProbeProgress], None] | None = None,
    bound_s: float = DECODE_BOUND_S,
) -> PaceProbe:
    """The probe in a child process, kept for later estimates; `on_progress` is told where it is at least every
    TICK_S seconds while it runs. SpectuneError with the child's one-line reason when it fails, SettingsError while
    another probe runs here. A timeout or an interrupt ends the child before this returns; the child dies with this
    process too (it asks the kernel for SIGKILL when its owner dies, and every server it starts dies with it the
    same way)."""
    request = json.dumps(
        {
            "spec": spec.to_row(),
            "prompt": asdict(prompt),
            "hardware": hardware,
            "owner": os.getpid(),
            "bound_s": bound_s,
        }
    )
    with _one_probe_at_a_time():
        child = subprocess.Popen(
            [sys.executable, "-m", "engine.service.sizing.pace_probe"],
            cwd=PROJECT_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        try:
            answers, err = _follow(child, request, timeout_s, on_progress or (lambda progress: None))
        finally:
            _end(child)
    if child.returncode != 0 or not answers or "error" in answers[-1]:
        reason = answers[-1].get("error") if answers else None
        raise SpectuneError(f"the probe failed: {reason or (err.strip().splitlines() or ['no output'])[-1]}")
    probe = PaceProbe(**answers[-1])
    keep(probe)
    return probe


def _follow(
    child: subprocess.Popen[str], request: str, timeout_s: float, on_progress: Callable[[ProbeProgress], None]
) -> tuple[list[dict[str, Any]], str]:
    """The child's answers (its JSON lines other than progress) and its stderr, once it has closed its output;
    meanwhile its progress handed on. SpectuneError past `timeout_s`."""
    lines: queue.Queue[str | None] = queue.Queue()
    err: list[str] = []
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    threading.Thread(target=_pump, args=(child.stdout, lines), daemon=True).start()
    reader = threading.Thread(target=lambda stream: err.append(stream.read()), args=(child.stderr,), daemon=True)
    reader.start()
    try:
        child.stdin.write(request)
        child.stdin.close()
    except BrokenPipeError:  # the child ended at once: its stderr says why
        pass
    started, answers, tracker = time.monotonic(), [], _Tracker()
    while (line := _next_line(lines, started, timeout_s)) is not None:
        said = json.loads(line) if line.startswith("{") else None
        if said is not None and "progress" in said:
            tracker.update(said["progress"], time.monotonic() - started)
        elif said is not None:
            answers.append(said)
        on_progress(tracker.now(time.monotonic() - started))
    child.wait()
    reader.join(timeout=30)
    return answers, "".join(err)


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


def _next_line(lines: queue.Queue[str | None], started: float, timeout_s: float) -> str | None:
    """The child's next line, '' after TICK_S of silence (time to report progress), None once it closed its output."""
    if time.monotonic() - started > timeout_s:
        raise SpectuneError(f"the probe took over {timeout_s / 60:.0f} min and was stopped")
    try:
        return lines.get(timeout=TICK_S)
    except queue.Empty:
        return ""


class _Tracker:
    """The progress the child has said so far, and when its loading ended."""

    def __init__(self) -> None:
        self.stage, self.tokens, self.since = "loading", 0, 0.0
        self.load_s: float | None = None

    def update(self, said: Mapping[str, Any], elapsed: float) -> None:
        stage = str(said.get("stage") or self.stage)
        if stage != self.stage:
            self.stage, self.since = stage, elapsed
        self.tokens = int(said.get("tokens") or 0)
        if self.load_s is None and stage != "loading":
            self.load_s = elapsed

    def now(self, elapsed: float) -> ProbeProgress:
        return ProbeProgress(self.stage, self.tokens, elapsed, self.load_s, elapsed - self.since)


@contextmanager
def _one_probe_at_a_time() -> Iterator[None]:
    with open(spectune_home() / "pace_probe.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise SettingsError("another probe is running on this machine: wait for it, then estimate") from exc
        yield


def _end(child: subprocess.Popen[str]) -> None:
    """SIGTERM (the child's handler stops its runner), SIGKILL 30 s later; its pipes read meanwhile."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()


def probes_path() -> Any:
    return spectune_home() / "pace_probes.json"


def kept() -> list[PaceProbe]:
    """Every probe kept on this machine, newest first (an unreadable file: none)."""
    try:
        rows = json.loads(probes_path().read_text())
        return [PaceProbe(**row) for row in rows][::-1]
    except (OSError, ValueError, TypeError):
        return []


def keep(probe: PaceProbe) -> None:
    """Store `probe`, replacing an older one of the same machine, engine, target and dtype."""
    rows = [asdict(p) for p in reversed(kept()) if p.key() != probe.key()] + [asdict(probe)]
    path = probes_path()
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(rows, indent=1))
    temporary.replace(path)


def latest(spec: SessionSpec, hardware: str) -> PaceProbe | None:
    """The kept probe for `spec`'s engine, target and dtype on this machine, if any."""
    wanted = (hardware, spec.engine, spec.target, _dtype(spec))
    return next((p for p in kept() if p.key() == wanted), None)


def first_prompt(store: Any, prompt_set_id: int | None) -> PromptText:
    """The prompt a probe decodes: the set's first."""
    rows = store.get_prompts(prompt_set_id, limit=1) if prompt_set_id else []
    if not rows:
        raise SettingsError("the probe needs a prompt: choose a prompt set with at least one prompt")
    return PromptText(str(rows[0].get("id", 0)), rows[0]["text"], rows[0].get("category"))


def busy(store: Any) -> str | None:
    """Why a probe should wait now (a session running on this store's worker), or None."""
    running = store.list_sessions(status="running", limit=1)
    if running:
        return (
            f"session #{running[0]['id']} is running: a probe now would slow it and be slowed by it; "
            "probe once it has finished"
        )
    return None


def probe_for(
    store: Any,
    spec: SessionSpec,
    prompt: PromptText,
    n_prompts: int = 1,
    on_progress: Callable[[ProbeProgress], None] | None = None,
) -> tuple[PaceProbe, float]:
    """Probe `spec`'s pace on this machine now and keep it; the probe and the seconds it took (`on_progress`: told
    where it is while it runs). The session `spec` over `n_prompts` is validated first, as Start would (what it
    would refuse is refused before minutes of probing); SettingsError while a session is running."""
    from engine.measure.hardware import describe_hardware
    from engine.service.jobs import validate_submission

    validate_submission(spec, n_prompts)
    if (why := busy(store)) is not None:
        raise SettingsError(why)
    started = time.perf_counter()
    probe = run_probe(spec, prompt, str(describe_hardware()["label"]), on_progress=on_progress)
    return probe, time.perf_counter() - started


def _child(request: Mapping[str, Any]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SystemExit: the sweep's finally stops the runner
    die_with_parent()
    if os.getppid() != request["owner"]:  # the owner died before the kernel was asked
        sys.exit(143)
    spec = SessionSpec.from_row(request["spec"])
    bound_s = float(request.get("bound_s", DECODE_BOUND_S))
    probe = measure(spec, PromptText(**request["prompt"]), str(request["hardware"]), bound_s, _say)
    print(json.dumps(asdict(probe)), flush=True)


def _say(progress: dict[str, Any]) -> None:
    print(json.dumps({"progress": progress}), flush=True)


if __name__ == "__main__":
    try:
        _child(json.loads(sys.stdin.read()))
    except Exception as exc:  # noqa: BLE001 - the owner shows one line; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(json.dumps({"error": reason if isinstance(exc, SpectuneError) else f"{type(exc).__name__}: {reason}"}))
        sys.exit(2)
