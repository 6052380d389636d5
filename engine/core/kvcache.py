"""The KV cache: one forward step over a cache, cropping it back, a cache for a sequence, and the device sync.

In the eager loop a sequence's cache is a DynamicCache that grows and is cropped by slicing. In the compiled loop
(engine.core.compiled) it is one of the model's static sequences: every forward goes through the compiled loop (a
compiled width as its static step, a longer one eagerly into the same buffers), and a crop writes the sequence's
device position in place, reading nothing back from the device."""

from __future__ import annotations

import torch

from engine.core.model import LoadedModel


def forward_step(model: LoadedModel, input_ids: list[int], cache: object, keep: int) -> torch.Tensor:
    """One forward over `input_ids` appended to `cache`; logits of the last `keep` positions, (keep, V)."""
    compiled = model.compiled
    if compiled is not None and compiled.owns(cache):  # copied into its static input buffer from the host
        return compiled.forward(torch.tensor([input_ids], dtype=torch.long), cache, keep)
    ids = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    out = model.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


@torch.inference_mode()
def top_after(model: LoadedModel, input_ids: list[int], k: int) -> tuple[list[float], list[int]]:
    """The model's top-k logits for the token after `input_ids` (values, token ids, best first), from one eager
    forward over them into a cache of its own."""
    logits = forward_step(model, input_ids, new_cache(model.model.config), 1)[-1].float()
    top = torch.topk(logits, min(k, int(logits.shape[-1])))
    return [float(v) for v in top.values.tolist()], [int(i) for i in top.indices.tolist()]


def crop_to(cache: object, length: int) -> None:
    """Roll a KV cache back to `length` positions (transformers 5 crops by a negative count; a static cache moves
    its position back and copies nothing)."""
    rollback = getattr(cache, "rollback", None)
    if rollback is not None:  # a static sequence: the position is written in place, nothing is read back
        rollback(length)
        return
    current = int(cache.get_seq_length())
    if current > length:
        cache.crop(length - current)


def new_cache(config: object) -> object:
    """An empty eager KV cache for a model with this config."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def sequence_cache(model: LoadedModel, slot: str = "target") -> object:
    """An empty KV cache for one sequence in the loop `model` decodes in: its static cache for `slot` ("target", or
    "draft" where the model drafts), emptied, when it is compiled; else a new eager cache."""
    if model.compiled is not None and model.compiled.active:
        return model.compiled.empty_cache(slot)
    return new_cache(model.model.config)


def sync(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (a no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
