"""Dataclasses to JSON and back, by their type hints: what is stored is read back as the same typed record.

`dump` turns a dataclass (nested dataclasses, lists, tuples, dicts with int or str keys, None, numbers, strings)
into JSON-ready values; `load(cls, data)` rebuilds it from the annotations of `cls`, so a `dict[int, float]` comes
back with int keys and a `tuple[float, float]` as a tuple. A field a stored record lacks takes its default; a field
the record has but the class no longer declares is dropped. A value that cannot be read as its type raises
TypeError, so a caller can treat the stored record as absent.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


def dump(value: Any) -> Any:
    """The value as JSON-ready data: dataclasses as objects of their init fields, dict keys as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {str(k): dump(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def load(cls: type[T], data: Any) -> T:
    """The dataclass `cls` rebuilt from `dump`'s output. TypeError when the data does not fit its annotations."""
    return _read(cls, data)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(tp: Any, data: Any) -> Any:
    if tp is Any or tp is object:
        return data
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _read_union(args, data)
    if dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, data)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _read_dict(args, data)
    if origin in (list, Sequence) or tp in (list, Sequence):
        return [_read(args[0] if args else Any, v) for v in _sequence(data)]
    if origin is tuple or tp is tuple:
        return _read_tuple(args, data)
    return _read_scalar(tp, data)


def _read_union(args: tuple[Any, ...], data: Any) -> Any:
    if data is None and type(None) in args:
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return _read(arg, data)
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    raise TypeError("; ".join(errors) or f"{data!r} fits none of {args}")


def _read_dataclass(cls: type, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    hints = _hints(cls)
    given = {f.name: _read(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in data}
    return cls(**given)


def _read_dict(args: tuple[Any, ...], data: Any) -> dict[Any, Any]:
    if not isinstance(data, Mapping):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    key_type, value_type = args if args else (Any, Any)
    return {_read_scalar(key_type, k) if key_type in (int, float) else k: _read(value_type, v) for k, v in data.items()}


def _read_tuple(args: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    items = _sequence(data)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_read(args[0], v) for v in items)
    if args and len(args) != len(items):
        raise TypeError(f"expected {len(args)} items, got {len(items)}")
    return tuple(_read(a, v) for a, v in zip(args or [Any] * len(items), items, strict=True))


def _sequence(data: Any) -> list[Any]:
    if not isinstance(data, list | tuple):
        raise TypeError(f"expected a list, got {type(data).__name__}")
    return list(data)


def _read_scalar(tp: Any, data: Any) -> Any:
    if tp is float and isinstance(data, int | float | str) and not isinstance(data, bool):
        return float(data)
    if tp is int and isinstance(data, int | str) and not isinstance(data, bool):
        return int(data)
    if tp in (str, bool) and isinstance(data, tp):
        return data
    if typing.get_origin(tp) is typing.Literal and data in typing.get_args(tp):
        return data
    raise TypeError(f"expected {getattr(tp, '__name__', tp)}, got {data!r}")
