"""The KV cache: one forward step over a cache, cropping it back, a new cache, and the device sync."""

from __future__ import annotations

import torch

from engine.core.model import LoadedModel


def forward_step(model: LoadedModel, input_ids: list[int], cache: object, keep: int) -> torch.Tensor:
    """One forward over `input_ids` appended to `cache`; logits of the last `keep` positions, (keep, V)."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    out = model.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def crop_to(cache: object, length: int) -> None:
    """Roll a KV cache back to `length` positions (transformers 5 crops by a negative count)."""
    current = cache.get_seq_length()
    if current > length:
        cache.crop(length - current)


def new_cache(config: object) -> object:
    """An empty KV cache for a model with this config."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def sync(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (a no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
