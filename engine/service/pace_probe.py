"""A quick probe of this machine's pace, for the estimate of a session no comparable one has run before.

The probe is a one-configuration sweep through the session's own engine (engine.engines.registry.sweep): the target
alone on one prompt for PROBE_TOKENS tokens, in a child process, so that the models it loads and the servers it
starts end with it. What it measured is kept per machine (its hardware line), engine, target and dtype in
``$SPECTUNE_HOME/pace_probes.json``: a pace belongs to the machine that measured it, whichever store it shares.

Its figures: ``setup_s``, the seconds before the first decode (loading the target, starting its server, warming it
up); ``token_s``, the wall seconds per new token of the target alone while it decoded (prefill included).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from engine.errors import SettingsError, SpectuneError
from engine.llamacpp.server import die_with_parent
from engine.session.runner import PromptText, RunKey
from engine.session.spec import SessionSpec
from foundation.paths import PROJECT_ROOT, spectune_home

PROBE_TOKENS = 16
TIMEOUT_S = 15 * 60  # a float32 model of several GB loads in minutes on a 2-core CPU
DECODING = ("decoding",)  # the PhaseClock's phases that are not setup (engine.session.hooks._phase_key)


@dataclass(frozen=True)
class PaceProbe:
    hardware: str
    engine: str
    target: str
    dtype: str
    setup_s: float
    token_s: float
    tokens: int
    measured_at: str

    def key(self) -> tuple[str, str, str, str]:
        return self.hardware, self.engine, self.target, self.dtype

    def describe(self) -> str:
        per_token = f"{self.token_s * 1000:.0f} ms" if self.token_s < 1 else f"{self.token_s:.1f} s"
        return f"a probe of the target alone: {self.setup_s:.0f} s to load, {per_token} per token"


def probe_spec(spec: SessionSpec) -> SessionSpec:
    """The target alone, in `spec`'s engine and dtype, at its first temperature, for PROBE_TOKENS tokens."""
    return replace(spec, drafts=["none"], gammas=[1], policies=[], temperatures=spec.temperatures[:1],
                   max_new_tokens=PROBE_TOKENS, measure_verify_cost=False, detect_regime=False, mode="full",
                   confirm=False, concurrency=[1])  # fmt: skip


def measure(spec: SessionSpec, prompt: PromptText, hardware: str) -> PaceProbe:
    """The probe itself, in this process (the child's work)."""
    from engine.engines import registry

    alone = probe_spec(spec)
    plan = [RunKey("none", 0, alone.temperatures[0])]
    report = registry.sweep(alone, [prompt], plan=plan)
    tokens = sum(len(o.get("token_ids") or []) for o in report.baseline.get("outputs") or [])
    decoding = sum(s for phase, s in report.phase_times_s.items() if phase in DECODING)
    if not tokens or decoding <= 0:
        raise SpectuneError(f"the probe decoded nothing: {'; '.join(report.notes) or 'no baseline measured'}")
    setup = sum(s for phase, s in report.phase_times_s.items() if phase not in DECODING)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    # the decoding phase's wall time, prefill and the engine's own overhead included, as a session's wall time has
    # them (llama-server's own tokens/s leaves prefill out)
    return PaceProbe(hardware, spec.engine, spec.target, _dtype(spec), round(setup, 2), round(decoding / tokens, 4),
                     tokens, when)  # fmt: skip


def _dtype(spec: SessionSpec) -> str:
    from engine.engines import registry

    return registry.get(spec.engine).fixed_weights or spec.dtype


def run_probe(spec: SessionSpec, prompt: PromptText, hardware: str, timeout_s: float = TIMEOUT_S) -> PaceProbe:
    """The probe in a child process, kept for later estimates; SpectuneError with the child's one-line reason when
    it fails, SettingsError while another probe runs here. A timeout or an interrupt ends the child before this
    returns; the child dies with this process too (it asks the kernel for SIGKILL when its owner dies, and every
    server it starts dies with it the same way)."""
    request = json.dumps({"spec": spec.to_row(), "prompt": asdict(prompt), "hardware": hardware, "owner": os.getpid()})
    with _one_probe_at_a_time():
        child = subprocess.Popen([sys.executable, "-m", "engine.service.pace_probe"], cwd=PROJECT_ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))  # fmt: skip
        try:
            out, err = child.communicate(request, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SpectuneError(f"the probe took over {timeout_s / 60:.0f} min and was stopped") from exc
        finally:
            _end(child)
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not answers or "error" in answers[-1]:
        reason = answers[-1].get("error") if answers else None
        raise SpectuneError(f"the probe failed: {reason or (err.strip().splitlines() or ['no output'])[-1]}")
    probe = PaceProbe(**answers[-1])
    keep(probe)
    return probe


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
        return (f"session #{running[0]['id']} is running: a probe now would slow it and be slowed by it; "
                "probe once it has finished")  # fmt: skip
    return None


def probe_for(store: Any, spec: SessionSpec, prompt: PromptText, n_prompts: int = 1) -> tuple[PaceProbe, float]:
    """Probe `spec`'s pace on this machine now and keep it; the probe and the seconds it took. The session `spec`
    over `n_prompts` is validated first, as Start would (what it would refuse is refused before minutes of
    probing); SettingsError while a session is running."""
    from engine.measure.hardware import describe_hardware
    from engine.service.jobs import validate_submission

    validate_submission(spec, n_prompts)
    if (why := busy(store)) is not None:
        raise SettingsError(why)
    started = time.perf_counter()
    probe = run_probe(spec, prompt, str(describe_hardware()["label"]))
    return probe, time.perf_counter() - started


def _child(request: Mapping[str, Any]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SystemExit: the sweep's finally stops the runner
    die_with_parent()
    if os.getppid() != request["owner"]:  # the owner died before the kernel was asked
        sys.exit(143)
    spec = SessionSpec.from_row(request["spec"])
    probe = measure(spec, PromptText(**request["prompt"]), str(request["hardware"]))
    print(json.dumps(asdict(probe)), flush=True)


if __name__ == "__main__":
    try:
        _child(json.loads(sys.stdin.read()))
    except Exception as exc:  # noqa: BLE001 - the owner shows one line; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(json.dumps({"error": reason if isinstance(exc, SpectuneError) else f"{type(exc).__name__}: {reason}"}))
        sys.exit(2)
