"""A stored session as a reader sees it: the store's row, its summary and options read once into typed fields.

The store keeps a session as a row with two JSON columns, `options` (what the user asked for) and `summary` (what
the worker measured). A page or report takes the figures it shows from StoredSession's attributes instead of
reading those columns itself, so each stored key is read in one place, with one default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.engines import registry
from engine.session.spec import session_engine, stored_engine_options


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list | tuple) else []


@dataclass(frozen=True)
class MeasuredEndpoint:
    """One endpoint an endpoint session measured, as its report keeps it."""

    label: str
    url: str
    model: str | None = None
    api: str | None = None
    engine: str | None = None  # the serving engine it detected, where it could tell
    server_version: str | None = None
    warnings: tuple[str, ...] = ()
    levels: tuple[Mapping[str, Any], ...] = ()  # one entry per concurrency level (engine.engines.endpoint.report)

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> MeasuredEndpoint:
        """The record of one entry of a report's `endpoints`."""
        return cls(
            str(entry.get("label") or ""),
            str(entry.get("url") or ""),
            entry.get("model"),
            entry.get("api"),
            entry.get("engine"),
            entry.get("server_version"),
            tuple(str(w) for w in entry.get("warnings") or ()),
            tuple(_mappings(entry.get("levels"))),
        )


@dataclass(frozen=True)
class StoredSession:
    """One stored session: its row (`row`), and what its options and summary say, read once."""

    row: Mapping[str, Any]
    summary: Mapping[str, Any] = field(default_factory=dict)  # what the worker measured ({} before it ran)
    options: Mapping[str, Any] = field(default_factory=dict)  # what the user asked for beyond the row's columns

    @classmethod
    def of(cls, row: Mapping[str, Any] | StoredSession) -> StoredSession:
        """The record of a store row (a StoredSession is returned as it is)."""
        if isinstance(row, StoredSession):
            return row
        return cls(row, _mapping(row.get("summary")), _mapping(row.get("options")))

    @property
    def engine(self) -> str:
        """The engine it measured with (spectune's loop for a row from before engines)."""
        return session_engine(self.row)

    @property
    def policies(self) -> list[str]:
        """The speculation policies it was asked to run beside its fixed γ."""
        return [str(p) for p in self.options.get("policies") or []]

    @property
    def serving_batch(self) -> int:
        """The batch size it was asked to recommend for (1 unless set)."""
        return int(self.options.get("serving_batch") or 1)

    @property
    def weights(self) -> tuple[str, str]:
        """(what the weights are called, what they were): the weights its engine always runs whatever the dtype
        asked (a GGUF's quantisation), else its dtype ("—" unset)."""
        entry = registry.find(self.engine)
        fixed = entry.fixed_weights if entry is not None else None
        return ("weights", fixed) if fixed else ("dtype", str(self.row.get("dtype") or "—"))

    @property
    def engine_options(self) -> dict[str, Any]:
        """Its engine's own options as submitted, plain ({} where it has none; an endpoint's URLs and caps)."""
        return dict(stored_engine_options(self.engine, self.options))

    @property
    def endpoint_report(self) -> Mapping[str, Any]:
        """An endpoint session's measured report ({} before it ran, or for another engine)."""
        return _mapping(self.summary.get("endpoint"))

    @property
    def measured_endpoints(self) -> list[MeasuredEndpoint]:
        """The endpoints its report measured, in the order measured ([] before it ran, or for another engine)."""
        return [MeasuredEndpoint.of(entry) for entry in _mappings(self.endpoint_report.get("endpoints"))]

    @property
    def endpoint_comparison(self) -> Mapping[str, Any] | None:
        """Its report's speculative-against-baseline comparison, where both were measured."""
        comparison = self.endpoint_report.get("comparison")
        return comparison if isinstance(comparison, Mapping) and comparison else None

    @property
    def hardware(self) -> Mapping[str, Any]:
        """The machine it ran on, as the worker described it ({} before it ran)."""
        return _mapping(self.summary.get("hardware"))

    @property
    def machine_note(self) -> str | None:
        """The warning stored when it was measured on a busy machine, else None."""
        note = self.summary.get("machine_note")
        return str(note) if note else None

    @property
    def noisy_runs(self) -> list[str]:
        """The runs whose speedups were too noisy to calibrate to."""
        return [str(r) for r in self.summary.get("noisy_runs") or []]

    @property
    def suffix_cache(self) -> Mapping[str, Any]:
        """The order its prompts ran in and how warm each suffix run's cache was ({} without suffix runs)."""
        return _mapping(self.summary.get("suffix_cache"))

    @property
    def quick(self) -> Mapping[str, Any]:
        """What a quick session's probe chose to confirm ({} for a full grid)."""
        return _mapping(self.summary.get("quick"))

    @property
    def confirmation(self) -> Mapping[str, Any]:
        """What a full grid's confirmation of its recommended configuration ran ({} where none ran)."""
        return _mapping(self.summary.get("confirmation"))

    @property
    def runs(self) -> list[Mapping[str, Any]]:
        """The runs its summary lists, in the order they ran."""
        return _mappings(self.summary.get("runs"))

    @property
    def phase_times_s(self) -> Mapping[str, float]:
        """Seconds each phase took ({} before it ran)."""
        return _mapping(self.summary.get("phase_times_s"))

    @property
    def baseline_tokens_per_s(self) -> float | None:
        """The target alone's decode speed, tokens per second (None before it was measured)."""
        tps = self.summary.get("baseline_tokens_per_s")
        return float(tps) if tps else None
