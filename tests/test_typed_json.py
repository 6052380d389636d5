"""Typed records to JSON and back: what the store keeps reads back as the same record, or not at all."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from engine.core import typed_json


@dataclass(frozen=True)
class Inner:
    per_step: float = 0.0
    label: str = ""


@dataclass
class Outer:
    name: str
    by_gamma: dict[int, float]
    band: dict[int, tuple[float, float]]
    inner: Inner
    maybe: Inner | None = None
    rows: list[list[int]] = field(default_factory=list)
    flag: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def test_a_record_reads_back_equal_with_its_key_and_tuple_types() -> None:
    made = Outer("a", {1: 1.5, 12: 2.0}, {3: (0.9, 1.1)}, Inner(0.25, "x"), None, [[1, 2], [3]], "f", {"k": [1]})
    back = typed_json.load(Outer, json.loads(json.dumps(typed_json.dump(made))))
    assert back == made
    assert list(back.by_gamma) == [1, 12] and isinstance(back.band[3], tuple)


def test_a_missing_field_takes_its_default_and_an_unknown_one_is_dropped() -> None:
    data = {"name": "b", "by_gamma": {}, "band": {}, "inner": {"per_step": 1}, "gone": 3}
    back = typed_json.load(Outer, data)
    assert back == Outer("b", {}, {}, Inner(1.0, ""))


@pytest.mark.parametrize("bad", [{"name": "c", "by_gamma": {"x": 1.0}, "band": {}, "inner": {}},
                                 {"name": "c", "by_gamma": {}, "band": {"1": [1.0]}, "inner": {}},
                                 {"name": 4, "by_gamma": {}, "band": {}, "inner": {}},
                                 {"name": "c", "by_gamma": {}, "band": {}}])  # fmt: skip
def test_data_that_does_not_fit_raises(bad: dict) -> None:
    with pytest.raises((TypeError, ValueError)):
        typed_json.load(Outer, bad)


def test_an_object_it_cannot_store_raises() -> None:
    with pytest.raises(TypeError):
        typed_json.dump({"f": object()})
