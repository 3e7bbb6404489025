"""`pipeline.grow_within`: a serving pipeline grows as far as its queue's quota admits."""

from __future__ import annotations

from collections.abc import Sequence

from chronotope.workloads.pipeline import grow_within


def test_the_whole_target_when_it_fits() -> None:
    assert grow_within([1, 1], [3, 2], lambda r: True) == [3, 2]


def test_growth_goes_to_the_stage_furthest_below_its_target_first() -> None:
    # room for 2 more replicas: stage 0 is at 1/4 of its target, stage 1 at 1/2
    assert grow_within([1, 1], [4, 2], lambda r: sum(r) <= 4) == [3, 1]


def test_a_stage_whose_next_replica_does_not_fit_stops_and_the_others_go_on() -> None:
    # stage 0 runs on a type with no room left; stage 1's type has room for one more
    def fits(r: Sequence[int]) -> bool:
        return r[0] <= 2 and r[1] <= 2

    assert grow_within([2, 1], [5, 3], fits) == [2, 2]


def test_shrinking_stages_shrink_at_once_and_free_room_for_the_growing_ones() -> None:
    assert grow_within([4, 1], [2, 3], lambda r: sum(r) <= 5) == [2, 3]


def test_none_when_not_even_what_runs_fits() -> None:
    assert grow_within([2, 2], [3, 3], lambda r: sum(r) <= 3) is None
