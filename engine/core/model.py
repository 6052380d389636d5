"""LoadedModel: the handle the loop decodes with (a causal LM, its tokenizer, device and dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, ready to decode.

    `compiled` is its compiled loop (engine.core.compiled.CompiledLoop) while a session decodes with one: every
    forward of a short width then runs compiled over a static KV cache. It stays with the model in the worker's
    pool, so the next session with the same model and widths pays no compile."""

    ref: str
    model: Any
    tokenizer: Any
    device: str
    dtype: str
    compiled: Any = None

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 32768) or 32768)

    @property
    def loop(self) -> str:
        """Which loop this model decodes in now: "compiled" or "eager"."""
        return "compiled" if self.compiled is not None and self.compiled.active else "eager"
