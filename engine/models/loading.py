"""Resolve a model reference (bundled name, .gguf path, model directory, hub id) and load it.

Dequantising a GGUF takes about a minute, so every GGUF is converted once into a safetensors
directory in the model cache and loaded from there afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from engine.core.model import LoadedModel
from engine.errors import ModelError
from engine.models.bundled import BUNDLED, assembled_gguf
from foundation.paths import model_cache_dir

DTYPES = ("float32", "bfloat16", "float16")
_LOCK = threading.Lock()


def pick_device(requested: str | None = None) -> str:
    import torch

    if requested and requested != "auto":
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError("device 'cuda' was requested but no CUDA GPU is available")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ModelError(f"unknown dtype '{name}'; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def _check_gguf_header(path: Path) -> None:
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (bad magic bytes)")
    try:
        from gguf import GGUFReader

        GGUFReader(str(path))
    except Exception as exc:  # gguf raises assorted errors on truncated files
        raise ModelError(f"{path}: GGUF file is truncated or corrupt ({type(exc).__name__}: {exc})") from exc


def _convert_gguf(gguf_path: Path, out_dir: Path, source_note: dict[str, Any]) -> Path:
    """Dequantise a GGUF into a safetensors directory (bf16) that loads in seconds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    marker = out_dir / "spectune-source.json"
    if marker.is_file():
        return out_dir
    note = f"  converting {gguf_path.name} to a safetensors cache (one-off, about a minute)..."
    print(note, file=sys.stderr, flush=True)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=gguf_path.name,
            dtype=torch.bfloat16,
            # dense weights: packed GGUF blocks cannot be saved and run slower on CPU
            quantization_config=GgufConfig(dequantize=True),
        )
    except Exception as exc:
        raise ModelError(f"{gguf_path}: transformers could not load this GGUF ({type(exc).__name__}: {exc})") from exc
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / "spectune-source.json").write_text(json.dumps(source_note, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    print(f"  cached at {out_dir}", file=sys.stderr, flush=True)
    return out_dir


def converted_dir(name: str) -> Path:
    """Where a bundled model's safetensors cache lives (it may not exist yet)."""
    return model_cache_dir() / "converted" / f"{name}-{BUNDLED[name].sha256[:12]}"


def prepare_bundled(name: str) -> Path:
    """Assemble, verify and convert one bundled model; return its safetensors directory."""
    model = BUNDLED[name]
    out_dir = converted_dir(name)
    if (out_dir / "spectune-source.json").is_file():
        return out_dir
    gguf = assembled_gguf(model)
    return _convert_gguf(gguf, out_dir, {"bundled": name, "sha256": model.sha256})


def resolve_model_dir(ref: str) -> str:
    """Turn a model reference into something from_pretrained can load without the network."""
    if not ref or not ref.strip():
        raise ModelError("empty model reference")
    if ref in BUNDLED:
        return str(prepare_bundled(ref))
    path = Path(ref).expanduser()
    if ref.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model file not found: {ref}")
        _check_gguf_header(path)
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        out_dir = model_cache_dir() / "converted" / f"{path.stem}-{key}"
        return str(_convert_gguf(path, out_dir, {"gguf": str(path.resolve()), "size": stat.st_size}))
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"{ref}: not a model directory or .gguf file")
        if not (path / "config.json").is_file():
            raise ModelError(f"{ref}: directory is not a model (no config.json)")
        return str(path)
    if ref.startswith((".", "/", "~")) or os.sep in ref and ref.count("/") > 1:
        raise ModelError(f"model path not found: {ref}")
    return ref  # a hub id: loaded with local_files_only below


def load_model(
    ref: str,
    dtype: str = "bfloat16",
    device: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a model and tokenizer; every failure becomes one clear ModelError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    tdtype = torch_dtype(dtype)
    with _LOCK:
        location = resolve_model_dir(ref)
        is_hub_id = location == ref and not Path(ref).exists()
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if is_hub_id:
            kwargs["local_files_only"] = True
        try:
            tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(location, dtype=tdtype, **kwargs)
        except (OSError, ValueError) as exc:
            if is_hub_id:
                raise ModelError(
                    f"'{ref}' is not a bundled model, a local path, or a model id in the local cache; "
                    "it cannot be fetched offline"
                ) from exc
            raise ModelError(f"{ref}: could not load model ({exc})".splitlines()[0]) from exc
        except MemoryError as exc:
            raise ModelError(f"{ref}: out of memory while loading the model") from exc
        except Exception as exc:  # unknown architectures, broken configs: still one clear line
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ModelError(f"{ref}: could not load model ({type(exc).__name__}: {first})") from exc
    model.to(dev)
    model.eval()
    loaded = LoadedModel(ref=ref, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)
    warm_up(loaded)
    return loaded


def warm_up(loaded: LoadedModel, steps: int = 4) -> None:
    """Run a few forwards so that timings never include paging in mmapped weights or kernel set-up.

    Without this the first decode steps after a load run 5-7x slower on CPU and poison the
    baseline, the verify cost curve and c.
    """
    import torch
    from transformers import DynamicCache

    ids = torch.arange(16, dtype=torch.long, device=loaded.device).unsqueeze(0) % loaded.vocab_size
    with torch.inference_mode():
        cache = DynamicCache(config=loaded.model.config)
        loaded.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for k in (1, 1, 2, 4, 8)[: steps + 1]:
            loaded.model(input_ids=ids[:, :k], cache=cache, use_cache=True, logits_to_keep=k)
