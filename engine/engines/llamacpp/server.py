"""A llama-server we start ourselves: launch flags, start on a free loopback port, wait for health, stop.

Every server runs in its own process group and is registered while alive, so a worker that is told to
stop (or a test) can stop them all; none is ever left behind. A server that fails to start, exits or stops
answering raises ServerError carrying the tail of its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from engine.engines.llamacpp import kernels
from engine.engines.llamacpp.binaries import LlamaBuild, find_llama
from engine.engines.llamacpp.draft_stats import LOG_VERBOSITY
from engine.errors import SpectuneError
from foundation.live import LiveSet
from foundation.processes import HOST, die_with_parent, free_port

LOG_TAIL_CHARS = 1500
FlagForm = Literal["launch", "user", "legacy"]  # ServerConfig.speculation_flags


class ServerError(SpectuneError):
    """A llama-server that would not start, crashed or hung; the message ends with its log's tail."""


@dataclass(frozen=True)
class ServerConfig:
    """What one llama-server is launched with: the target, and the speculation under test (if any)."""

    model: Path
    draft: Path | None = None  # a draft GGUF (spec type draft-simple)
    spec_type: str | None = None  # None (target alone), "draft-simple" or "ngram-simple"
    draft_n_max: int | None = None  # γ: tokens drafted per step
    draft_n_min: int | None = None
    draft_p_min: float | None = None  # stop drafting when the draft's own confidence falls below this
    ngram_size_n: int | None = None  # ngram-simple: lookup n-gram length
    ngram_size_m: int | None = None  # ngram-simple: longest draft m-gram
    threads: int | None = None
    ctx_size: int = 4096
    parallel: int = 1
    extra: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        """The command-line flags after the binary (host and port are added by ManagedServer)."""
        flags = ["-m", str(self.model), "-c", str(self.ctx_size), "-np", str(self.parallel), "--metrics",
                 "--no-webui", "--no-warmup"]  # fmt: skip
        if self.threads:
            flags += ["-t", str(self.threads)]
        flags += self.speculation_flags()
        if self.threads and self.spec_type == "draft-simple":
            flags += ["-td", str(self.threads)]
        if self.spec_type == "draft-simple":  # the draft's time in the loop (engine.engines.llamacpp.draft_stats)
            flags += list(LOG_VERBOSITY)
        return flags + list(self.extra)

    def speculation_flags(self, form: FlagForm = "launch") -> list[str]:
        """The flags that choose and tune speculation (none for the target alone); built here only.

        form "launch": what ManagedServer passes. "user": what an export adds to a user's own llama-server command
        line: --spec-type first, the draft as --spec-draft-model, and for ngram-simple its size-n and size-m alone
        (ngram-simple drafts size-m tokens and reads neither n-max nor n-min). "legacy": builds before 8955 (llama.cpp
        PR #22397), -md with --draft-max / --draft-min / --draft-p-min; those builds have no ngram-simple."""
        if self.spec_type is None:
            return []
        if self.spec_type not in ("draft-simple", "ngram-simple"):
            raise ServerError(f"unsupported spec type {self.spec_type!r}: use draft-simple or ngram-simple")
        if self.spec_type == "draft-simple" and self.draft is None:
            raise ServerError("spec type draft-simple needs a draft model")
        if form == "legacy":
            if self.spec_type == "ngram-simple":
                raise ServerError("llama.cpp builds before 8955 have no ngram-simple speculation")
            return ["-md", str(self.draft), *self._draft_limits("--draft-max", "--draft-min", "--draft-p-min")]
        if self.spec_type == "ngram-simple":
            flags = ["--spec-type", "ngram-simple"]
            if self.ngram_size_n is not None:
                flags += ["--spec-ngram-simple-size-n", str(self.ngram_size_n)]
            if self.ngram_size_m is not None:
                flags += ["--spec-ngram-simple-size-m", str(self.ngram_size_m)]
            if form == "user":
                return flags
        elif form == "user":
            flags = ["--spec-type", "draft-simple", "--spec-draft-model", str(self.draft)]
        else:
            flags = ["-md", str(self.draft), "--spec-type", "draft-simple"]
        return flags + self._draft_limits("--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min")

    def _draft_limits(self, n_max: str, n_min: str, p_min: str) -> list[str]:
        """The draft length and confidence limits that are set, under the given flag names."""
        flags: list[str] = []
        if self.draft_n_max is not None:
            flags += [n_max, str(self.draft_n_max)]
        if self.draft_n_min is not None:
            flags += [n_min, str(self.draft_n_min)]
        if self.draft_p_min is not None:
            flags += [p_min, f"{self.draft_p_min:g}"]
        return flags


