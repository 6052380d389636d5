"""User-facing errors: anything raised as SpectuneError is shown as one clear line, never a traceback."""


class SpectuneError(Exception):
    """A problem the user can fix (bad argument, missing file, unknown model)."""


class ModelError(SpectuneError):
    """A model reference that cannot be resolved, verified or loaded."""


class PromptFileError(SpectuneError):
    """A prompt file that cannot be read at all."""


class SettingsError(SpectuneError):
    """Session settings out of range (γ, temperature, max new tokens, empty prompt set)."""
