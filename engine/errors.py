"""The engine's user-facing errors, each a SpectuneError: shown as one clear line, never a traceback."""

from foundation.errors import SpectuneError

__all__ = ["ModelError", "PromptFileError", "SettingsError", "SpectuneError"]


class ModelError(SpectuneError):
    """A model reference that cannot be resolved, verified or loaded."""


class PromptFileError(SpectuneError):
    """A prompt file that cannot be read at all.

    ``reason`` is the message without its issue detail; ``issues`` lists the bad lines found (as "line 3: …"),
    ``issue_count`` how many there were in all (more than listed when the parser stopped listing). The message
    itself names the count and the first issue, for a one-line command-line error.
    """

    def __init__(self, reason: str, issues: tuple[str, ...] = (), issue_count: int = 0) -> None:
        self.reason = reason
        self.issues = tuple(issues)
        self.issue_count = max(issue_count, len(self.issues))
        detail = ""
        if self.issue_count:
            noun = "issue" if self.issue_count == 1 else "issues"
            detail = f" ({self.issue_count:,} {noun}; first: {self.issues[0][:200] if self.issues else '?'})"
        super().__init__(reason + detail)


class SettingsError(SpectuneError):
    """Session settings out of range (γ, temperature, max new tokens, empty prompt set)."""
