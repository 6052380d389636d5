"""The A/A check's prompts: how many, which, and the order each prompt's decodes run in."""

from __future__ import annotations

from collections import Counter

from engine.session.aa_check import aa_count, aa_prompts, decode_orders, sweep_decodes
from engine.session.runner import RunKey

BASE, NGRAM, DRAFT = RunKey("none", 0, 0.0), RunKey("ngram", 3, 0.0), RunKey("draft", 4, 0.0)


def test_the_check_covers_whole_rotations_of_at_least_three_prompts_and_at_most_the_set() -> None:
    assert aa_count(2, 2) == 2  # a set smaller than one rotation: every prompt
    assert aa_count(12, 2) == 3  # one rotation of (baseline, n-gram, twin)
    assert aa_count(8, 4) == 5  # 10% of 32 decodes is 4: still one rotation of five
    assert aa_count(40, 4) == 15  # 10% of 160 is 16, rounded down to three rotations
    assert aa_count(200, 9) == 180  # 10% of 1800: eighteen rotations of ten
    assert aa_count(1, 1) == 1


def test_the_prompts_are_taken_from_each_category_in_turn_and_spread_through_it() -> None:
    categories = ["code"] * 6 + ["prose"] * 2 + ["maths"] * 4
    picked = aa_prompts(categories, 7)  # 9 wanted: one rotation of eight
    assert len(picked) == aa_count(12, 7) == 8
    assert Counter(categories[i] for i in picked) == {"code": 3, "prose": 2, "maths": 3}
    assert [i for i in picked if categories[i] == "code"] == [1, 3, 5]  # spread, not the first three
    assert aa_prompts(["x"] * 3, 5) == [0, 1, 2]


def test_every_slot_comes_first_equally_often_over_the_checked_prompts_and_the_rest() -> None:
    plan = [BASE, NGRAM, DRAFT]
    checked = aa_prompts([None] * 30, len(plan))  # 9 wanted: two rotations of four
    assert len(checked) == 8
    orders = decode_orders(plan, 30, checked)
    assert [None in order for order in orders] == [i in checked for i in range(30)]
    assert all(sorted(map(str, o)) == sorted(map(str, [*plan, *([None] if i in checked else [])]))
               for i, o in enumerate(orders))  # fmt: skip
    firsts_checked = Counter(orders[i][0] for i in checked)
    assert firsts_checked == {BASE: 2, NGRAM: 2, DRAFT: 2, None: 2}
    firsts_rest = Counter(orders[i][0] for i in range(30) if i not in checked)
    assert max(firsts_rest.values()) - min(firsts_rest.values()) <= 1 and set(firsts_rest) <= set(plan)


def test_a_sweep_counts_its_configurations_and_its_check() -> None:
    assert sweep_decodes([BASE, NGRAM], 8) == 16 + 3
    assert sweep_decodes([BASE, NGRAM], 8, aa_check=False) == 16  # a confirmation: its session's floor judges it
    assert sweep_decodes([NGRAM], 8) == 8  # no baseline: no A/A check
