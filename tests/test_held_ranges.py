"""Seq ranges held by consumer groups: lookups, removal of a part, and the count."""

from __future__ import annotations

from pzq.held_ranges import HeldRanges


def test_a_seq_is_held_by_the_range_that_contains_it_and_by_no_other():
    held = HeldRanges()
    held.add(10, 20, "a")
    held.add(30, 31, "b")
    assert [held.holder_of(s) for s in (9, 10, 19, 20, 29, 30, 31)] == [None, "a", "a", None, None, "b", None]
    assert held.count == 11 and len(held) == 2


def test_removing_a_prefix_keeps_the_rest_of_the_range_with_its_holder():
    held = HeldRanges()
    held.add(0, 100, "g")
    assert held.remove(0, 40, "g") == 40
    assert held.span_of(39) is None and held.span_of(40) == (40, 100, "g")
    assert held.count == 60


def test_removing_the_middle_splits_the_range_in_two():
    held = HeldRanges()
    held.add(0, 10, "g")
    held.remove(3, 5, "g")
    assert held.of_holder("g") == [(0, 3), (5, 10)]
    assert held.count == 8


def test_next_start_finds_the_first_range_at_or_after_a_seq():
    held = HeldRanges()
    held.add(5, 8, "a")
    held.add(50, 60, "b")
    assert [held.next_start(s) for s in (0, 5, 6, 50, 51)] == [5, 5, 50, 50, None]


def test_removing_what_is_not_held_changes_nothing():
    held = HeldRanges()
    held.add(5, 8, "a")
    assert (
        held.remove(0, 3, "a") == 0
        and held.remove(6, 7, "b") == 0
        and held.of_holder("a") == [(5, 8)]
        and held.count == 3
    )


def test_adjacent_ranges_of_one_holder_are_one_entry_and_of_two_holders_stay_two():
    held = HeldRanges()
    held.add(0, 10, "g")
    held.add(20, 30, "g")
    held.add(10, 20, "g")
    held.add(30, 40, "h")
    assert len(held) == 2 and held.of_holder("g") == [(0, 30)] and held.count == 40
