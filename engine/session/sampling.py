"""Which prompts of a set a session decodes: the first n in file order, or a sample stratified by category.

"3 prompts" of a mixed set taken in file order may leave whole categories out (a file sorted by category
gives three coding prompts and no prose). A stratified sample gives every category at least one prompt
when n allows it, shares the rest in proportion to each category's size (largest remainder), and takes
each category's prompts in file order. The chosen prompts keep their file order, and the choice is
deterministic: the same set and n always give the same prompts, so sessions stay comparable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

SAMPLES = ("first", "stratified")
NO_CATEGORY = "(no category)"

T = TypeVar("T")


def has_categories(categories: Sequence[str | None]) -> bool:
    """True when the set names at least two categories (stratifying one category is the first n)."""
    return len({c for c in categories if c}) >= 2


def sample_indices(categories: Sequence[str | None], n: int | None, how: str = "first") -> list[int]:
    """Indices (ascending) of the prompts to decode: ``n`` of them (all when None or larger than the set)."""
    if how not in SAMPLES:
        raise ValueError(f"prompt sample '{how}': choose one of {', '.join(SAMPLES)}")
    total = len(categories)
    n = total if n is None else max(0, min(int(n), total))
    if how == "first" or n == total:
        return list(range(n))
    groups: dict[str, list[int]] = {}
    for index, category in enumerate(categories):
        groups.setdefault(category or NO_CATEGORY, []).append(index)
    share = _allocate({name: len(members) for name, members in groups.items()}, n)
    return sorted(i for name, members in groups.items() for i in members[: share[name]])


def _allocate(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """How many prompts each category gets: one each first (the largest categories when n is smaller than
    their number; ties in order of first appearance), then the rest in proportion, by largest remainder."""
    order = list(sizes)  # dicts keep the order of first appearance
    if n < len(order):
        chosen = sorted(order, key=lambda name: (-sizes[name], order.index(name)))[:n]
        return {name: int(name in chosen) for name in order}
    share = {name: 1 for name in order}
    left = n - len(order)
    room = {name: sizes[name] - 1 for name in order}
    while left > 0:
        spare = sum(room.values())
        if spare <= 0:
            break
        quotas = {name: left * room[name] / spare for name in order}
        whole = {name: min(room[name], int(quotas[name])) for name in order}
        if not sum(whole.values()):  # fewer left than categories with room: the largest remainders win
            ranked = sorted((name for name in order if room[name] > 0), key=lambda m: (-quotas[m], order.index(m)))
            whole = {name: int(name in ranked[:left]) for name in order}
        for name in order:
            share[name] += whole[name]
            room[name] -= whole[name]
        left -= sum(whole.values())
    return share


def choose(items: Sequence[T], n: int | None, how: str = "first", category: Any = None) -> list[T]:
    """The items to decode (prompt dicts or objects): ``category(item)`` names an item's category
    (default: the "category" key of a mapping, else the attribute)."""
    read = category or _category_of
    return [items[i] for i in sample_indices([read(item) for item in items], n, how)]


def _category_of(item: Any) -> str | None:
    if isinstance(item, Mapping):
        return item.get("category")
    return getattr(item, "category", None)


def session_prompts(get_prompts: Any, session: Mapping[str, Any], how: str | None = None) -> list[Any]:
    """The prompts a stored session decodes: ``get_prompts(set_id, limit=None)`` is the store's reader;
    ``how`` defaults to the session's own choice (its options' prompt_sample, else "first")."""
    set_id = session.get("prompt_set_id")
    if not set_id:
        return []
    how = how or (session.get("options") or {}).get("prompt_sample") or "first"
    n = session.get("n_prompts")
    if how == "first":
        return list(get_prompts(set_id, limit=n))
    return choose(list(get_prompts(set_id)), n, how)
