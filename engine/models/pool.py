"""The model pool: loaded models kept in memory between sessions."""

from __future__ import annotations

from engine.core.model import LoadedModel
from engine.models.loading import load_model
from engine.models.tiny import load_tiny


class ModelPool:
    """Loaded models kept in memory between sessions (the worker's reason to be long-lived)."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str, str], LoadedModel] = {}

    def get(self, ref: str, dtype: str, device: str = "auto", trust_remote_code: bool = False) -> LoadedModel:
        key = (ref, dtype, device)
        if key not in self._models:
            if ref.startswith("tiny:"):
                self._models[key] = load_tiny(ref, dtype=dtype, device="cpu" if device == "auto" else device)
            else:
                self._models[key] = load_model(ref, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        return self._models[key]

    def clear(self) -> None:
        self._models.clear()
