"""Where a gang's next member goes (`solver.slots.next_slot`), per Ray strategy."""

from __future__ import annotations

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy as S
from chronotope.solver.slots import next_slot

FREE = [("a", 2), ("b", 4), ("c", 8), ("d", 8)]


def test_pack_best_fits_the_node_that_holds_the_rest_of_the_gang() -> None:
    assert next_slot(FREE, {}, S.PACK, rest=4) == "b"
    assert next_slot(FREE, {}, S.PACK, rest=2) == "a"
    assert next_slot(FREE, {}, S.PACK, rest=6) == "d"  # ties: the larger name


def test_pack_stays_on_a_node_it_uses_before_anything_fits_better() -> None:
    assert next_slot(FREE, {"c": 1}, S.PACK, rest=2) == "c"


def test_pack_takes_the_most_free_node_when_none_holds_the_rest() -> None:
    assert next_slot(FREE, {}, S.PACK, rest=32) == "d"


def test_strict_pack_never_leaves_the_first_node() -> None:
    assert next_slot([("a", 2), ("b", 4)], {"c": 1}, S.STRICT_PACK, rest=2) is None
    assert next_slot([("a", 2), ("c", 4)], {"c": 1}, S.STRICT_PACK, rest=2) == "c"


def test_spread_prefers_new_nodes_with_the_most_free() -> None:
    assert next_slot(FREE, {"d": 1}, S.SPREAD, rest=1) == "c"
    assert next_slot([("d", 8)], {"d": 1}, S.SPREAD, rest=1) == "d"
    assert next_slot([("d", 8)], {"d": 1}, S.STRICT_SPREAD, rest=1) is None


def test_spread_goes_to_the_node_with_the_fewest_members_as_evenly_as_possible() -> None:
    # Ray's SPREAD: once every node holds one, the next goes where the fewest are, not
    # to the most free node again (d has the most free GPUs but two members already)
    used = {"a": 1, "b": 1, "c": 1, "d": 2}
    assert next_slot(FREE, used, S.SPREAD, rest=1) == "c"
    assert next_slot(FREE, used | {"c": 2}, S.SPREAD, rest=1) == "b"
    # a node it names with 0 members is a new one (a spread placed in levels names every
    # node it counts, `capacity.take`)
    assert next_slot(FREE, {"a": 0, "b": 0, "c": 0, "d": 1}, S.SPREAD, rest=1) == "c"
    assert next_slot(FREE, {"c": 0}, S.STRICT_SPREAD, rest=1) == "d"


def test_the_answer_does_not_depend_on_input_order() -> None:
    for strategy in S:
        for rest in (1, 4, 6, 40):
            assert next_slot(FREE, {}, strategy, rest) == next_slot(FREE[::-1], {}, strategy, rest)
