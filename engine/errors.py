"""The engine's user-facing errors, each a SpectuneError: shown as one clear line, never a traceback."""

from foundation.errors import SpectuneError

__all__ = ["ModelError", "PromptFileError", "SettingsError", "SpectuneError"]


class ModelError(SpectuneError):
    """A model reference that cannot be resolved, verified or loaded."""


class PromptFileError(SpectuneError):
    """A prompt file that cannot be read at all."""


class SettingsError(SpectuneError):
    """Session settings out of range (γ, temperature, max new tokens, empty prompt set)."""
