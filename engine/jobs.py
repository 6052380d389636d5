"""Queueing sessions: validate settings and model references up front, then hand them to the worker.

Everything here is cheap (no model weights are loaded), so the dashboard can call it in its own
script run: a bad γ or a missing model path is refused before a session ever exists.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from engine.bundled import BUNDLED
from engine.errors import ModelError, SettingsError
from engine.paths import default_database_url
from engine.settings import SweepSettings, validate


def open_app_store(url: str | None = None) -> Any:
    from store import open_store

    return open_store(url or default_database_url())


def check_model_ref(ref: str, role: str = "model") -> str | None:
    """An error message for a model reference that cannot work offline, or None if it looks loadable."""
    ref = (ref or "").strip()
    if not ref:
        return f"no {role} given"
    if ref in BUNDLED:
        return None
    if ref.startswith("tiny:"):
        from engine.tiny import parse_tiny_ref

        try:
            parse_tiny_ref(ref)
        except ModelError as exc:
            return str(exc)
        return None
    if role == "draft" and ref == "none":
        return None
    if role == "draft" and (ref == "ngram" or ref.startswith("ngram:")):
        from engine.settings import parse_ngram_spec

        try:
            parse_ngram_spec(ref)
        except SettingsError as exc:
            return str(exc)
        return None
    path = Path(ref).expanduser()
    if ref.endswith(".gguf"):
        if not path.is_file():
            return f"{role} file not found: {ref}"
        from engine.loading import _check_gguf_header

        try:
            _check_gguf_header(path)
        except ModelError as exc:
            return str(exc)
        return None
    if path.exists():
        if not path.is_dir():
            return f"{ref}: not a model directory or .gguf file"
        if not (path / "config.json").is_file():
            return f"{ref}: directory is not a model (no config.json)"
        return None
    if ref.startswith((".", "/", "~")):
        return f"{role} path not found: {ref}"
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(ref, "config.json"), str):
            return None
    except Exception:  # an id huggingface_hub rejects as malformed
        pass
    return (
        f"'{ref}' is not a bundled model, a local path, or a model id in the local cache; "
        "it cannot be fetched offline"
    )


def check_same_tokenizer_family(target: str, draft: str) -> str | None:
    """Bundled pairs whose tokenizers differ are allowed (re-tokenised drafting) but worth a note."""
    if target in BUNDLED and draft in BUNDLED and BUNDLED[target].tokenizer_family != BUNDLED[draft].tokenizer_family:
        return f"draft {draft} uses a different tokenizer from {target}: proposals cross over as text"
    return None


def validate_submission(settings: SweepSettings, n_prompts: int) -> None:
    """Every check that needs no model weights: settings ranges and that each model reference can load."""
    validate(settings, n_prompts)
    problem = check_model_ref(settings.target, "target")
    if problem:
        raise ModelError(problem)
    for draft in settings.drafts:
        problem = check_model_ref(draft, "draft")
        if problem:
            raise ModelError(problem)


def submit_session(
    store: Any,
    settings: SweepSettings,
    prompt_set_id: int,
    n_prompts: int | None = None,
    name: str | None = None,
    options: dict[str, Any] | None = None,
) -> int:
    """Validate and queue a session; raises SettingsError/ModelError with one clear line."""
    prompt_set = store.get_prompt_set(prompt_set_id)
    if prompt_set is None:
        raise SettingsError(f"prompt set {prompt_set_id} does not exist")
    available = int(prompt_set.get("n_prompts") or 0)
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError(f"number of prompts = {n_prompts}: must be at least 1")
    count = min(n_prompts or available, available)
    validate_submission(settings, count)
    opts = {
        "chat_template": settings.chat_template,
        "measure_verify_cost": settings.measure_verify_cost,
        "trust_remote_code": settings.trust_remote_code,
    } | (options or {})
    named = {"name": name.strip()} if name and name.strip() else {}
    return store.create_session(
        **named,
        target=settings.target,
        drafts=list(settings.drafts),
        gammas=list(settings.gammas),
        temperatures=list(settings.temperatures),
        top_p=settings.top_p,
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
        dtype=settings.dtype,
        device=settings.device,
        prompt_set_id=prompt_set_id,
        n_prompts=count,
        seed=settings.seed,
        options=opts,
    )


def settings_from_session(session: dict[str, Any]) -> SweepSettings:
    opts = session.get("options") or {}
    return SweepSettings(
        target=session["target"],
        drafts=list(session["drafts"]),
        gammas=[int(g) for g in session["gammas"]],
        temperatures=[float(t) for t in session["temperatures"]],
        max_new_tokens=int(session["max_new_tokens"]),
        top_k=int(session.get("top_k") or 0),
        top_p=float(session.get("top_p") or 1.0),
        seed=int(session.get("seed") or 0),
        dtype=session.get("dtype") or "bfloat16",
        device=session.get("device") or "auto",
        chat_template=bool(opts.get("chat_template", True)),
        measure_verify_cost=bool(opts.get("measure_verify_cost", True)),
        trust_remote_code=bool(opts.get("trust_remote_code", False)),
    )


@functools.lru_cache(maxsize=8)
def _tokenizer(ref: str) -> Any:
    if ref.startswith("tiny:"):
        from engine.tiny import parse_tiny_ref, tiny_tokenizer

        return tiny_tokenizer(parse_tiny_ref(ref)[1])
    from transformers import AutoTokenizer

    from engine.loading import converted_dir

    if ref in BUNDLED:
        location = converted_dir(ref)
        if not (location / "spectune-source.json").is_file():
            raise ModelError(f"{ref} is not prepared yet (run `python -m engine prepare`)")
        return AutoTokenizer.from_pretrained(str(location), local_files_only=True)
    if ref.endswith(".gguf"):
        raise ModelError("token strings for a .gguf reference need its converted cache; showing plain text")
    return AutoTokenizer.from_pretrained(ref, local_files_only=True)


def token_strings(target_ref: str, token_ids: list[int]) -> list[str]:
    """Per-token text for highlighting; loads only the tokenizer (cheap), never the weights."""
    tok = _tokenizer(target_ref)
    return [tok.decode([t], skip_special_tokens=False) for t in token_ids]
