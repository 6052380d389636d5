"""An engine's own options: the base of the one typed record a session spec holds for its engine."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar, Self


class EngineOptions:
    """The base of an engine's options, a dataclass in that engine's package (engine.engines.<name>.options).

    A session spec holds one record of its engine's type as `engine_options` (None where the engine has none). The
    record is built from plain values (a stored session's, engine.session.spec.read_engine_options), from the command
    line and from the Run form, and checks itself against the spec it belongs to."""

    stored_as: ClassVar[str] = ""  # the options key an older stored row kept these under ("" where none)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | Self | None) -> Self:
        """From plain values (unknown keys ignored; none given: the defaults)."""
        if isinstance(data, cls):
            return data
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in (data or {}).items() if k in names})

    @classmethod
    def of(cls, spec: Any) -> Self:
        """The options of session spec `spec`, as this type (the defaults where it holds none)."""
        return cls.from_dict(spec.engine_options)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Its command-line flags on `run` and `submit` (none by default)."""

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """From the CLI's parsed arguments or the Run form's values, by their names (its own flags' dests)."""
        return cls()

    def checked(self, spec: Any) -> Self:
        """Itself, checked against the spec it belongs to: SettingsError naming the first bad value."""
        return self
