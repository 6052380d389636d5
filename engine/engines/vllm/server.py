"""A vLLM server we start ourselves: launch flags and environment, a free loopback port, health, version, stop.

The API server runs under engine/engines/vllm/guard.py in a process group of its own (the guard sweeps the
EngineCore and Worker vLLM starts, whatever ends the server), and every server is registered while alive, so
`stop_all` (a worker told to stop, an exiting interpreter) stops them. A server that fails to start, exits or stops
answering raises VllmServerError carrying the tail of its log.

CPU settings (read from vLLM 0.32's `vllm/envs.py` and `vllm/utils/ompmultiprocessing.py`): by default vLLM's CPU
backend binds its OpenMP compute threads to all cores but one per rank (`VLLM_CPU_OMP_THREADS_BIND=auto`,
`reserve_cpu_num` = the local world size), so on 2 cores it computes on one; and it sizes the KV cache from
`--gpu-memory-utilization` of the machine's memory (20 GiB on a 23 GiB machine, a minute of start-up spent touching
it) unless `VLLM_CPU_KVCACHE_SPACE` (GiB) or `--kv-cache-memory-bytes` says otherwise. spectune binds the compute
threads to `threads` cores (`VLLM_CPU_OMP_THREADS_BIND=0-N`; the front end and scheduler then share those cores, as
llama-server's HTTP thread shares its `-t` cores) and gives the KV cache `kv_cache_mib` (default 512 MiB, with
`--kv-cache-memory-bytes`; an explicit size also skips vLLM's warm-up pass under --enforce-eager).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.engines.vllm.binaries import VllmInstall, find_vllm
from engine.errors import SpectuneError
from foundation.live import LiveSet
from foundation.processes import HOST, free_port, process_group

GUARD = Path(__file__).with_name("guard.py")
LOG_TAIL_CHARS = 2000
STOP_GRACE_S = 10.0


class VllmServerError(SpectuneError):
    """A vLLM server that would not start, crashed or hung; the message ends with its log's tail."""


@dataclass(frozen=True)
class VllmConfig:
    """What one vLLM server is launched with: the target, its dtype and the speculation under test (if any)."""

    model: Path
    dtype: str = "float32"
    speculative: str | None = None  # the --speculative-config JSON (None: the target alone)
    max_model_len: int = 2048
    enforce_eager: bool = True  # no torch.compile warm-up (≈2 min of start-up on 2 cores)
    threads: int | None = None  # compute cores (None: every core of this machine)
    kv_cache_mib: int = 512
    max_num_seqs: int | None = None
    prefix_caching: bool = False  # off: a prompt sent again (another level, temperature) is not a cache hit
    seed: int = 0
    extra: tuple[str, ...] = ()

    @classmethod
    def with_speculation(cls, model: Path, speculative: dict[str, Any] | None, **common: Any) -> VllmConfig:
        text = json.dumps(speculative, sort_keys=True, separators=(",", ":")) if speculative else None
        return cls(model, speculative=text, **common)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "model": str(self.model), "extra": list(self.extra)})

    @classmethod
    def from_json(cls, text: str) -> VllmConfig:
        data = json.loads(text)
        return cls(**{**data, "model": Path(data["model"]), "extra": tuple(data.get("extra", ()))})

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        return json.loads(self.speculative) if self.speculative else None

    def flags(self) -> list[str]:
        """The server's flags after the module (host and port are added by VllmServer)."""
        flags = ["--model", str(self.model), "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                 "--seed", str(self.seed), "--kv-cache-memory-bytes", str(self.kv_cache_mib * 2**20),
                 "--disable-uvicorn-access-log"]  # fmt: skip
        if self.enforce_eager:
            flags.append("--enforce-eager")
        if not self.prefix_caching:
            flags.append("--no-enable-prefix-caching")
        if self.max_num_seqs:
            flags += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.speculative:
            flags += ["--speculative-config", self.speculative]
        return flags + list(self.extra)

    def environment(self, build: str) -> dict[str, str]:
        """What the CPU backend reads (engine docstring); nothing for a CUDA build."""
        if build != "cpu":
            return {}
        cores = self.threads or os.cpu_count() or 1
        return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0"}


