"""LoadedModel: the handle the loop decodes with (a causal LM, its tokenizer, device and dtype)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, ready to decode."""

    ref: str
    model: Any
    tokenizer: Any
    device: str
    dtype: str

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 32768) or 32768)
