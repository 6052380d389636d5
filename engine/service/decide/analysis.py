"""What a decision is made from: the recommendation, its evidence, the regime report and the policy report.

The analysis of a query over some sessions is made once, beside its decision (engine.service.decide.decisions), and
stored with it, so a page that shows its tables (the crossover, the draft comparison, the γ schedule, the policy
grid) reads the figures the decision was made from instead of predicting again. It is stored as typed JSON
(engine.core.typed_json); one that no longer reads as today's records is made again.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.analysis.recommend import Recommendation
from engine.analysis.regime import RegimeReport
from engine.core import typed_json
from engine.service.decide.evidence import Evidence, recommend_from_store
from engine.service.decide.policies import PolicyReport, session_policies

T = TypeVar("T")


@dataclass
class Analysis:
    """The recommendation, evidence and regime report of one query (recommend_from_store), and its policy report
    (session_policies) built on them."""

    recommendation: Recommendation
    evidence: Evidence
    regime: RegimeReport
    policies: PolicyReport

    @property
    def triple(self) -> tuple[Recommendation, Evidence, RegimeReport]:
        """(recommendation, evidence, regime report), as recommend_from_store gives them."""
        return self.recommendation, self.evidence, self.regime

    def to_dict(self) -> dict[str, Any]:
        """The analysis as JSON-ready data (typed_json.dump)."""
        return {name: typed_json.dump(getattr(self, name)) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Analysis:
        """The analysis stored by to_dict, with the records that are one object in a made analysis (the
        recommendation's measurement is one of the evidence's; the best policies are rows of their grid) made one
        again. TypeError or KeyError when the data is not an analysis of today's records."""
        hints = typing.get_type_hints(cls)
        made = cls(**{name: typed_json.load(hints[name], data[name]) for name in cls.__dataclass_fields__})
        made._relink()
        return made

    def _relink(self) -> None:
        rec, ev, policies = self.recommendation, self.evidence, self.policies
        rec.measurement = _same(rec.measurement, ev.measurements)
        policies.recommendation = _same(policies.recommendation, [rec])
        for draft in policies.drafts:
            draft.measurement = _same(draft.measurement, ev.measurements)
            grid = draft.comparison
            grid.best, grid.best_fixed = _same(grid.best, grid.results), _same(grid.best_fixed, grid.results)
        policies.chosen = _same(policies.chosen, policies.drafts)


def _same(value: T, candidates: Iterable[T]) -> T:
    """The candidate equal to `value` (the one object a made analysis holds), else `value` itself."""
    if value is None:
        return value
    return next((c for c in candidates if c == value), value)


def analyse(
    store: Any,
    session_ids: Sequence[int],
    query: Any,
    in_progress: int | None = None,
    recommended: tuple[Recommendation, Evidence, RegimeReport] | None = None,
) -> Analysis:
    """The analysis of a query (engine.service.decide.decisions.DecisionQuery) over the sessions; `recommended`, the
    triple a caller already made for this query, is used as it is. SpectuneError when the sessions give nothing
    to recommend from."""
    ids = list(session_ids)
    triple = recommended or recommend_from_store(
        store,
        ids,
        query.objective,
        query.budget,
        query.batch_size,
        query.price_per_hour,
        query.regime_override,
        engine=query.engine,
        temperature=query.temperature,
        in_progress=in_progress,
    )
    temperature = triple[0].temperature if query.temperature is None else query.temperature  # the one it chose
    policies = session_policies(
        store,
        ids,
        query.objective,
        query.budget,
        query.batch_size,
        query.regime_override,
        engine=query.engine,
        temperature=temperature,
        recommended=triple,
        in_progress=in_progress,
    )
    return Analysis(*triple, policies)
