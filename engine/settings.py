"""Session settings and their validation: refused with one clear message, in the UI and the CLI alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.errors import SettingsError

MAX_GAMMA = 64
NGRAM_DEFAULT = (1, 3)  # (min, max) n-gram length for "ngram" without a window


def parse_ngram_spec(ref: str) -> tuple[int, int]:
    """(min, max) n-gram window from "ngram" or "ngram:MIN-MAX"; SettingsError when malformed."""
    if ref == "ngram":
        return NGRAM_DEFAULT
    try:
        lo, hi = (int(x) for x in ref.split(":", 1)[1].split("-"))
    except (IndexError, ValueError) as exc:
        raise SettingsError(f"bad n-gram spec '{ref}'; use ngram or ngram:MIN-MAX, e.g. ngram:1-3") from exc
    if not 1 <= lo <= hi <= 16:
        raise SettingsError(f"n-gram window '{ref}': need 1 <= MIN <= MAX <= 16")
    return lo, hi
MAX_TEMPERATURE = 10.0


@dataclass
class SweepSettings:
    """Everything a session needs: drafts × γ × temperatures, plus the autoregressive baseline."""

    target: str
    drafts: list[str]
    gammas: list[int]
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    max_new_tokens: int = 64
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "bfloat16"
    device: str = "auto"
    chat_template: bool = True
    measure_verify_cost: bool = True
    trust_remote_code: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def validate(s: SweepSettings, n_prompts: int | None = None) -> SweepSettings:
    """Raise SettingsError naming the first bad field; return the settings when all is well."""
    if not s.target or not s.target.strip():
        raise SettingsError("no target model given")
    if not s.drafts:
        raise SettingsError("no draft given: name a draft model, 'ngram', or 'none' for the target alone")
    if not s.gammas:
        raise SettingsError("no γ given")
    for g in s.gammas:
        if not isinstance(g, int) or isinstance(g, bool):
            raise SettingsError(f"γ must be a whole number, got {g!r}")
        if g < 1:
            raise SettingsError(f"γ = {g} is out of range: the draft must propose at least 1 token")
        if g > MAX_GAMMA:
            raise SettingsError(f"γ = {g} is out of range: at most {MAX_GAMMA} draft tokens per step")
    for t in s.temperatures:
        if t < 0:
            raise SettingsError(f"temperature {t} is negative; use 0 for greedy decoding")
        if t > MAX_TEMPERATURE:
            raise SettingsError(f"temperature {t} is above {MAX_TEMPERATURE}")
    if s.max_new_tokens < 1:
        raise SettingsError(f"max new tokens = {s.max_new_tokens}: must be at least 1")
    if s.top_k < 0:
        raise SettingsError(f"top-k = {s.top_k}: must be 0 (off) or positive")
    if not 0 < s.top_p <= 1:
        raise SettingsError(f"top-p = {s.top_p}: must be in (0, 1]")
    if s.dtype not in ("float32", "bfloat16", "float16"):
        raise SettingsError(f"dtype '{s.dtype}': choose float32, bfloat16 or float16")
    if n_prompts is not None and n_prompts < 1:
        raise SettingsError("the prompt set is empty: upload or choose prompts first")
    return s


def check_context(prompt_tokens: int, max_new_tokens: int, max_context: int, prompt_label: str) -> None:
    """A prompt plus its new tokens must fit the model context."""
    if max_new_tokens >= max_context:
        raise SettingsError(f"max new tokens = {max_new_tokens} is beyond the model context of {max_context} tokens")
    if prompt_tokens + max_new_tokens > max_context:
        raise SettingsError(
            f"{prompt_label}: {prompt_tokens} prompt tokens + {max_new_tokens} new tokens exceed the model "
            f"context of {max_context} tokens"
        )
