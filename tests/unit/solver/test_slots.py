"""Where a gang's next member goes (`solver.slots.next_slot`), per Ray strategy."""

from __future__ import annotations

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy as S
from chronotope.solver.slots import next_slot

FREE = [("a", 2), ("b", 4), ("c", 8), ("d", 8)]


def test_pack_best_fits_the_node_that_holds_the_rest_of_the_gang() -> None:
    assert next_slot(FREE, set(), S.PACK, rest=4) == "b"
    assert next_slot(FREE, set(), S.PACK, rest=2) == "a"
    assert next_slot(FREE, set(), S.PACK, rest=6) == "d"  # ties: the larger name


def test_pack_stays_on_a_node_it_uses_before_anything_fits_better() -> None:
    assert next_slot(FREE, {"c"}, S.PACK, rest=2) == "c"


def test_pack_takes_the_most_free_node_when_none_holds_the_rest() -> None:
    assert next_slot(FREE, set(), S.PACK, rest=32) == "d"


def test_strict_pack_never_leaves_the_first_node() -> None:
    assert next_slot([("a", 2), ("b", 4)], {"c"}, S.STRICT_PACK, rest=2) is None
    assert next_slot([("a", 2), ("c", 4)], {"c"}, S.STRICT_PACK, rest=2) == "c"


def test_spread_prefers_new_nodes_with_the_most_free() -> None:
    assert next_slot(FREE, {"d"}, S.SPREAD, rest=1) == "c"
    assert next_slot([("d", 8)], {"d"}, S.SPREAD, rest=1) == "d"
    assert next_slot([("d", 8)], {"d"}, S.STRICT_SPREAD, rest=1) is None


def test_the_answer_does_not_depend_on_input_order() -> None:
    for strategy in S:
        for rest in (1, 4, 6, 40):
            assert next_slot(FREE, set(), strategy, rest) == next_slot(
                FREE[::-1], set(), strategy, rest
            )