_LIVE = LiveSet()  # every vLLM server this process started and has not stopped yet
stop_all = _LIVE.stop_all


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return json.loads(reply.read() or b"null")


@dataclass(eq=False)
class VllmServer:
    """One vLLM API server (and its EngineCore and Worker) on 127.0.0.1; a context manager."""

    config: VllmConfig
    install: VllmInstall | None = None
    port: int = 0
    start_timeout_s: float = 900.0
    proc: subprocess.Popen | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    startup_s: float | None = field(default=None, init=False)
    version: str | None = field(default=None, init=False)
    kernel: str | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        install = self.install or find_vllm()
        server = [*install.server_command(), *self.config.flags(), "--host", HOST, "--port", str(self.port)]
        return [str(install.python), str(GUARD), str(os.getpid()), f"{STOP_GRACE_S:g}", "--", *server]

    def start(self) -> VllmServer:
        model = Path(self.config.model)
        if not (model / "config.json").is_file():
            raise VllmServerError(f"vLLM model directory not found or not a model (no config.json): {model}")
        self.install = self.install or find_vllm()
        self.port = self.port or free_port()
        fd, name = tempfile.mkstemp(prefix="spectune-vllm-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        env = {**os.environ, **self.config.environment(self.install.build), "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        _LIVE.add(self)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)
        self.version = self._version()
        self.kernel = self._kernel()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise VllmServerError(f"vLLM exited with code {self.proc.returncode} while starting{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200 and _get_json(f"{self.url}/v1/models").get("data"):
                        return
            except (urllib.error.URLError, OSError, ValueError, AttributeError):
                pass
            time.sleep(0.5)
        raise VllmServerError(f"vLLM did not become healthy within {self.start_timeout_s:.0f} s{self._tail()}")

    def _version(self) -> str | None:
        try:
            return str(_get_json(f"{self.url}/version").get("version"))
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return None

    def _kernel(self) -> str | None:
        """The CPU kernel library the Worker mapped (vllm/_C_AVX512, _C_AVX2, or _C: AVX-512 with BF16/AMX)."""
        found: set[str] = set()
        for pid in self.processes():
            try:
                maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
            except OSError:
                continue
            found |= set(re.findall(r"vllm/(_C(?:_AVX512|_AVX2)?)\.abi3\.so", maps))
        for name, label in (("_C_AVX512", "AVX512"), ("_C_AVX2", "AVX2"), ("_C", "AVX512_BF16")):
            if name in found:
                return f"{label} (vllm/{name}.abi3.so)"
        return None

    def processes(self) -> list[int]:
        """The live processes of this server's group: the guard, the API server, the EngineCore, the Worker."""
        if self.proc is None:
            return []
        return process_group(self.proc.pid)

    def healthy(self) -> bool:
        """Whether /health answers 200 (vLLM answers 503 once its engine is dead)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise VllmServerError(f"vLLM exited with code {self.proc.returncode}{self._tail()}")

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        lines = [line for line in self.log_text().splitlines() if "Route:" not in line]
        return "\n".join(lines)[-chars:]

    def _tail(self) -> str:
        tail = self.log_tail().strip()
        return f"; its log ends:\n{tail}" if tail else ""

    def stop(self, timeout_s: float = STOP_GRACE_S + 10.0) -> None:
        """SIGTERM the guard (it stops vLLM and sweeps the group), SIGKILL the group after `timeout_s`."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        try:
            terminate_group(proc, timeout_s)
        finally:
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.stop()


def terminate_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM the guard and wait; then SIGKILL every process left in its group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
    for pid in process_group(proc.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait()