_LIVE = LiveSet()  # every server this process started and has not stopped yet
stop_all = _LIVE.stop_all


@dataclass(eq=False)
class ManagedServer:
    """One llama-server process on 127.0.0.1; use as a context manager (`with ManagedServer(cfg) as s:`)."""

    config: ServerConfig
    build: LlamaBuild | None = None
    port: int = 0
    start_timeout_s: float = 180.0
    should_stop: Callable[[], bool] | None = None  # asked while it starts: a stop does not wait for it to load
    proc: subprocess.Popen | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    no_repack: bool = field(default=False, init=False)  # engine.engines.llamacpp.kernels: started without repacking
    _exit_code: int | None = field(default=None, init=False)  # how the last start attempt's process ended

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def command(self) -> list[str]:
        build = self.build or find_llama()
        kernel = list(kernels.SERVER_FLAGS) if self.no_repack else []
        return [str(build.server), *self.config.flags(), *kernel, "--host", HOST, "--port", str(self.port)]

    def start(self) -> ManagedServer:
        """Start and wait until healthy. A server that dies by an instruction fault while starting is started once
        more without repacked weights; when that one serves, this build runs so on this CPU from then on."""
        for path, role in ((self.config.model, "model"), (self.config.draft, "draft")):
            if path is not None and not Path(path).is_file():
                raise ServerError(f"llama-server {role} file not found: {path}")
        self.build = self.build or find_llama()
        self.port = self.port or free_port()
        self.no_repack = kernels.repack_broken(self.build.server_sha256) is not None
        try:
            return self._launch()
        except ServerError:
            code = self._exit_code
            if self.no_repack or not kernels.crashed(code):
                raise
        self.no_repack = True
        self._launch()
        kernels.mark_repack_broken(self.build.server_sha256, kernels.crash_line("llama-server", int(code or 0)))
        return self

    def _launch(self) -> ManagedServer:
        fd, name = tempfile.mkstemp(prefix="spectune-llama-server-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        _LIVE.add(self)
        try:
            self._wait_healthy()
        except BaseException:
            self._exit_code = self.proc.poll() if self.proc is not None else None
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.should_stop is not None and self.should_stop():
                raise ServerError("llama-server was stopped while it started")
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(f"llama-server exited with code {self.proc.returncode} while starting{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200 and json.loads(reply.read() or b"{}").get("status") == "ok":
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise ServerError(f"llama-server did not become healthy within {self.start_timeout_s:.0f} s{self._tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """ServerError with the log tail when the process has gone."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(f"llama-server exited with code {self.proc.returncode}{self._tail()}")

    def log_errors(self) -> list[str]:
        """The error lines of the log (llama.cpp marks them ' E ')."""
        if self.log_path is None or not self.log_path.exists():
            return []
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if " E " in line]

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log (its last `chars` bytes, read from the end: the log may be long)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode(errors="replace")

    def _tail(self) -> str:
        tail = self.log_tail().strip()
        return f"; its log ends:\n{tail}" if tail else ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL after `timeout_s`; idempotent."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        try:
            self._terminate(proc, timeout_s)
        finally:
            if self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    @staticmethod
    def _terminate(proc: subprocess.Popen, timeout_s: float) -> None:
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, timeout_s)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            proc.wait()

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # a server is never left behind, even by a caller that forgot to stop it
        if getattr(self, "proc", None) is not None:
            self.stop()


@contextmanager
def running(config: ServerConfig, **kwargs: object) -> Iterator[ManagedServer]:
    server = ManagedServer(config, **kwargs)  # type: ignore[arg-type]
    with server:
        yield server
