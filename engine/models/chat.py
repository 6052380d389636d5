"""A user prompt as the token ids a model decodes from: wrapped in its chat template when it has one."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, text: str, chat_template: bool) -> list[int]:
    """Token ids for a user prompt, wrapped in the model's chat template when it has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(text, add_special_tokens=True))
