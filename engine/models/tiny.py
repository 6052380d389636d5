"""Tiny random causal LMs built in-process, for tests, soak runs and demos where the model does not matter.

They use a real character-level tokenizer (tokenizers' WordLevel over single characters), so every
code path — chat-free encoding, decoding to text, the engine's loops — runs exactly as with a real
model, in milliseconds. Reference them as "tiny:<seed>" or "tiny:<seed>:<vocab>:<layers>:<hidden>"; a "~<noise>" suffix
("tiny:1~0.05") gives the same model with Gaussian noise of that relative size on every weight —
a draft that agrees with its target often but not always, like a real distilled draft.
"""

from __future__ import annotations

from engine.core.model import LoadedModel
from engine.errors import ModelError
from engine.models.loading import warm_up

TINY_CONTEXT = 4096  # every tiny model's context in tokens (max_position_embeddings)
ALPHABET = list("abcdefghijklmnopqrstuvwxyz .,!?'\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def tiny_tokenizer(vocab: int) -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ALPHABET[: max(2, vocab - 2)]
    table = {"<unk>": 0, "<eos>": 1} | {c: i + 2 for i, c in enumerate(chars)}
    core = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    from tokenizers import decoders

    core.decoder = decoders.Fuse()
    tok._tokenizer.decoder = decoders.Fuse()
    return tok


def parse_tiny_ref(ref: str) -> tuple[int, int, int, int, float]:
    base, _, noise_text = ref.partition("~")
    try:
        noise = float(noise_text) if noise_text else 0.0
    except ValueError as exc:
        raise ModelError(f"bad noise in tiny model reference '{ref}'") from exc
    parts = base.split(":")[1:]
    try:
        values = [int(x) for x in parts]
    except ValueError as exc:
        raise ModelError(f"bad tiny model reference '{ref}'; use tiny:SEED[:VOCAB:LAYERS:HIDDEN]") from exc
    defaults = [0, 48, 2, 64]
    values += defaults[len(values) :]
    seed, vocab, layers, hidden = values[:4]
    if not (4 <= vocab <= len(ALPHABET) + 2 and 1 <= layers <= 8 and 8 <= hidden <= 512 and hidden % 4 == 0):
        raise ModelError(f"tiny model '{ref}' out of range (vocab 4..{len(ALPHABET) + 2}, layers 1..8, hidden 8..512)")
    if not 0.0 <= noise <= 10.0:
        raise ModelError(f"tiny model '{ref}': noise must be in [0, 10]")
    return seed, vocab, layers, hidden, noise


def load_tiny(ref: str, dtype: str = "float32", device: str = "cpu", logit_scale: float = 1.0) -> LoadedModel:
    """A random Qwen2-architecture model; same seed → same weights, so pairs can share layers."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    seed, vocab, layers, hidden, noise = parse_tiny_ref(ref)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT,
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
        if noise > 0:
            noise_gen = torch.Generator().manual_seed(seed + 7919)
            for param in model.parameters():
                scale = param.abs().mean() * noise
                param.add_(torch.randn(param.shape, generator=noise_gen) * scale)
    model.to(device=device, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = 1
    loaded = LoadedModel(ref=ref, model=model, tokenizer=tiny_tokenizer(vocab), device=device, dtype=dtype)
    warm_up(loaded)  # the baseline runs first: without this it would carry the first-call overheads
    return loaded
