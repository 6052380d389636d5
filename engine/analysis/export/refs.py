"""Model references as each engine loads them, and whether a draft tokenizes like its target.

A bundled alias becomes what each engine loads: the assembled GGUF for llama.cpp, the official Hugging Face
repository it was quantized from for the others (the dequantized local copy spectune measured is named as the
exact-weights alternative). A reference an engine cannot load becomes a `<placeholder>` with a note saying what
to supply.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.models.bundled import BUNDLED, DEFAULT_TARGET
from engine.models.loading import converted_dir
from foundation.paths import model_cache_dir

# The official repositories the bundled GGUFs were quantized from (engine.models.bundled.BUNDLED).
HF_ORIGIN = {
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


@dataclass(frozen=True)
class EngineRef:
    """A model as one engine loads it; `placeholder` when the user must put a real value in its place."""

    value: str
    notes: tuple[str, ...] = ()
    placeholder: bool = False


def bundled_gguf_path(name: str) -> Path:
    """Where engine.models.bundled.assembled_gguf keeps a bundled model's verified GGUF (nothing is assembled here)."""
    return model_cache_dir() / "gguf" / BUNDLED[name].gguf_name


def prepared_gguf(ref: str) -> Path | None:
    """The GGUF file of `ref` as it is on disk now (a bundled model already assembled, or a file path), else None;
    nothing is assembled: what only estimates must not do a prepare's work."""
    path = bundled_gguf_path(ref) if ref in BUNDLED else Path(ref).expanduser()
    return path if path.is_file() else None


def engine_ref(ref: str, weights: str) -> EngineRef:
    """`ref` (a bundled alias, a .gguf file, a model directory or a hub id) as an engine loading `weights` takes it.

    weights "gguf" (llama.cpp): a GGUF file; "hf" (vLLM, SGLang, transformers): a Hugging Face id or a local
    checkpoint directory.
    """
    if weights not in ("gguf", "hf"):
        raise ValueError(f"weights must be 'gguf' or 'hf', got {weights!r}")
    if ref in BUNDLED:
        return _bundled_ref(ref, weights)
    is_gguf = ref.lower().endswith(".gguf")
    if weights == "gguf":
        if is_gguf:
            return EngineRef(ref)
        note = f"llama.cpp loads GGUF files: convert {ref} to GGUF (llama.cpp's convert_hf_to_gguf.py) and put its path"
        return EngineRef(f"<{ref} as .gguf>", (f"you must supply: {note} in place of <{ref} as .gguf>",), True)
    if is_gguf:
        name = Path(ref).name
        note = (
            f"{ref} is a GGUF file; this engine loads a Hugging Face checkpoint: put the id or directory of the "
            f"model it was made from in place of <checkpoint of {name}>"
        )
        return EngineRef(f"<checkpoint of {name}>", (f"you must supply: {note}",), True)
    return EngineRef(ref)


def _bundled_ref(ref: str, weights: str) -> EngineRef:
    if weights == "gguf":
        path = bundled_gguf_path(ref)
        return EngineRef(str(path), (f"{path}: the bundled {ref} GGUF spectune measured (`make setup` makes it)",))
    origin = HF_ORIGIN[ref]
    return EngineRef(
        origin,
        (
            f"{origin}: the official checkpoint of the bundled {ref}; spectune measured its quantized GGUF, so "
            f"acceptance can differ slightly; the exact weights measured, dequantized: {converted_dir(ref)} "
            "(`make setup` writes it)",
        ),
    )


def target_value(target: str | None, weights: str, placeholder: str) -> tuple[str, tuple[str, ...]]:
    """The target as an engine loading `weights` takes it, and the notes on that reference; `placeholder` when no
    target is known."""
    if target is None:
        return placeholder, ()
    ref = engine_ref(target, weights)
    return ref.value, ref.notes


def other_tokenizer(draft_ref: str | None, target: str | None) -> tuple[bool | None, str | None]:
    """Whether the draft tokenizes differently from the target: True/False when both are known, else None.

    Known means bundled (their tokenizer families are recorded). Without a target, a bundled draft is
    compared with spectune's default target, and the second value says that this was assumed.
    """
    draft = BUNDLED.get(draft_ref or "")
    if draft is None:
        return None, None
    assumed = None
    if target is None:
        target, assumed = DEFAULT_TARGET, f"target assumed to be spectune's default {DEFAULT_TARGET}"
    tgt = BUNDLED.get(target)
    if tgt is None:
        return None, None
    return draft.tokenizer_family != tgt.tokenizer_family, assumed
