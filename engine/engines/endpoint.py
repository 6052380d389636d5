"""A running OpenAI-compatible deployment as a session engine: no local model, draft or γ; its own settings."""

from __future__ import annotations

from engine.endpoint.settings import EndpointSessionSettings
from engine.errors import SettingsError
from engine.session.spec import SessionSpec


def validate_endpoint(s: SessionSpec, n_prompts: int | None = None) -> None:
    """The endpoint's settings and caps instead of a model's."""
    if s.max_new_tokens < 1:
        raise SettingsError(f"max new tokens = {s.max_new_tokens}: must be at least 1")
    EndpointSessionSettings.from_dict(s.endpoint).validate(s.max_new_tokens, (s.temperatures or [0.0])[0])
    if s.policies:
        raise SettingsError("speculation policies run in spectune's loop and llama.cpp: choose one of those engines")
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError("the prompt set is empty: upload or choose prompts first")
