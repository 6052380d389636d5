"""Queueing sessions: validate settings and model references up front, then hand them to the worker.

Everything here is cheap (no model weights are loaded), so the dashboard can call it in its own
script run: a bad γ or a missing model path is refused before a session ever exists.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.drafts.kinds import draft_kind
from engine.engines.registry import get as get_engine
from engine.engines.registry import validate
from engine.errors import ModelError, SettingsError
from engine.models.bundled import BUNDLED
from engine.service.sizing.plan import planned_decodes
from engine.session.sampling import session_prompts
from engine.session.spec import SessionSpec, check_context
from foundation.paths import default_database_url


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
        from engine.models.tiny import parse_tiny_ref

        try:
            parse_tiny_ref(ref)
        except ModelError as exc:
            return str(exc)
        return None
    path = Path(ref).expanduser()
    if ref.endswith(".gguf"):
        if not path.is_file():
            return f"{role} file not found: {ref}"
        from engine.models.loading import _check_gguf_header

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
        f"'{ref}' is not a bundled model, a local path, or a model id in the local cache; it cannot be fetched offline"
    )


def validate_submission(settings: SessionSpec, n_prompts: int) -> None:
    """Every check that needs no model weights: settings ranges and that each model reference can load."""
    validate(settings, n_prompts)
    problem = check_model_ref(settings.target, "target")
    if problem:
        raise ModelError(problem)
    for draft in settings.drafts:  # a kind without a model had its reference checked by its kind (validate)
        problem = check_model_ref(draft, "draft") if draft_kind(draft).needs_model else None
        if problem:
            raise ModelError(problem)


def prompt_count(store: Any, prompt_set_id: int, n_prompts: int | None) -> int:
    """How many prompts of the set a session decodes: n_prompts (all when None), at most the set's size."""
    prompt_set = store.get_prompt_set(prompt_set_id)
    if prompt_set is None:
        raise SettingsError(f"prompt set {prompt_set_id} does not exist")
    available = int(prompt_set.get("n_prompts") or 0)
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError(f"number of prompts = {n_prompts}: must be at least 1")
    return min(n_prompts or available, available)


def submit_session(
    store: Any,
    settings: SessionSpec,
    prompt_set_id: int,
    n_prompts: int | None = None,
    name: str | None = None,
) -> int:
    """Validate and queue a session; raises SettingsError/ModelError with one clear line."""
    count = prompt_count(store, prompt_set_id, n_prompts)
    validate_submission(settings, count)
    if get_engine(settings.engine).in_process:  # the prompts the worker will decode, numbered as in the set
        stored = {
            "prompt_set_id": prompt_set_id,
            "n_prompts": count,
            "options": {"prompt_sample": settings.prompt_sample},
        }
        chosen = session_prompts(store.get_prompts, stored)
        check_prompts_fit(settings, [(f"prompt {int(p['position']) + 1}", str(p["text"])) for p in chosen])
    named = {"name": name.strip()} if name and name.strip() else {}
    session_id = store.create_session(**named, **settings.to_row(), prompt_set_id=prompt_set_id, n_prompts=count)
    store.set_progress(session_id, 0, planned_decodes(settings, count))
    return session_id


def context_limit(ref: str) -> int | None:
    """The model's context in tokens as its loaded config will say it (LoadedModel.max_context), read from its
    config.json without the weights; None where no config is at hand (a .gguf, a bundled model not prepared yet)."""
    if ref.startswith("tiny:"):
        from engine.models.tiny import TINY_CONTEXT

        return TINY_CONTEXT
    config: Any = None
    if ref in BUNDLED:
        from engine.models.loading import converted_dir

        config = converted_dir(ref) / "config.json"
    elif ref.endswith(".gguf"):
        return None
    elif Path(ref).expanduser().is_dir():
        config = Path(ref).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(ref, "config.json")
            config = Path(found) if isinstance(found, str) else None
        except Exception:  # noqa: BLE001 - an id huggingface_hub rejects: check_model_ref has said so
            return None
    try:
        data = json.loads(Path(config).read_text(encoding="utf-8")) if config is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return int(data.get("max_position_embeddings") or 32768)


def check_prompts_fit(settings: SessionSpec, prompts: Sequence[tuple[str, str]]) -> None:
    """Each (label, text) prompt and its max new tokens within the target's context, as the loop checks once the
    target is loaded (engine.session.spec.check_context), but before anything is queued: with the tokenizer and
    config alone. `label` names the prompt as the user numbers it ("prompt 3"). Skipped for an engine that does not
    decode in this process, and where no tokenizer or config is at hand (the loop then checks as it loads)."""
    if not get_engine(settings.engine).in_process:
        return
    limit = context_limit(settings.target)
    if limit is None:
        return
    try:
        tokenizer = _tokenizer(settings.target)
    except Exception:  # noqa: BLE001 - not prepared, not cached, or remote code: the loop checks as it loads
        return
    from engine.models.chat import encode_prompt

    for label, text in prompts:
        ids = encode_prompt(tokenizer, text, settings.chat_template)
        check_context(len(ids), settings.max_new_tokens, limit, label)


@functools.lru_cache(maxsize=8)
def _tokenizer(ref: str) -> Any:
    if ref.startswith("tiny:"):
        from engine.models.tiny import parse_tiny_ref, tiny_tokenizer

        return tiny_tokenizer(parse_tiny_ref(ref)[1])
    from transformers import AutoTokenizer

    from engine.models.loading import converted_dir

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
    return [tok.decode([t], skip_special_tokens=True) for t in token_ids]  # no raw <|im_end|> in the output
