"""What an export format is: one record, declared by the format's own module (the versions: versions.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.drafts.kinds import MODEL, NGRAM, NONE, SUFFIX

if TYPE_CHECKING:
    from engine.analysis.export.deployment import Deployment
    from engine.analysis.export.files import FlagsFile, JsonFile


BUILT_IN_DRAFTS = frozenset(kind.method for kind in (NONE, NGRAM, SUFFIX, MODEL))  # what every engine's file runs


@dataclass(frozen=True)
class ExportFormat:
    """One export format: what the CLI, the pages and the report need to offer it, and how it is made."""

    name: str  # the CLI's --export choice and the key a stored export is kept under
    label: str  # what a page calls it
    filename: str
    language: str  # how a page highlights its text: "json" or "bash"
    mime: str
    policy_support: str  # which speculation policies its engine can express
    config: Callable[[Deployment], JsonFile | FlagsFile]  # the file its engine runs a deployment from
    # the draft kinds (engine.drafts.kinds methods) its engine runs, as themselves or as its closest method (None:
    # every kind); a deployment of another kind is exported as speculation off, saying why
    draft_methods: frozenset[str] | None = None

    def runs_draft(self, method: str) -> bool:
        """Whether its engine runs drafts of kind `method`."""
        return self.draft_methods is None or method in self.draft_methods
